"""A plain TCP syslog receiver on 127.0.0.1 for tests: keeps the npaudit seq of every octet-counted message."""

from __future__ import annotations

import socket
import threading

from tests.support.syslog_parse import parse_message, split_octet_counted


class TcpReceiver:
    """Accepts connections one after the other and keeps each message's seq; closes in order at the sender's
    end of stream (so a stopping forwarder knows everything sent was read)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.seqs: list[int] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            rest = b""
            with conn:
                try:
                    while chunk := conn.recv(1 << 16):
                        messages, rest = split_octet_counted(rest + chunk)
                        self.seqs += [int(parse_message(m).sd["npaudit@32473"]["seq"]) for m in messages]
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
