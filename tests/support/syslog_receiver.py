"""A plain TCP syslog receiver on 127.0.0.1 for tests (keeps the npaudit seq of every octet-counted message), and
records written for a forwarder to send."""

from __future__ import annotations

import socket
from pathlib import Path

from auditlog.chain import RecordText
from auditlog.writer import AuditWriter
from tests.support.accepting import AcceptThread
from tests.support.syslog_parse import parse_message, split_octet_counted


class TcpReceiver:
    """Accepts connections one after the other and keeps each message's seq; closes in order at the sender's
    end of stream (so a stopping forwarder knows everything sent was read)."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.connections = 0  # accepted so far
        self.ended: list[str] = []  # how each accepted connection ended: "eof" or the error
        self._accepting = AcceptThread(self._serve)
        self.url = f"tcp://127.0.0.1:{self._accepting.port}"

    def _serve(self, conn: socket.socket) -> None:
        self.connections += 1
        rest = b""
        with conn:
            try:
                while chunk := conn.recv(1 << 16):
                    messages, rest = split_octet_counted(rest + chunk)
                    self.seqs += [int(parse_message(m).sd["npaudit@32473"]["seq"]) for m in messages]
                self.ended.append(f"eof ({len(rest)} bytes of a cut message left)")
            except OSError as exc:
                self.ended.append(repr(exc))
            except Exception as exc:  # said by missing(), not lost in a thread's traceback
                self.ended.append(f"receiver failed: {exc!r}")
                raise

    def missing(self, first: int, last: int) -> str:
        """For a timeout's message: which of seqs first..last never arrived, and the connections' state."""
        gone = sorted(set(range(first, last + 1)) - set(self.seqs))
        spans = f"{len(gone)} missing, {gone[:5]}..{gone[-5:]}" if gone else "none missing"
        return (f"seqs {first}..{last}: {spans}; {self.connections} connection(s) accepted, "
                f"ended: {self.ended or 'none yet'}")

    def close(self) -> None:
        self._accepting.close()


def write_records(live: Path, first: int, count: int) -> None:
    """`count` small records through the real writer into the file set of `live` (its chain goes on)."""
    with AuditWriter(live, backup_count=100, max_age_days=0) as writer:
        for i in range(first, first + count):
            assert writer.submit(RecordText.of({"event": {"action": "allowed", "id": f"e{i}"}, "n": i}))
        assert writer.flush_wait()
