"""policy_agent.ovs.unixctl against a unix socket speaking unixctl's JSON-RPC: answers, errors, silence."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

from policy_agent.errors import OvsError
from policy_agent.ovs import unixctl

Answer = Callable[[dict], dict | None]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[[Answer], Path]]:
    """Start a one-connection unixctl server with a given answer (None: stay silent)."""
    servers: list[tuple[socket.socket, threading.Thread]] = []
    stop = threading.Event()

    def start(answer: Answer) -> Path:
        path = tmp_path / f"d{len(servers)}.ctl"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        srv.listen(1)

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                request = json.loads(conn.recv(65536))
                reply = answer(request)
                if reply is not None:
                    conn.sendall(json.dumps({"id": request["id"], **reply}).encode())
                stop.wait(5)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        servers.append((srv, thread))
        return path

    yield start
    stop.set()
    for srv, thread in servers:
        srv.close()
        thread.join(5)


def test_the_answer_is_the_text_the_daemon_sent(daemon: Callable[[Answer], Path]) -> None:
    seen: list[dict] = []
    path = daemon(lambda req: seen.append(req) or {"result": "42\n", "error": None})
    assert unixctl.call(path, "coverage/read-counter", ["rconn_overflow"]) == "42\n"
    assert (seen[0]["method"], seen[0]["params"]) == ("coverage/read-counter", ["rconn_overflow"])


def test_an_error_reply_names_the_socket_and_the_command(daemon: Callable[[Answer], Path]) -> None:
    path = daemon(lambda req: {"result": None, "error": "\"nope\" is not a valid command\n"})
    with pytest.raises(OvsError, match="nope") as err:
        unixctl.call(path, "nope")
    assert str(path) in str(err.value) and "nope on" in str(err.value)


def test_a_silent_daemon_times_out(daemon: Callable[[Answer], Path]) -> None:
    path = daemon(lambda req: None)
    with pytest.raises(OvsError, match="revalidator/purge on .*timed out"):
        unixctl.call(path, "revalidator/purge", timeout=0.2)


def test_no_socket_is_an_ovs_error(tmp_path: Path) -> None:
    with pytest.raises(OvsError, match=f"version on {tmp_path}/missing.ctl: cannot connect"):
        unixctl.call(tmp_path / "missing.ctl", "version")
