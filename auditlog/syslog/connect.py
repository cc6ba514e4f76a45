"""Opening a stream connection to a receiver, over TLS when given a context: shared by the TCP/TLS and RELP senders."""

from __future__ import annotations

import socket
import ssl
from typing import Protocol

from auditlog.syslog.errors import SyslogTLSError, SyslogTransportError


class Address(Protocol):
    """Where to connect (transport.Endpoint is one)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


def open_stream(endpoint: Address, timeout: float, tls: ssl.SSLContext | None, server_name: str) -> socket.socket:
    """A connected socket to `endpoint`, TLS-wrapped and its certificate checked when `tls` is given.
    SyslogTransportError when it cannot connect; SyslogTLSError when the handshake or the certificate fails."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as exc:
        raise SyslogTransportError(f"syslog {endpoint}: cannot connect: {exc}") from exc
    if tls is None:
        return sock
    try:
        return tls.wrap_socket(sock, server_hostname=server_name)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise SyslogTLSError(f"syslog {endpoint}: server certificate not trusted "
                             f"({exc.verify_message}); not sending") from exc
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        raise SyslogTLSError(f"syslog {endpoint}: TLS handshake failed: {exc}") from exc
