"""auditlog.syslog.transport: URLs, backoff, and real loopback sockets for UDP, TCP and TLS (no root)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Iterator

import pytest

from auditlog.syslog.errors import SyslogConfigError, SyslogTLSError, SyslogTransportError
from auditlog.syslog.transport import Backoff, Endpoint, TlsOptions, open_sender, parse_endpoint, tls_context
from tests.support.accepting import AcceptThread
from tests.support.certs import Pki, make_pki


class Receiver:
    """A loopback TCP (optionally TLS) server that keeps every byte each connection sent."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.received: list[bytes] = []
        self.handshake_errors: list[str] = []
        self.conns: list[socket.socket] = []
        self._accepting = AcceptThread(lambda conn: threading.Thread(target=self._read, args=(conn,),
                                                                     daemon=True).start())
        self.port = self._accepting.port

    def _read(self, conn: socket.socket) -> None:
        data = bytearray()
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                self.handshake_errors.append(str(exc))
                conn.close()
                return
        self.conns.append(conn)
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        self.received.append(bytes(data))
        conn.close()

    def drop_connections(self) -> None:
        for _ in range(200):  # the reader thread may not have taken the connection yet
            if self.conns:
                break
            threading.Event().wait(0.01)
        for conn in self.conns:
            conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._accepting.close()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", "good")


def server_context(pki: Pki) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.cert, pki.key)
    return ctx


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.mark.parametrize("url,expected", [
    ("udp://127.0.0.1:5514", Endpoint("udp", "127.0.0.1", 5514)),
    ("tcp://logs.example.com", Endpoint("tcp", "logs.example.com", 514)),
    ("tls://[::1]", Endpoint("tls", "::1", 6514)),
])
def test_destination_urls_name_scheme_host_and_port(url: str, expected: Endpoint) -> None:
    assert parse_endpoint(url) == expected
    assert parse_endpoint(str(expected)) == expected


@pytest.mark.parametrize("url", ["http://h:1", "tcp://", "tcp://h:99999", "tcp://h:1/path", "udp://u@h:1", "h:514"])
def test_a_bad_destination_url_is_a_config_error_that_quotes_it(url: str) -> None:
    with pytest.raises(SyslogConfigError, match="syslog destination"):
        parse_endpoint(url)


def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half_and_resets() -> None:
    high = Backoff(0.5, 4.0, rand=lambda: 1.0)
    assert [high.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    low = Backoff(0.5, 4.0, rand=lambda: 0.0)
    assert [low.next_delay() for _ in range(4)] == [0.25, 0.5, 1.0, 2.0]
    low.reset()
    assert low.next_delay() == 0.25
    with pytest.raises(SyslogConfigError):
        Backoff(0, 1)


def test_tcp_frames_arrive_back_to_back(receiver: Receiver) -> None:
    sender = open_sender(Endpoint("tcp", "127.0.0.1", receiver.port))
    sender.connect()
    sender.send([b"3 abc", b"2 de"])
    sender.send([b"1 f"])
    sender.close()
    for _ in range(200):
        if receiver.received:
            break
        threading.Event().wait(0.01)
    assert receiver.received == [b"3 abc2 de1 f"]


def test_a_send_into_a_connection_the_receiver_closed_fails_instead_of_vanishing(receiver: Receiver) -> None:
    sender = open_sender(Endpoint("tcp", "127.0.0.1", receiver.port))
    sender.connect()
    sender.send([b"1 a"])
    receiver.drop_connections()
    with pytest.raises(SyslogTransportError, match="closed|send failed"):
        for _ in range(50):  # the FIN may take a moment to arrive on loopback
            sender.send([b"1 b"])
            threading.Event().wait(0.01)
    assert not sender.connected


def test_connecting_to_nothing_is_a_transport_error_naming_the_destination() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    sender = open_sender(Endpoint("tcp", "127.0.0.1", port))
    with pytest.raises(SyslogTransportError, match=f"tcp://127.0.0.1:{port}"):
        sender.connect()


def test_udp_sends_one_datagram_per_frame() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2)
        sender = open_sender(Endpoint("udp", "127.0.0.1", rx.getsockname()[1]))
        sender.connect()
        sender.send([b"one", b"two"])
        assert [rx.recv(100), rx.recv(100)] == [b"one", b"two"]
        sender.close()


def test_tls_with_the_right_ca_delivers(pki: Pki) -> None:
    receiver = Receiver(server_context(pki))
    try:
        sender = open_sender(Endpoint("tls", "127.0.0.1", receiver.port), TlsOptions(ca=pki.ca))
        sender.connect()
        sender.send([b"5 hello"])
        sender.close()
        for _ in range(200):
            if receiver.received:
                break
            threading.Event().wait(0.01)
        assert receiver.received == [b"5 hello"]
    finally:
        receiver.close()


