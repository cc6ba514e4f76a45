"""Issue 12: TCP's acknowledgement is not delivery. A receiver that stops reading and then closes drops what its
kernel acknowledged but it never read; the forwarder sends that again (real loopback sockets, no root)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from auditlog.chain import RecordText
from auditlog.syslog.checkpoint import Position, load_checkpoint
from auditlog.syslog.destination import make_destination
from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.transport import TlsOptions
from auditlog.syslog.window import Batch, SendWindow
from auditlog.writer import AuditWriter
from tests.support.certs import Pki, make_pki
from tests.support.syslog_parse import parse_message, split_octet_counted

RECORDS = 400
BATCH = 10
RCVBUF = 65536  # asked of the receiver's kernel (it doubles it); far below what the forwarder sends


def write(live: Path) -> None:
    with AuditWriter(live, max_bytes=64 * 1024, backup_count=100, max_age_days=0) as w:
        for i in range(1, RECORDS + 1):
            w.submit(RecordText.of({"@timestamp": "2026-11-30T02:14:03.512Z", "event": {"id": f"e{i}"},
                                    "labels": {"log_label": "L" * 300}, "npaudit": {"disposition": "Allow"}}))
        assert w.flush_wait()


class Conn:
    """One accepted connection, read by the test: only what `read` took counts as the receiver's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames: list[bytes] = []
        self._rest = b""

    def read(self, until: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            self.sock.settimeout(0.1)
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, ssl.SSLWantReadError):
                continue
            if not data:
                return
            frames, self._rest = split_octet_counted(self._rest + data)
            self.frames += frames

    @property
    def seqs(self) -> list[int]:
        return [json.loads(parse_message(f).msg)["npaudit"]["seq"] for f in self.frames]


class Listener:
    """A loopback syslog receiver with a small receive buffer (inherited by its connections), TLS if given."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.tls = tls
        self.conns: list[Conn] = []

    def accept(self) -> Conn:
        sock, _ = self.sock.accept()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True)
        self.conns.append(Conn(sock))
        return self.conns[-1]

    @property
    def buffer(self) -> int:
        """The most a connection's kernel holds unread (the doubled SO_RCVBUF)."""
        return self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    def close(self) -> None:
        for conn in self.conns:
            conn.sock.close()
        self.sock.close()


@pytest.fixture
def listener() -> Any:
    made = Listener()
    yield made
    made.close()


def forwarder(tmp_path: Path, port: int, scheme: str = "tcp", **kw: Any) -> Forwarder:
    tls = kw.pop("tls", None)
    dest = make_destination(f"{scheme}://127.0.0.1:{port}", node_name="node-a", batch_records=BATCH, tls=tls, **kw)
    fwd = Forwarder(dest, live=tmp_path / "log" / "audit.jsonl", checkpoint=tmp_path / "state" / "ck.json",
                    poll_interval=0.02, backoff_base=0.05, backoff_cap=0.2)
    fwd.start()
    return fwd


def stall(first: Conn, fwd: Forwarder) -> None:
    """The receiver reads 20 records, then stops reading until its kernel acknowledged a whole batch it never read."""
    first.read(lambda: len(first.frames) >= 20)
    read_to = max(first.seqs)
    deadline = time.monotonic() + 10
    while (fwd.stats().last_seq_sent or 0) < read_to + BATCH:
        assert time.monotonic() < deadline, "the receiver's kernel never acknowledged more than was read"
        time.sleep(0.01)


def frame_bytes(conn: Conn, seqs: set[int]) -> int:
    return sum(len(f) for f, s in zip(conn.frames, conn.seqs) if s in seqs)


