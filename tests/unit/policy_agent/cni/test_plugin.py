"""The `npaudit cni` plugin and its CNI protocol against a CniServer with a fake handler (framing: test_rpc.py)."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_agent import rpc
from policy_agent.cni import wire
from policy_agent.cni.server import CniServer, CniServerError
from policy_agent.cni.wire import CniError, CniRequest
from tests.support.accepting import AcceptThread
from tests.support.cni_plugin import json_values
from tests.support.cni_plugin import RESULT, Agent, FakeHandler, LoopThread, _exchange
from tests.support.cni_plugin import agent, env, invoke, netconf, tmp  # noqa: F401 (fixtures)

# ---- the plugin ----

def test_version_answers_locally() -> None:
    code, out = invoke({"CNI_COMMAND": "VERSION"}, {"cniVersion": "0.4.0"})
    assert code == 0
    assert json.loads(out) == {"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}


def test_add_forwards_env_args_netconf_and_prints_result(agent: Agent) -> None:
    conf = netconf(agent.path, dns={"nameservers": ["10.96.0.10"]})
    code, out = invoke(env("ADD"), conf)
    assert code == 0, out
    assert json.loads(out) == RESULT
    (req,) = agent.handler.requests
    assert (req.command, req.container_id, req.netns, req.ifname) == ("ADD", "c1", "/run/netns/pod1", "eth0")
    assert req.args == {"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "web-0"}
    assert req.netconf == conf
    assert agent.server.requests[("ADD", "ok")] == 1


def test_add_result_in_requested_version(agent: Agent) -> None:
    code, out = invoke(env("ADD"), netconf(agent.path, cniVersion="0.3.1"))
    assert code == 0 and json.loads(out)["cniVersion"] == "0.3.1"


def test_del_and_check_succeed_silently(agent: Agent) -> None:
    assert invoke(env("DEL", CNI_NETNS="<unset>"), netconf(agent.path)) == (0, "")
    assert invoke(env("CHECK"), netconf(agent.path)) == (0, "")
    assert [r.command for r in agent.handler.requests] == ["DEL", "CHECK"]
    assert agent.handler.requests[0].netns == ""


def test_del_of_unknown_container_succeeds(agent: Agent) -> None:
    assert invoke(env("DEL", CNI_CONTAINERID="gone"), netconf(agent.path)) == (0, "")
    # CHECK of an unknown container is a real error for the runtime.
    code, out = invoke(env("CHECK", CNI_CONTAINERID="gone"), netconf(agent.path))
    assert code == 1 and json.loads(out)["code"] == wire.ERR_UNKNOWN_CONTAINER


def test_handler_error_reaches_runtime_as_cni_error(agent: Agent) -> None:
    agent.handler.fail = CniError(wire.ERR_INTERNAL, "policy not realised", "compiler: boom")
    code, out = invoke(env("ADD"), netconf(agent.path, cniVersion="0.4.0"))
    assert code == 1
    assert json.loads(out) == {"cniVersion": "0.4.0", "code": 999, "msg": "policy not realised",
                               "details": "compiler: boom"}


def test_handler_crash_is_an_error_response_and_the_server_survives(agent: Agent) -> None:
    agent.handler.fail = RuntimeError("bug")
    code, out = invoke(env("ADD"), netconf(agent.path))
    err = json.loads(out)
    assert code == 1 and err["code"] == 999 and "RuntimeError: bug" in err["details"]
    agent.handler.fail = None
    assert invoke(env("ADD"), netconf(agent.path))[0] == 0


@pytest.mark.parametrize("environ, conf, code", [
    (env(CNI_COMMAND="<unset>"), None, 4),
    (env("FROB"), None, 4),
    (env(CNI_CONTAINERID="<unset>"), None, 4),
    (env(CNI_CONTAINERID="../etc/passwd"), None, 4),
    (env(CNI_NETNS="<unset>"), None, 4),
    (env("CHECK", CNI_NETNS=""), None, 4),
    (env(CNI_IFNAME="<unset>"), None, 4),
    (env(CNI_IFNAME="a-very-long-ifname"), None, 4),
    (env(CNI_IFNAME="eth/0"), None, 4),
    (env(CNI_ARGS="K8S_POD_NAME"), None, 4),
    (env(), b"{not json", 6),
    (env(), b"\xff\xfe", 6),
    (env(), b"[1, 2]", 6),
    (env(), {"name": "n", "type": "npaudit"}, 7),
    (env(), {"cniVersion": "0.2.0", "name": "n", "type": "npaudit"}, 1),
    (env("CHECK"), {"cniVersion": "0.3.1", "name": "n", "type": "npaudit"}, 1),
    (env(), {"cniVersion": "1.0.0", "type": "npaudit"}, 7),
    (env(), {"cniVersion": "1.0.0", "name": "bad name", "type": "npaudit"}, 7),
    (env(), {"cniVersion": "1.0.0", "name": "n"}, 7),
    (env(), {"cniVersion": "1.0.0", "name": "n", "type": "npaudit", "agentSocket": "rel/cni.sock"}, 7),
])
def test_invalid_invocations_give_spec_error_codes(environ: dict[str, str], conf: Any, code: int) -> None:
    rc, out = invoke(environ, conf if conf is not None else netconf("/nonexistent/cni.sock"))
    assert rc == 1
    err = json.loads(out)
    assert err["code"] == code, err
    assert set(err) <= {"cniVersion", "code", "msg", "details"} and err["msg"]
    assert err["cniVersion"] in wire.SUPPORTED_VERSIONS


def test_unreachable_agent_means_try_again_later(tmp: Path) -> None:
    code, out = invoke(env(), netconf(tmp / "missing.sock"))
    assert code == 1 and json.loads(out)["code"] == wire.ERR_TRY_AGAIN_LATER
    # A socket file nobody listens on (agent died) is unreachable too.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp / "stale.sock"))
    stale.close()
    code, out = invoke(env(), netconf(tmp / "stale.sock"))
    assert code == 1 and json.loads(out)["code"] == wire.ERR_TRY_AGAIN_LATER


def _raw_agent(path: Path, reply: bytes) -> AcceptThread:
    """A one-shot agent that reads a request and answers with `reply` bytes (close it when done)."""
    def serve(conn: socket.socket) -> None:
        with conn:
            rpc.recv_message(conn)
            conn.sendall(reply)
    return AcceptThread(serve, path=path, once=True)


@pytest.mark.parametrize("reply, code", [
    (b"", wire.ERR_IO),                                        # closed without answering
    (struct.pack(">I", 100) + b"{}", wire.ERR_IO),             # closed inside the frame
    (struct.pack(">I", 5) + b"hello", wire.ERR_DECODE),        # not JSON
    (struct.pack(">I", 1 << 30), wire.ERR_DECODE),             # oversize announcement
    (rpc.encode_frame({"ok": "yes"}), wire.ERR_INTERNAL),      # not our response shape
    (rpc.encode_frame({"ok": True, "result": None}), wire.ERR_INTERNAL),  # ADD without result
])
def test_broken_agent_answers_become_cni_errors(tmp: Path, reply: bytes, code: int) -> None:
    agent = _raw_agent(tmp / "raw.sock", reply)
    try:
        rc, out = invoke(env(), netconf(tmp / "raw.sock"))
    finally:
        agent.close()
    assert rc == 1 and json.loads(out)["code"] == code


def test_cli_cni_subcommand() -> None:
    proc = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "cni"], input=b"{}",
                          env={**os.environ, "CNI_COMMAND": "VERSION"}, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["supportedVersions"][-1] == "1.0.0"


# ---- the server's side of the wire ----

@pytest.mark.parametrize("data, code", [
    (struct.pack(">I", rpc.MAX_FRAME + 1), wire.ERR_DECODE),
    (struct.pack(">I", 7) + b"garbage", wire.ERR_DECODE),
    (rpc.encode_frame({"command": "ADD"}), wire.ERR_INVALID_ENV),
    (rpc.encode_frame({"command": "ADD", "container_id": "c1", "netns": "/x", "ifname": "eth0",
                       "args": {}, "netconf": {"cniVersion": "9.9.9", "name": "n", "type": "t"}}),
     wire.ERR_INCOMPATIBLE_VERSION),
])
def test_server_rejects_malformed_requests_and_keeps_serving(agent: Agent, data: bytes, code: int) -> None:
    reply = _exchange(agent.path, data)
    assert reply["ok"] is False and reply["code"] == code and reply["msg"]
    assert invoke(env("ADD"), netconf(agent.path))[0] == 0


def test_server_survives_clients_that_hang_up(agent: Agent) -> None:
    for data in (b"", b"\x00\x00", struct.pack(">I", 50) + b"{"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(agent.path))
            s.sendall(data)
    assert invoke(env("ADD"), netconf(agent.path))[0] == 0


def test_server_socket_permissions_and_lifecycle(agent: Agent, tmp: Path) -> None:
    assert stat.S_IMODE(agent.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(agent.path.parent.stat().st_mode) == 0o750
    # A second server on the same path must not steal a live socket.
    with pytest.raises(CniServerError, match="another process"):
        agent.lt.run(CniServer(agent.path, FakeHandler()).start())
    agent.lt.run(agent.server.close(grace=1.0))
    assert not agent.path.exists()


def test_server_replaces_stale_socket_but_not_other_files(tmp: Path) -> None:
    lt = LoopThread()
    try:
        stale = tmp / "stale.sock"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(stale))
        s.close()
        server = CniServer(stale, FakeHandler())
        lt.run(server.start())
        assert invoke(env("DEL"), netconf(stale)) == (0, "")
        lt.run(server.close())
        regular = tmp / "file"
        regular.write_text("keep me")
        with pytest.raises(CniServerError, match="not a socket"):
            lt.run(CniServer(regular, FakeHandler()).start())
        assert regular.read_text() == "keep me"
    finally:
        lt.stop()


# ---- requests, pure ----

@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=8))
def test_arbitrary_requests_raise_cni_error_only(obj: dict[str, Any]) -> None:
    try:
        CniRequest.from_wire(obj)
    except CniError:
        pass


def test_cni_args_parsing() -> None:
    assert wire.parse_cni_args("") == {}
    assert wire.parse_cni_args("A=1;;B=x=y;") == {"A": "1", "B": "x=y"}
    with pytest.raises(CniError) as exc:
        wire.parse_cni_args("A=1;B")
    assert exc.value.code == wire.ERR_INVALID_ENV