def test_tls_with_a_wrong_ca_fails_the_handshake_and_sends_no_plaintext(pki: Pki, tmp_path: Path) -> None:
    other = make_pki(tmp_path / "other", "other")
    raw = Receiver()  # a plain listener sees every byte the client puts on the wire
    try:
        sender = open_sender(Endpoint("tls", "127.0.0.1", raw.port), TlsOptions(ca=other.ca), timeout=0.5)
        with pytest.raises(SyslogTLSError):
            sender.connect()  # the raw listener never answers the ClientHello: a failed handshake
    finally:
        raw.close()
    receiver = Receiver(server_context(pki))
    try:
        sender = open_sender(Endpoint("tls", "127.0.0.1", receiver.port), TlsOptions(ca=other.ca))
        with pytest.raises(SyslogTLSError, match="not trusted"):
            sender.connect()
        assert not sender.connected
        with pytest.raises(SyslogTransportError, match="not connected"):
            sender.send([b"5 hello"])
    finally:
        receiver.close()
    assert all(b"hello" not in data for data in raw.received + receiver.received)


def test_tls_settings_are_checked_when_the_sender_is_made(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(SyslogConfigError, match="ca"):
        tls_context(TlsOptions(ca=tmp_path / "missing.pem"))
    with pytest.raises(SyslogConfigError, match="together"):
        tls_context(TlsOptions(ca=pki.ca, cert=pki.cert))
    ctx = tls_context(TlsOptions(ca=pki.ca, cert=pki.cert, key=pki.key))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2 and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


class StalledReceiver:
    """Accepts one connection (TLS if given a context) with a tiny receive buffer and reads only when told."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited by the connection
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.tls = tls
        self.conn: socket.socket | None = None
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # shut down by close() before anyone connected
            return
        self.conn = self.tls.wrap_socket(conn, server_side=True) if self.tls is not None else conn
        self.ready.set()

    def read(self, count: int) -> bytes:
        assert self.ready.wait(5) and self.conn is not None
        data = bytearray()
        while len(data) < count:
            data += self.conn.recv(65536)
        return bytes(data)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        # Shut down, and the thread gone, before the fd is freed (tests/support/accepting.py says why).
        self.listener.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self.listener.close()


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
def test_unacked_counts_what_a_stalled_receiver_lacks_until_it_reads_everything(scheme: str, pki: Pki) -> None:
    receiver = StalledReceiver(server_context(pki) if scheme == "tls" else None)
    try:
        sender = open_sender(Endpoint(scheme, "127.0.0.1", receiver.port), TlsOptions(ca=pki.ca) if scheme == "tls"
                             else None, timeout=5)
        sender.connect()
        assert receiver.ready.wait(5)
        payload = [b"%d " % i + b"x" * 1000 for i in range(50)]
        sender.send(payload)  # 50 kB: far more than the receiver's buffer
        threading.Event().wait(0.05)
        stalled = sender.unacked()
        assert 0 < stalled <= sum(map(len, payload))
        assert receiver.read(sum(map(len, payload))) == b"".join(payload)
        for _ in range(200):
            if sender.unacked() == 0:
                break
            threading.Event().wait(0.01)
        assert sender.unacked() == 0 and sender.connected
        sender.close()
    finally:
        receiver.close()


def test_a_receiver_that_resets_with_bytes_unread_is_an_error_not_an_empty_queue() -> None:
    receiver = StalledReceiver()
    try:
        sender = open_sender(Endpoint("tcp", "127.0.0.1", receiver.port), timeout=5)
        sender.connect()
        sender.send([b"x" * 50_000])
        assert receiver.ready.wait(5) and receiver.conn is not None
        receiver.conn.close()  # unread data: the kernel answers with a reset, which empties our send queue
        with pytest.raises(SyslogTransportError, match="closed"):
            for _ in range(200):
                sender.unacked()
                threading.Event().wait(0.01)
        assert not sender.connected
    finally:
        receiver.close()


def test_bytes_acknowledged_before_the_receiver_closed_count_once_then_the_connection_fails(
        receiver: Receiver) -> None:
    """A receiver that acknowledged everything and closed in order: `unacked` says 0 once (the forwarder
    counts those records sent, instead of calling them unsent and repeating them later), then fails."""
    sender = open_sender(Endpoint("tcp", "127.0.0.1", receiver.port))
    sender.connect()
    sender.send([b"3 abc"])
    for _ in range(200):
        if sender.unacked() == 0:
            break
        threading.Event().wait(0.01)
    receiver.drop_connections()
    for _ in range(200):
        if receiver.received:  # it saw its end of stream and closed
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.1)  # its FIN arrives on loopback
    assert sender.unacked() == 0
    with pytest.raises(SyslogTransportError, match="closed"):
        sender.unacked()
    assert not sender.connected
