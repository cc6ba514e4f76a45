"""policy_agent.rpc: length-prefixed JSON frames, pure and over sockets and asyncio streams."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_agent import rpc
from policy_agent.rpc import ConnectionClosed, FrameError
from tests.support.cni_plugin import json_values

REPO = Path(__file__).resolve().parents[3]

# ---- pure ----

@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_frame_round_trip(message: dict[str, Any]) -> None:
    assert rpc.decode_frame(rpc.encode_frame(message)) == message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_frames_raise_frame_error_only(data: bytes) -> None:
    try:
        rpc.decode_frame(data)
    except FrameError:
        pass


def test_oversize_frames_are_refused_both_ways() -> None:
    with pytest.raises(FrameError, match="exceeds"):
        rpc.encode_frame({"pad": "x" * rpc.MAX_FRAME})
    with pytest.raises(FrameError, match="exceeds"):
        rpc.frame_length(struct.pack(">I", rpc.MAX_FRAME + 1))
    assert rpc.frame_length(struct.pack(">I", rpc.MAX_FRAME)) == rpc.MAX_FRAME


def test_frames_carry_user_text_verbatim_without_breaking_the_frame() -> None:
    message = {"manifests": "name: \"a\nb\" \u2028 \x00 \U0001f600", "n": [1, None, True]}
    frame = rpc.encode_frame(message)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert rpc.decode_frame(frame) == message


# ---- over a blocking socket ----

def test_messages_cross_a_socket_in_order() -> None:
    a, b = socket.socketpair()
    with a, b:
        rpc.send_message(a, {"op": "apply", "i": 1})
        rpc.send_message(a, {"op": "delete", "i": 2})
        assert rpc.recv_message(b) == {"op": "apply", "i": 1}
        assert rpc.recv_message(b) == {"op": "delete", "i": 2}


@pytest.mark.parametrize("sent", [b"", b"\x00\x00", struct.pack(">I", 50) + b"{"])
def test_a_peer_closing_inside_a_frame_is_connection_closed(sent: bytes) -> None:
    a, b = socket.socketpair()
    with b:
        with a:
            a.sendall(sent)
        with pytest.raises(ConnectionClosed, match="closed inside a frame"):
            rpc.recv_message(b)


# ---- over asyncio streams ----

def _read_from(data: bytes) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await rpc.read_message(reader)

    return asyncio.run(go())


def test_stream_reader_reads_one_frame() -> None:
    assert _read_from(rpc.encode_frame({"ok": True})) == {"ok": True}


def test_stream_reader_reports_truncation_and_garbage() -> None:
    with pytest.raises(ConnectionClosed, match="got 1 bytes"):
        _read_from(struct.pack(">I", 10) + b"{")
    with pytest.raises(FrameError, match="not UTF-8 JSON"):
        _read_from(struct.pack(">I", 5) + b"hello")
    with pytest.raises(FrameError, match="exceeds"):
        _read_from(struct.pack(">I", rpc.MAX_FRAME + 1))


# ---- lean imports: `npaudit cni` is exec'd once per Pod ----

def _modules_after(statement: str) -> set[str]:
    code = ("import sys; before = set(sys.modules); " + statement + "; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    return set(proc.stdout.split())


def test_rpc_imports_only_the_standard_library() -> None:
    loaded = _modules_after("import policy_agent.rpc")
    foreign = {m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names}
    assert foreign == {"policy_agent", "policy_agent.errors", "policy_agent.rpc"}


def test_the_cni_plugin_loads_no_agent_machinery() -> None:
    loaded = {m.split(".")[0] for m in _modules_after("import policy_agent.cni.plugin")}
    foreign = {m for m in loaded if m not in sys.stdlib_module_names}
    assert foreign == {"policy_agent"}


# What `npaudit cni` may load beyond a bare interpreter (python -S: no site .pth files, which
# preload typing, re or pathlib in some installs and would hide a cost). VERSION needs json
# (which brings re) and struct; asyncio, argparse, logging, typing, dataclasses (inspect) and
# pathlib each cost milliseconds on every Pod start and are not needed.
CNI_PROJECT = {"policy_agent", "policy_agent.cli", "policy_agent.cli.main", "policy_agent.errors", "policy_agent.rpc",
               "policy_agent.cni", "policy_agent.cni.plugin", "policy_agent.cni.wire"}
CNI_STDLIB = {"__future__", "json", "re", "struct", "os", "posixpath", "genericpath", "stat", "enum", "functools",
              "collections", "operator", "keyword", "reprlib", "itertools", "types", "copyreg"}
CNI_SOCKET = {"_socket"}  # ADD, DEL, CHECK talk to the agent (not `socket`: selectors, array, enum classes)


def _cni_run(command: str, tmp_path: Path) -> tuple[str, set[str]]:
    """(stdout, modules loaded) of `npaudit cni` as the console script runs it, under python -S."""
    code = ("import sys; before = set(sys.modules); from policy_agent.cli.main import main; main(['cni']); "
            "sys.stderr.write('\\n'.join(sorted(set(sys.modules) - before)))")
    netconf = {"cniVersion": "1.0.0", "name": "n", "type": "npaudit", "agentSocket": str(tmp_path / "absent.sock")}
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "CNI_COMMAND": command,
           "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0"}
    proc = subprocess.run([sys.executable, "-S", "-c", code], input=json.dumps(netconf), capture_output=True,
                          text=True, timeout=60, env=env)
    return proc.stdout, set(proc.stderr.split())


def _public(modules: set[str]) -> set[str]:
    return {m for m in modules if not m.split(".")[-1].startswith("_") or m == "__future__"}


def test_npaudit_cni_version_loads_only_json_struct_and_the_plugin(tmp_path: Path) -> None:
    out, loaded = _cni_run("VERSION", tmp_path)
    assert json.loads(out)["cniVersion"] == "1.0.0"
    assert {m for m in loaded if m.startswith("policy_agent")} == CNI_PROJECT
    assert {m.split(".")[0] for m in _public(loaded) - CNI_PROJECT} <= CNI_STDLIB


def test_npaudit_cni_add_adds_only_socket(tmp_path: Path) -> None:
    out, loaded = _cni_run("ADD", tmp_path)
    assert json.loads(out)["code"] == 11  # it got as far as connecting to the (absent) agent
    assert {m for m in loaded if m.startswith("policy_agent")} == CNI_PROJECT
    assert {m.split(".")[0] for m in _public(loaded) - CNI_PROJECT} <= CNI_STDLIB
    _, version = _cni_run("VERSION", tmp_path)
    assert loaded - version <= CNI_SOCKET
