"""The audit writer's counters and the snapshot it gives of them (auditlog.writer re-exports these)."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["LOSS_KEYS", "STAT_KEYS", "WriterEvents", "WriterStats"]


@dataclass(frozen=True)
class WriterEvents:
    """The writer's counters, in the order they are exported."""

    written: int
    batches: int
    bytes: int
    dropped_queue_full: int
    dropped_closed: int
    rotations: int
    pruned: int
    unencodable: int
    write_errors: int
    lost_write_error: int
    chain_restarts: int
    strayed_moved: int  # written to a live file another program moved away (out of the set, kept there)
    strayed_removed: int  # written to a live file another program removed: lost with it
    inline_backoffs: int  # inline writes slower than INLINE_SLOW: the thread then wrote for INLINE_BACKOFF
    compressed: int  # these two: the compressor's
    compress_errors: int


@dataclass(frozen=True)
class WriterStats:
    """A snapshot of the writer: its counters, its queue depth and the seq of the newest sealed record."""

    events: WriterEvents
    queued: int
    seq: int

    def lost(self) -> dict[str, int]:
        """Records given to the writer that never reached the file, by reason (reasons with a count only)."""
        return {key: n for key in LOSS_KEYS if (n := getattr(self.events, key))}


STAT_KEYS = tuple(f.name for f in fields(WriterEvents))
# The counters of records that were submitted (or offered) and are not in the file.
LOSS_KEYS = ("dropped_queue_full", "dropped_closed", "lost_write_error", "unencodable", "strayed_removed")
