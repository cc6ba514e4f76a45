"""policy_agent.ovs.unixctl: one command over a unixctl socket speaking OVS's JSON-RPC, its reply text, and
OvsError naming the socket and the command when there is no answer."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from policy_agent.errors import OvsError
from policy_agent.ovs.unixctl import call, call_many, vswitchd_version
from tests.support.accepting import AcceptThread

Answer = Callable[[dict[str, Any]], dict[str, Any] | None]  # request -> reply (None: never answer)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[[Answer], Path]]:
    """A unixctl server on a socket in tmp_path, one connection, answering each request on it with `answer`."""
    daemons: list[AcceptThread] = []
    requests: list[dict[str, Any]] = []

    def start(answer: Answer) -> Path:
        path = tmp_path / "ovs-vswitchd.ctl"

        def serve(conn: socket.socket) -> None:
            with conn:
                buf, decoder = "", json.JSONDecoder()
                while True:
                    try:
                        request, end = decoder.raw_decode(buf)
                    except ValueError:  # no whole request yet: read on
                        chunk = conn.recv(4096)
                        if not chunk:
                            return
                        buf += chunk.decode()
                        continue
                    buf = buf[end:]
                    requests.append(request)
                    reply = answer(request)
                    if reply is None:
                        conn.recv(1)  # holds the connection open, silent, until the client goes
                        return
                    conn.sendall(json.dumps({"id": request["id"], **reply}).encode())  # then the next request

        daemons.append(AcceptThread(serve, path=path, once=True))
        return path

    yield start
    for d in daemons:
        d.close()


def test_a_command_returns_the_reply_text_and_sends_its_arguments(daemon: Callable[[Answer], Path]) -> None:
    seen: list[dict[str, Any]] = []

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return {"result": "42\n", "error": None}

    ctl = daemon(answer)
    assert call(ctl, "coverage/read-counter", ["rconn_overflow"], timeout=5.0) == "42\n"
    assert seen[0]["method"] == "coverage/read-counter" and seen[0]["params"] == ["rconn_overflow"]


def test_several_commands_share_one_connection_and_an_error_reply_is_that_commands_alone(
        daemon: Callable[[Answer], Path]) -> None:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        if request["params"] == ["nope"]:
            return {"result": None, "error": "nope: no such counter\n"}
        return {"result": f"{len(request['params'][0])}\n", "error": None}

    ctl = daemon(answer)  # it accepts one connection only: a second connect would find nobody
    answers = call_many(ctl, [("coverage/read-counter", ["rconn_overflow"]), ("coverage/read-counter", ["nope"]),
                              ("coverage/read-counter", ["ab"])], timeout=5.0)
    assert answers[0] == "14\n" and answers[2] == "2\n"
    assert isinstance(answers[1], OvsError) and "nope: no such counter" in str(answers[1])


def test_an_error_reply_is_an_ovs_error_naming_socket_command_and_the_daemons_text(
        daemon: Callable[[Answer], Path]) -> None:
    ctl = daemon(lambda request: {"result": None, "error": "\"revalidator/purge\" is not a valid command\n"})
    with pytest.raises(OvsError) as err:
        call(ctl, "revalidator/purge", timeout=5.0)
    assert str(ctl) in str(err.value) and "revalidator/purge" in str(err.value)
    assert "is not a valid command" in str(err.value)


def test_no_daemon_on_the_socket_is_an_ovs_error_saying_it_cannot_connect(tmp_path: Path) -> None:
    with pytest.raises(OvsError, match="cannot connect"):
        call(tmp_path / "absent.ctl", "version", timeout=1.0)


def test_a_daemon_that_accepts_and_never_answers_is_an_ovs_error_at_the_deadline(
        daemon: Callable[[Answer], Path]) -> None:
    ctl = daemon(lambda request: None)
    with pytest.raises(OvsError, match="no reply within 0.3s"):
        call(ctl, "version", timeout=0.3)


def test_the_vswitchd_version_is_read_from_its_version_text_and_none_without_a_daemon(
        daemon: Callable[[Answer], Path], tmp_path: Path) -> None:
    ctl = daemon(lambda request: {"result": "ovs-vswitchd (Open vSwitch) 3.1.0\n", "error": None})
    assert vswitchd_version(ctl) == "3.1.0"
    assert vswitchd_version(tmp_path / "absent.ctl", timeout=1.0) is None
