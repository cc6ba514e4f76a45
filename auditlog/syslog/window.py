"""The batches a forwarder has sent on one connection and not yet seen consumed: a bounded window, oldest first.

Pure bookkeeping, no I/O: the forwarder tells it what it sent and how many of
the bytes sent on the connection are still unacknowledged (the sender's
`unacked()`); it answers which batches are now acknowledged and which are
confirmed. TCP's acknowledgement is not delivery: the receiver's kernel
acknowledges bytes its process has not read yet, and drops them if the
process closes the connection (or stops) first. So an acknowledged batch stays
"at risk" until at least `unread_bytes` (a bound on what the receiver's
receive buffer holds unread) were acknowledged after it: only then has the
receiver's process surely read it, and only then is it confirmed. Batches are
confirmed strictly in send order, so the checkpoint taken from the newest
confirmed batch never names a record the receiver may lack.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from auditlog.syslog.checkpoint import Position

# Defaults, documented in config/npaudit.yaml (syslog.destinations) and policy_agent/config/loader.py.
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
    """At most `max_batches` batches and about `max_bytes` bytes in flight (one batch always fits), and the
    acknowledged batches still at risk (about `unread_bytes` of them; not counted against the window)."""

    def __init__(self, max_batches: int = WINDOW_BATCHES, max_bytes: int = WINDOW_BYTES,
                 unread_bytes: int = 0) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.unread_bytes = unread_bytes
        self._sent = 0  # bytes sent on the current connection
        self.acked_to = 0  # of those, how many are known acknowledged (only grows, per connection)
        self._bytes = 0  # bytes of the batches in flight
        self._flight: deque[tuple[Batch, int]] = deque()  # (batch, connection offset just after it)
        # Acknowledged, maybe unread: (batch without its frames, offset just after it, its frame count).
        # A drop re-reads them from the files, so they cost no memory for their frames.
        self._risk: deque[tuple[Batch, int, int]] = deque()

    def __len__(self) -> int:
        return len(self._flight)

    @property
    def holding(self) -> bool:
        """Whether any batch is in flight or at risk (not confirmed yet)."""
        return bool(self._flight or self._risk)

    @property
    def at_risk_frames(self) -> int:
        """Frames of the acknowledged batches not confirmed yet."""
        return sum(frames for _, _, frames in self._risk)

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
        """Return, oldest first, the batches whose every byte is now acknowledged; they move from the window to
        the batches at risk.

        `unacked`: bytes sent on this connection not known to be acknowledged (an
        upper bound is fine: it only delays delivery). A batch is acknowledged once
        the bytes sent after it are at least `unacked`.
        """
        self.acked_to = max(self.acked_to, self._sent - unacked)
        out = []
        while self._flight and self._flight[0][1] <= self.acked_to:
            batch, offset = self._flight.popleft()
            self._bytes -= batch.size
            self._risk.append((Batch((), batch.records, batch.end, batch.size), offset, len(batch.frames)))
            out.append(batch)
        return out

    def confirmed(self) -> list[Batch]:
        """Remove and return, oldest first, the batches at risk that at least `unread_bytes` acknowledged bytes
        follow: the receiver's process has read them (returned without their frames)."""
        out = []
        while self._risk and self._risk[0][1] <= self.acked_to - self.unread_bytes:
            out.append(self._risk.popleft()[0])
        return out

    def confirm_all(self) -> list[Batch]:
        """The receiver read everything sent (it closed the connection after our end of stream): remove and
        return every batch, oldest first."""
        out = [batch for batch, _, _ in self._risk] + [batch for batch, _ in self._flight]
        self.reset()
        return out

    def reset(self) -> None:
        """The connection is gone: forget every batch (the caller reads them again from the last confirmed one)."""
        self._flight.clear()
        self._risk.clear()
        self._sent = self._bytes = self.acked_to = 0
