"""The tests' own receivers stop for good when closed: the port refuses and no thread of theirs is left to
accept on a socket that takes the freed fd number next (tests/support/accepting.py)."""

from __future__ import annotations

import socket
import threading
from typing import Callable

import pytest

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
    # A listener closed under a thread blocked in accept() goes on listening until that thread returns.
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