def test_a_receiver_closing_with_acknowledged_bytes_unread_loses_nothing_and_repeats_at_most_its_buffer(
        tmp_path: Path, listener: Listener) -> None:
    write(tmp_path / "log" / "audit.jsonl")
    fwd = forwarder(tmp_path, listener.port, receive_buffer_bytes=listener.buffer)
    try:
        first = listener.accept()
        stall(first, fwd)
        first.sock.close()  # bytes unread: the kernel resets the connection and drops them
        second = listener.accept()  # the forwarder reconnects
        second.read(lambda: set(first.seqs) | set(second.seqs) >= set(range(1, RECORDS + 1)))
    finally:
        fwd.stop()
    assert sorted(set(first.seqs) | set(second.seqs)) == list(range(1, RECORDS + 1))
    assert second.seqs == list(range(second.seqs[0], RECORDS + 1))  # in order from the rewind point
    repeated = set(first.seqs) & set(second.seqs)
    largest_batch = BATCH * max(map(len, first.frames))
    assert frame_bytes(second, repeated) <= listener.buffer + largest_batch
    assert fwd.stats().sent == RECORDS and fwd.stats().last_seq_sent == RECORDS  # repeats are not counted twice


def test_a_restart_while_the_receiver_holds_unread_bytes_sends_them_again(tmp_path: Path, listener: Listener) -> None:
    write(tmp_path / "log" / "audit.jsonl")
    fwd = forwarder(tmp_path, listener.port, receive_buffer_bytes=listener.buffer)
    first = listener.accept()
    stall(first, fwd)
    assert fwd.stop()  # the receiver does not read to our end of stream: nothing after what it read is saved
    saved = load_checkpoint(fwd.checkpoint)
    assert saved is None or saved.seq <= max(first.seqs)
    first.sock.close()
    again = forwarder(tmp_path, listener.port, receive_buffer_bytes=listener.buffer)
    try:
        second = listener.accept()
        second.read(lambda: bool(second.seqs) and second.seqs[-1] == RECORDS)
    finally:
        again.stop()
    assert sorted(set(first.seqs) | set(second.seqs)) == list(range(1, RECORDS + 1))


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
def test_a_receiver_that_reads_to_our_end_of_stream_confirms_everything_at_stop(
        tmp_path: Path, scheme: str) -> None:
    pki: Pki = make_pki(tmp_path / "pki", "good")
    server = None
    if scheme == "tls":
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(pki.cert, pki.key)
    listener = Listener(server)
    try:
        write(tmp_path / "log" / "audit.jsonl")
        fwd = forwarder(tmp_path, listener.port, scheme, tls=TlsOptions(ca=pki.ca) if server else None)
        conn = listener.accept()
        conn.read(lambda: bool(conn.seqs) and conn.seqs[-1] == RECORDS)
        time.sleep(0.2)  # checkpoint_interval and idle polls passed: saved if it were confirmed
        saved = load_checkpoint(fwd.checkpoint)
        # The default bound (this host's largest TCP receive buffer) exceeds all that was sent: nothing confirmed.
        assert saved is None or saved.seq < RECORDS
        stopper = threading.Thread(target=fwd.stop)
        stopper.start()
        conn.read(lambda: False, timeout=3)  # to the end of stream: returns at EOF
        conn.sock.close()  # in order: nothing unread
        stopper.join(10)
        assert not stopper.is_alive()
        saved = load_checkpoint(fwd.checkpoint)
        assert saved is not None and saved.seq == RECORDS
        assert conn.seqs == list(range(1, RECORDS + 1))
    finally:
        listener.close()


def test_the_window_confirms_an_acknowledged_batch_only_once_the_receive_buffer_bound_follows_it() -> None:
    def batch(seq: int) -> Batch:
        return Batch.of([b"x" * 100], 1, Position(1, 2, seq * 100, seq))

    window = SendWindow(max_batches=8, max_bytes=1 << 20, unread_bytes=300)
    for seq in range(1, 6):
        window.sent(batch(seq))  # connection offsets 100, 200, ..., 500
    assert [b.end.seq for b in window.acked(unacked=150)] == [1, 2, 3]  # 350 acknowledged
    assert window.confirmed() == [] and window.holding and len(window) == 2
    assert window.at_risk_frames == 3  # kept without their frames: a drop reads them again from the files
    assert [b.end.seq for b in window.acked(unacked=0)] == [4, 5]
    confirmed = window.confirmed()  # 500 acknowledged: what ends by 200 was read
    assert [(b.end.seq, b.frames) for b in confirmed] == [(1, ()), (2, ())] and window.at_risk_frames == 3
    assert [b.end.seq for b in window.confirm_all()] == [3, 4, 5] and not window.holding
