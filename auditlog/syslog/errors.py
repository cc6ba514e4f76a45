"""Exceptions raised by the syslog forwarder (auditlog.syslog): one base, one class per concern."""

from __future__ import annotations


class SyslogError(Exception):
    """Base class for everything auditlog.syslog raises."""


class SyslogConfigError(SyslogError, ValueError):
    """A destination or option that cannot work; the text names the field."""


class SyslogFormatError(SyslogError):
    """A record that cannot be put into an RFC 5424 message or frame."""


class SyslogTransportError(SyslogError):
    """Connecting to or sending to a receiver failed (the batch is kept and sent again)."""


class SyslogTLSError(SyslogTransportError):
    """The TLS handshake failed, e.g. the server certificate did not verify (never retried in plain TCP)."""


class CheckpointError(SyslogError):
    """The forwarder's checkpoint file cannot be read or written."""
