"""Senders to one syslog receiver over UDP, TCP, TLS or RELP (plain or in TLS), and the jittered backoff between
reconnects.

Syslog over TCP has no application acknowledgement (RFC 6587), so a stream sender
reports delivery from the receiver's TCP: `send` hands frames to the kernel
without waiting, and `unacked` says how many of the bytes sent on the
connection the receiver's TCP has not acknowledged yet (the caller keeps
several batches in flight and counts one delivered once all its bytes are
acknowledged). A connection the receiver has closed is an error, never
"delivered": bytes written into it would otherwise vanish. An acknowledged
byte may still be unread in the receiver's receive buffer (window.py), so
`finish` ends a connection by asking the receiver to read to the end, and
`receive_buffer_bound` says how much it can hold unread. TLS verifies the
server (CA, host name) and never falls back to plain TCP. RELP (relp.py) has
application acknowledgements: there "acknowledged" means the receiver's process
took the message.
"""

from __future__ import annotations

import fcntl
import random
import select
import socket
import ssl
import struct
import termios
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence
from urllib.parse import urlsplit

from auditlog.syslog.errors import SyslogConfigError, SyslogTransportError
from auditlog.syslog.connect import open_stream
from auditlog.syslog.relp import RelpSender

SCHEMES = ("udp", "tcp", "tls", "relp", "relp+tls")
# RFC 5426, RFC 6587 common practice, RFC 5425; relp: rsyslog's imrelp examples (RELP has no assigned port).
DEFAULT_PORTS = {"udp": 514, "tcp": 514, "tls": 6514, "relp": 2514, "relp+tls": 2514}
RELP_SCHEMES = ("relp", "relp+tls")  # RELP sessions (relp.py): application acknowledgements
TLS_SCHEMES = ("tls", "relp+tls")    # over TLS: the server verified (CA, host name), never plain TCP
ACK_POLL = 0.002  # seconds between looks at the send queue while waiting for the receiver's ACKs
# RFC 8446 5.1 / RFC 5246 6.2.1: the most plaintext one TLS record carries.
TLS_MAX_RECORD_PLAINTEXT = 1 << 14
TCP_RMEM = Path("/proc/sys/net/ipv4/tcp_rmem")
DEFAULT_TCP_RMEM_MAX = 6 << 20  # Linux's default largest TCP receive buffer (net.ipv4.tcp_rmem)


class Sender(Protocol):
    """Delivers whole frames to one receiver; `send` does not wait for the receiver, `unacked` tells how far it got."""

    @property
    def connected(self) -> bool: ...
    def connect(self) -> None: ...
    def send(self, frames: Sequence[bytes]) -> None: ...
    def unacked(self) -> int: ...  # bytes sent on this connection not known delivered (0: all of them)
    def finish(self, timeout: float) -> bool: ...  # True: the receiver read everything sent, then closed
    def close(self) -> None: ...


@dataclass(frozen=True)
class Endpoint:
    """Where a destination URL points: scheme (udp, tcp, tls), host and port."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True)
class TlsOptions:
    """TLS client settings. ca None: the system's trust store (the server is verified either way)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None  # the name the certificate must carry; default: the URL's host


