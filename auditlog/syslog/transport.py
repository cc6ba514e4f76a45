"""Senders to one syslog receiver over UDP, TCP or TLS, and the jittered backoff between reconnects.

A stream send counts as done once the receiver's TCP has acknowledged every byte
(the socket's send queue is empty) and the connection is still open: syslog has
no application acknowledgement (RFC 6587), and bytes written into a connection
the receiver has already closed would otherwise be "sent" and lost. TLS verifies
the server (CA, host name) and never falls back to plain TCP.
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

from auditlog.syslog.errors import SyslogConfigError, SyslogTLSError, SyslogTransportError

SCHEMES = ("udp", "tcp", "tls")
DEFAULT_PORTS = {"udp": 514, "tcp": 514, "tls": 6514}  # RFC 5426, RFC 6587 common practice, RFC 5425
_ACK_POLL = 0.002  # seconds between looks at the send queue while waiting for the receiver's ACKs


class Sender(Protocol):
    """Delivers whole frames to one receiver."""

    @property
    def connected(self) -> bool: ...
    def connect(self) -> None: ...
    def send(self, frames: Sequence[bytes]) -> None: ...
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
    """The Endpoint of "udp://host:port", "tcp://…" or "tls://…"; SyslogConfigError naming the URL otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SyslogConfigError(f"syslog destination {url!r}: {exc}") from exc
    if parts.scheme not in SCHEMES:
        raise SyslogConfigError(f"syslog destination {url!r}: scheme must be one of {', '.join(SCHEMES)}")
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise SyslogConfigError(f"syslog destination {url!r}: expected {parts.scheme}://host:port")
    return Endpoint(parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme])


def tls_context(options: TlsOptions) -> ssl.SSLContext:
    """A client context: TLS 1.2 or later, server certificate and host name verified, optional client cert."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname by default
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
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

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        self.close()
        try:
            sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=self._timeout)
        except OSError as exc:
            raise SyslogTransportError(f"syslog {self.endpoint}: cannot connect: {exc}") from exc
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_name)
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                raise SyslogTLSError(f"syslog {self.endpoint}: server certificate not trusted "
                                     f"({exc.verify_message}); not sending") from exc
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                raise SyslogTLSError(f"syslog {self.endpoint}: TLS handshake failed: {exc}") from exc
        self._sock = sock

    def send(self, frames: Sequence[bytes]) -> None:
        sock = self._sock
        if sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        try:
            if _peer_closed(sock):
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the connection")
            sock.sendall(b"".join(frames))
            _wait_acked(sock, self._timeout)
            if _peer_closed(sock):
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the connection")
        except SyslogTransportError:
            self.close()
            raise
        except OSError as exc:  # ssl.SSLError is one
            self.close()
            raise SyslogTransportError(f"syslog {self.endpoint}: send failed: {exc}") from exc

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


def _wait_acked(sock: socket.socket, timeout: float) -> None:
    """Wait until the kernel's send queue is empty, i.e. the receiver's TCP has every byte."""
    deadline = time.monotonic() + timeout
    buf = bytearray(4)
    while True:
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf)  # SIOCOUTQ: unsent + unacknowledged bytes
        if struct.unpack("i", buf)[0] == 0:
            return
        if time.monotonic() >= deadline:
            raise SyslogTransportError(f"receiver did not acknowledge the batch within {timeout:g} s")
        time.sleep(_ACK_POLL)


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
    options = tls or TlsOptions()
    return StreamSender(endpoint, tls=tls_context(options), server_name=options.server_name, timeout=timeout)
