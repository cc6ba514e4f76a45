"""The batches a forwarder has sent on one connection and not yet seen acknowledged: a bounded window, oldest first.

Pure bookkeeping, no I/O: the forwarder tells it what it sent and how many of
the bytes sent on the connection are still unacknowledged (the sender's
`unacked()`); it answers which batches are now wholly delivered. A batch counts
as delivered only once every byte of it is acknowledged, and batches are
delivered strictly in send order, so the checkpoint taken from the newest
delivered batch never names a record the receiver may lack.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from auditlog.syslog.checkpoint import Position

# Defaults, documented in config/npaudit.yaml (syslog.destinations) and policy_agent/config.py.
# Four batches in flight let the forwarder read and encode the next batches while the receiver
# drains the earlier ones (bench/syslog_throughput.py shows the rate); 8 MiB bounds the memory
# held for re-sending and, with the count, the duplicates a dropped connection causes.
WINDOW_BATCHES = 4
WINDOW_BYTES = 8 << 20


@dataclass(frozen=True)
class Batch:
    """Frames ready to send, the records they came from (skipped ones included) and the position after them."""

    frames: tuple[bytes, ...]
    records: int
    end: Position
    size: int  # bytes of the frames

    @classmethod
    def of(cls, frames: list[bytes], records: int, end: Position) -> Batch:
        return cls(tuple(frames), records, end, sum(map(len, frames)))


class SendWindow:
    """At most `max_batches` batches and about `max_bytes` bytes in flight (one batch always fits)."""

    def __init__(self, max_batches: int = WINDOW_BATCHES, max_bytes: int = WINDOW_BYTES) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self._sent = 0  # bytes sent on the current connection
        self.acked_to = 0  # of those, how many are known acknowledged (only grows, per connection)
        self._bytes = 0  # bytes of the batches in flight
        self._flight: deque[tuple[Batch, int]] = deque()  # (batch, connection offset just after it)

    def __len__(self) -> int:
        return len(self._flight)

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def records(self) -> int:
        return sum(batch.records for batch, _ in self._flight)

    def full(self) -> bool:
        """True when no further batch may be sent whatever its size."""
        return len(self._flight) >= self.max_batches

    def has_room(self, size: int) -> bool:
        """Whether a batch of `size` bytes may be sent now; an empty window takes any batch."""
        if not self._flight:
            return True
        return len(self._flight) < self.max_batches and self._bytes + size <= self.max_bytes

    def sent(self, batch: Batch) -> None:
        """Record that `batch` was handed to the connection."""
        self._sent += batch.size
        self._bytes += batch.size
        self._flight.append((batch, self._sent))

    def acked(self, unacked: int) -> list[Batch]:
        """Remove and return, oldest first, the batches whose every byte is acknowledged.

        `unacked`: bytes sent on this connection not known to be acknowledged (an
        upper bound is fine: it only delays delivery). A batch is delivered once
        the bytes sent after it are at least `unacked`.
        """
        self.acked_to = max(self.acked_to, self._sent - unacked)
        out = []
        while self._flight and self._flight[0][1] <= self.acked_to:
            batch, _ = self._flight.popleft()
            self._bytes -= batch.size
            out.append(batch)
        return out

    def reset(self) -> list[Batch]:
        """The connection is gone: return every batch in flight (oldest first) to send again, and start empty."""
        out = [batch for batch, _ in self._flight]
        self._flight.clear()
        self._sent = self._bytes = self.acked_to = 0
        return out
