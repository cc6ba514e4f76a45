"""A forwarder's counters as a snapshot: what `npaudit syslog status`, the metrics and the child-process protocol
carry. Its own module, so that reading a snapshot (auditlog.syslog.status) loads no forwarder machinery."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ForwarderStats"]


@dataclass(frozen=True)
class ForwarderStats:
    """A snapshot of one forwarder (counters are records, since the forwarder started)."""

    destination: str
    connected: bool
    last_seq_sent: int | None
    backlog_bytes: int | None
    last_error: str | None
    sent: int
    lost: int          # removed by retention before they were sent
    truncated: int     # UDP: sent with a stub MSG
    skipped: int       # lines that are no sealed record, or records that cannot be encoded
    errors: int        # failed connects and sends (each retried)
    restarts: int = 0  # process.ProcessForwarder: children that died and were started again
    # Seconds spent with a full send window, waiting for the receiver's ACKs: while this grows as fast as
    # time passes, the receiver (or the network to it) sets the pace, not the forwarder.
    receiver_wait_s: float = 0.0
