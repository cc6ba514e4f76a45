"""A RELP receiver on 127.0.0.1 for unit tests: answers `open`, keeps each `syslog` message's npaudit seq and
answers it `rsp 200`, unless told to hold its answers (a receiver that took the bytes and has not processed them)
or to refuse (`rsp 500`)."""

from __future__ import annotations

import socket
import threading

from auditlog.syslog.relp import encode_frame, parse_frames
from tests.support.accepting import AcceptThread
from tests.support.syslog_parse import parse_message, split_octet_counted


class RelpReceiver:
    """One connection at a time; `hold` set: messages are kept but not answered until it is cleared."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.seqs: list[int] = []
        self.refuse = refuse
        self.hold = threading.Event()
        self.closes = 0  # `close` commands received
        self._lock = threading.Lock()
        self._accepting = AcceptThread(self._connection)
        self.url = f"relp://127.0.0.1:{self._accepting.port}"

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._serve(conn)
            except OSError:
                pass

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        unanswered: list[int] = []
        conn.settimeout(0.02)
        while True:
            if unanswered and not self.hold.is_set():
                code = b"500 refused" if self.refuse else b"200 OK"
                conn.sendall(b"".join(encode_frame(t, b"rsp", code) for t in unanswered))
                unanswered = []
            try:
                chunk = conn.recv(1 << 16)
            except TimeoutError:
                continue
            if not chunk:
                return
            frames, buf = parse_frames(buf + chunk)
            for frame in frames:
                if frame.command == b"open":
                    conn.sendall(encode_frame(frame.txnr, b"rsp", b"200 OK\nrelp_version=0\ncommands=syslog"))
                elif frame.command == b"syslog":
                    messages, rest = split_octet_counted(b"%d %b" % (len(frame.data), frame.data))
                    if rest or len(messages) != 1:
                        raise AssertionError(f"not one octet-counted message: {frame.data[:80]!r}")
                    with self._lock:
                        self.seqs.append(int(parse_message(messages[0]).sd["npaudit@32473"]["seq"]))
                    unanswered.append(frame.txnr)
                elif frame.command == b"close":
                    self.closes += 1
                    conn.sendall(encode_frame(frame.txnr, b"rsp") + encode_frame(0, b"serverclose"))
                    return

    def close(self) -> None:
        self._accepting.close()