def parse_endpoint(url: str) -> Endpoint:
    """The Endpoint of "udp://host:port", "tcp://…", "tls://…", "relp://…" or "relp+tls://…"; SyslogConfigError
    naming the URL otherwise."""
    # urlsplit drops tabs and line breaks silently: a URL holding one is not the URL it reads as.
    if any(ord(c) < 0x20 or c == "\x7f" or c.isspace() for c in url):
        raise SyslogConfigError(f"syslog destination {url!r}: must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SyslogConfigError(f"syslog destination {url!r}: {exc}") from exc
    if parts.scheme not in SCHEMES:
        raise SyslogConfigError(f"syslog destination {url!r}: scheme must be one of {', '.join(SCHEMES)}")
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise SyslogConfigError(f"syslog destination {url!r}: expected {parts.scheme}://host:port")
    if port == 0:
        raise SyslogConfigError(f"syslog destination {url!r}: port must be 1..65535, got 0")
    return Endpoint(parts.scheme, parts.hostname, DEFAULT_PORTS[parts.scheme] if port is None else port)


def tls_context(options: TlsOptions) -> ssl.SSLContext:
    """A client context: TLS 1.2 or later, server certificate and host name verified, optional client cert."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname by default
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # StreamSender.unacked relies on every TLS record being at least as long as its plaintext.
    ctx.options |= ssl.OP_NO_COMPRESSION
    try:
        if options.ca is not None:
            ctx.load_verify_locations(cafile=str(options.ca))
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (OSError, ssl.SSLError) as exc:
        raise SyslogConfigError(f"syslog tls ca {options.ca}: {exc}") from exc
    if (options.cert is None) != (options.key is None):
        raise SyslogConfigError("syslog tls: cert and key go together")
    if options.cert is not None:
        try:
            ctx.load_cert_chain(str(options.cert), str(options.key))
        except (OSError, ssl.SSLError) as exc:
            raise SyslogConfigError(f"syslog tls cert {options.cert} / key {options.key}: {exc}") from exc
    return ctx


class UdpSender:
    """One datagram per frame; "connected" means the socket is set up (UDP knows no more)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._sock: socket.socket | None = None

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(self.endpoint.host, self.endpoint.port,
                                                              type=socket.SOCK_DGRAM)[0]
            sock = socket.socket(family, kind, proto)
            sock.connect(addr)
        except OSError as exc:
            raise SyslogTransportError(f"syslog {self.endpoint}: {exc}") from exc
        self._sock = sock

    def send(self, frames: Sequence[bytes]) -> None:
        if self._sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        try:
            for datagram in frames:
                self._sock.send(datagram)
        except OSError as exc:  # e.g. ECONNREFUSED after an ICMP port unreachable
            self.close()
            raise SyslogTransportError(f"syslog {self.endpoint}: {exc}") from exc

    def unacked(self) -> int:
        """UDP knows no acknowledgement: a datagram counts as delivered once it left the socket."""
        if self._sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        return 0

    def finish(self, timeout: float) -> bool:
        """UDP: nothing more to learn; closes the socket."""
        self.close()
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class StreamSender:
    """TCP, or TLS when given a context: frames are written back to back on one connection."""

    def __init__(self, endpoint: Endpoint, *, tls: ssl.SSLContext | None = None, server_name: str | None = None,
                 timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self._tls = tls
        self._server_name = server_name or endpoint.host
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._sent = 0  # bytes handed to the current connection (plaintext under TLS)
        self._peer_seen_open = False  # `unacked` found the receiver there since the last send
        self._peer_gone = False  # the receiver closed after acknowledging everything: the next call fails

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        self.close()
        self._sent = 0
        self._peer_seen_open = self._peer_gone = False
        sock = open_stream(self.endpoint, self._timeout, self._tls, self._server_name)
        self._sock = sock

    def send(self, frames: Sequence[bytes]) -> None:
        """Write `frames` back to back; blocks only while the kernel's send buffer is full (up to the timeout).

        The receiver is looked at first (one system call) unless `unacked` did so since the last send: a
        forwarder asks `unacked` right before it sends, and every system call costs it the GIL."""
        sock = self._sock
        if sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        data = b"".join(frames)
        seen_open, self._peer_seen_open = self._peer_seen_open, False
        try:
            if self._peer_gone or (not seen_open and _peer_closed(sock)):
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the connection")
            sock.sendall(data)
        except SyslogTransportError:
            self.close()
            raise
        except OSError as exc:  # ssl.SSLError is one
            self.close()
            raise SyslogTransportError(f"syslog {self.endpoint}: send failed: {exc}") from exc
        self._sent += len(data)

    def unacked(self) -> int:
        """Bytes given to `send` on this connection that the receiver's TCP may not have acknowledged yet.

        TCP: the kernel's send queue (SIOCOUTQ: unsent + unacknowledged bytes),
        all of them ours. TLS: the queue holds ciphertext, which never maps back
        to plaintext exactly, so the answer is an upper bound: an empty queue
        means every byte arrived; otherwise the queue's Q bytes are the tail of
        the ciphertext, and the plaintext they may still hold is at most Q (a
        record is never shorter than its plaintext: compression is off) plus
        one whole record's plaintext, for the oldest record only partly in the
        queue (a receiver can use a record only once all of it arrived). The
        queue also holds TLS's own messages; they only make the bound larger.
        The peer is checked after reading the queue: a reset empties the queue,
        which must not read as "all acknowledged". A receiver that closed in
        order with nothing left in our queue did acknowledge every byte: that is
        answered (0) once, so the caller counts those bytes, and the next call fails.
        """
        sock = self._sock
        if sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        try:
            if self._peer_gone:
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the connection")
            buf = bytearray(4)
            fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf)  # SIOCOUTQ
            queued = struct.unpack("i", buf)[0]
            if _peer_closed(sock):
                if queued == 0 and _orderly_close(sock):
                    self._peer_gone = True
                    return 0
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the connection")
        except SyslogTransportError:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise SyslogTransportError(f"syslog {self.endpoint}: send queue unreadable: {exc}") from exc
        self._peer_seen_open = True
        if queued == 0:
            return 0
        if self._tls is not None:
            queued += TLS_MAX_RECORD_PLAINTEXT
        return min(self._sent, queued)

    def finish(self, timeout: float) -> bool:
        """End our side of the stream and wait up to `timeout` seconds for the receiver to close its side; then
        close. True only if it did so in order (EOF): a receiver sees our end of stream only after reading every
        byte before it. False if it reset the connection (it dropped unread bytes), or did not answer.

        TLS: the end of stream is TCP's (no close_notify, which would wait for the peer's): a TLS receiver
        still reads every record before it sees it.
        """
        sock = self._sock
        if sock is None:
            return False
        deadline = time.monotonic() + timeout
        try:
            sock.shutdown(socket.SHUT_WR)  # an SSLSocket leaves TLS here: recv reads the raw socket
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                if sock.recv(4096) == b"":  # stray bytes (a TLS alert, a session ticket) are skipped
                    return True
            return False
        except OSError:  # reset, or the timeout
            return False
        finally:
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _peer_closed(sock: socket.socket) -> bool:
    """True if the receiver has closed or reset the connection (it never sends us data)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        data = sock.recv(4096)  # a receiver's stray bytes, or a TLS 1.3 session ticket, are just consumed
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)
    return data == b""


_TCP_CLOSE_WAIT = 8  # linux/include/net/tcp_states.h


def _orderly_close(sock: socket.socket) -> bool:
    """True if the receiver's end of stream came in order (our TCP state is CLOSE_WAIT): no reset followed it,
    so an empty send queue means acknowledged, not purged by a reset."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == _TCP_CLOSE_WAIT
    except OSError:
        return False


def receive_buffer_bound(path: Path = TCP_RMEM) -> int:
    """The most a Linux TCP receiver holds unread with default settings: this host's net.ipv4.tcp_rmem maximum
    (exact for a receiver on this host, a guess for another), or Linux's default when it cannot be read."""
    try:
        return int(path.read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return DEFAULT_TCP_RMEM_MAX


def wait_acked(sender: Sender, name: str, timeout: float, *, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait until the receiver acknowledged everything sent on `sender`'s connection; SyslogTransportError if
    it did not within `timeout` seconds or closed the connection."""
    deadline = clock() + timeout
    while sender.unacked():
        if clock() >= deadline:
            sender.close()
            raise SyslogTransportError(f"syslog {name}: the receiver did not acknowledge within {timeout:g} s")
        sleep(ACK_POLL)


class Backoff:
    """Exponential backoff with jitter: each delay drawn from [d/2, d] with d = min(cap, base * 2**failures)."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rand: Callable[[], float] = random.random) -> None:
        if not 0 < base <= cap:
            raise SyslogConfigError(f"syslog backoff: need 0 < base <= cap, got base={base} cap={cap}")
        self.base, self.cap = base, cap
        self._rand = rand
        self._failures = 0

    def next_delay(self) -> float:
        """The wait before the next attempt after one more failure."""
        ceiling = min(self.cap, self.base * 2 ** min(self._failures, 62))
        self._failures += 1
        return ceiling / 2 + self._rand() * ceiling / 2

    def reset(self) -> None:
        """After a success: the next failure waits `base` again."""
        self._failures = 0


def open_sender(endpoint: Endpoint, tls: TlsOptions | None = None, timeout: float = 10.0) -> Sender:
    """The Sender for `endpoint` (its TLS context made now, so a bad CA path fails at start-up)."""
    if endpoint.scheme == "udp":
        return UdpSender(endpoint)
    if endpoint.scheme == "tcp":
        return StreamSender(endpoint, timeout=timeout)
    if endpoint.scheme == "relp":
        return RelpSender(endpoint, timeout=timeout)
    options = tls or TlsOptions()
    if endpoint.scheme == "relp+tls":  # rsyslog imrelp tls="on": the RELP session inside TLS
        return RelpSender(endpoint, tls=tls_context(options), server_name=options.server_name, timeout=timeout)
    return StreamSender(endpoint, tls=tls_context(options), server_name=options.server_name, timeout=timeout)
