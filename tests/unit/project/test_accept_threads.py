"""The tests' own helpers stop for good when closed: the receivers' ports refuse and no thread of theirs is
left to accept on a socket that takes the freed fd number next (tests/support/accepting.py); a process
reaped mid-read of /proc reads as gone (tests/support/processes.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import pytest

from tests.support import processes
from tests.support.accepting import AcceptThread
from tests.support.relp_receiver import RelpReceiver
from tests.support.syslog_receiver import TcpReceiver
from tests.support.wire_tap import WireTap


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


RECEIVERS: dict[str, Callable[[], tuple[object, int]]] = {
    "accept-thread": lambda: (rx := AcceptThread(lambda conn: conn.close()), rx.port),
    "syslog-tcp": lambda: (rx := TcpReceiver(), _port(rx.url)),
    "relp": lambda: (rx := RelpReceiver(), _port(rx.url)),
    "wire-tap": lambda: (rx := WireTap(("127.0.0.1", 9)), rx.port),
}


@pytest.mark.parametrize("kind", RECEIVERS)
def test_a_closed_receiver_accepts_nothing_more_and_leaves_no_thread(kind: str) -> None:
    before = set(threading.enumerate())
    rx, port = RECEIVERS[kind]()
    with socket.create_connection(("127.0.0.1", port), timeout=5):  # one served, as a test would
        pass
    rx.close()  # type: ignore[attr-defined]
    # Closing stops the listening (the old helpers did that too); what they left was the thread, blocked in
    # accept() or about to call it on the freed fd number.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_close_ends_the_connection_being_served() -> None:
    served = threading.Event()

    def serve(conn: socket.socket) -> None:
        served.set()
        with conn:
            while conn.recv(4096):  # until close() shuts it down: the client never ends it
                pass

    rx = AcceptThread(serve)
    client = socket.create_connection(("127.0.0.1", rx.port), timeout=5)
    assert served.wait(5)
    rx.close(timeout=5)  # AssertionError if the thread were still in serve()
    client.close()


@pytest.mark.parametrize("connect", [False, True])
def test_a_one_shot_unix_socket_server_closed_leaves_no_thread_whether_or_not_it_was_reached(
        tmp_path: Path, connect: bool) -> None:
    """The fake agents and daemons on AF_UNIX paths: a test that failed before connecting used to leave a
    thread in accept() on the fd number its closed listener freed."""
    before = set(threading.enumerate())
    path = tmp_path / "api.sock"
    got: list[bytes] = []
    served = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            got.append(conn.recv(4))
        served.set()

    rx = AcceptThread(serve, path=path, once=True)
    if connect:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(path))
            c.sendall(b"ping")
        assert served.wait(5)
    rx.close()
    assert got == ([b"ping"] if connect else [])
    with pytest.raises(ConnectionRefusedError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(str(path))
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_a_process_reaped_between_the_open_and_the_read_of_its_stat_reads_as_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Running, asleep, or (a loaded machine, the interpreter still paging in) in a disk wait.
        assert processes.state(child.pid) in ("R", "S", "D") and processes.alive(child.pid)

        def reaped(self: Path, *args: object, **kwargs: object) -> str:
            raise ProcessLookupError(3, "No such process")  # what read() of an open /proc/PID/stat then gives

        with monkeypatch.context() as m:
            m.setattr(Path, "read_text", reaped)
            assert processes.state(child.pid) is None and not processes.alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert processes.state(child.pid) is None and not processes.alive(child.pid)
