"""A listening socket served by a thread of its own, stopped so that no stale thread outlives it.

Closing a listener under a thread blocked in accept() does not wake that thread, and the fd number is
free at once. A thread that had read the number but not yet entered accept() when it was closed then
accepts on whatever socket takes that number next: the next test's listener. That is how a receiver of
one test once took, read and closed a connection meant for the next test's receiver, whose records then
never arrived. `close` shuts the listener down first (accept() fails at once, blocked or not), ends the
connection being served, waits for the thread to exit, and only then frees the fd.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Callable


class AcceptThread:
    """Accepts connections on 127.0.0.1 (a free port), or on the AF_UNIX socket `path`, and hands each to
    `on_connection(conn)` in this thread; the handler owns `conn` (closes it, or hands it to a thread of its
    own). `once`: the first connection only (a later connect waits in the backlog, unserved, until close)."""

    def __init__(self, on_connection: Callable[[socket.socket], None], *, path: Path | None = None,
                 once: bool = False) -> None:
        if path is None:
            self.sock = socket.create_server(("127.0.0.1", 0))
            self.port: int = self.sock.getsockname()[1]
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(str(path))
            self.sock.listen(4)
            self.port = 0
        self._where = f"port {self.port}" if path is None else str(path)
        self._on_connection = on_connection
        self._once = once
        self._serving: socket.socket | None = None
        self._closing = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # shut down by close()
                return
            with self._lock:
                self._serving = conn
                if self._closing:  # accepted as close() began: serve nothing more
                    _shutdown(conn)
            try:
                self._on_connection(conn)
            finally:
                with self._lock:
                    self._serving = None
            if self._once:
                return

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, end the connection being served, wait for the thread; then close the listener."""
        with self._lock:
            self._closing = True
            serving = self._serving
        _shutdown(self.sock)
        if serving is not None:
            _shutdown(serving)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the accept thread of {self._where} still runs {timeout:g} s after close")
        self.sock.close()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected, or already closed
        pass
