"""Policy verdicts and packet-in -> record latency of the records the writer has written, per batch.

The writer calls `VerdictTally.written` once per chunk it has appended to the
audit file (under its I/O lock, so calls never overlap), with the records of
that chunk and the time it finished. Nothing runs per packet-in: the counts are
of records, the same records `npaudit stats` counts by disposition, and only
records that reached the file are counted.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter
from typing import Iterable, Protocol

__all__ = ["LATENCY_BUCKETS", "LatencySnapshot", "VerdictTally"]

_FACTS = attrgetter("verdict", "received")

# Upper bounds (s) of the latency histogram: 0.1 ms .. 1 s, about three per decade (+Inf implied).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class WrittenRecord(Protocol):
    """What the tally reads of a written record (auditlog.chain.RecordText)."""

    verdict: tuple[str, str, str] | None
    received: float


@dataclass(frozen=True)
class LatencySnapshot:
    """Cumulative bucket counts (one per LATENCY_BUCKETS bound, then +Inf), the sum (s) and the count."""

    buckets: tuple[int, ...]
    sum: float
    count: int


class VerdictTally:
    """Records written, by (disposition, direction, tier); latency of those written at once."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[str, str, str], int] = {}
        self._bucket_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self._sum = 0.0

    def written(self, records: Iterable[WrittenRecord], now: float) -> None:
        """Count `records`, appended to the file at `now` (wall clock, as packet-ins' received_at)."""
        # A batch's records share few (verdict, received) pairs: the records of one read were received
        # at one time, and a flood is one verdict. Count the pairs in C, then work per distinct pair.
        try:
            pairs = Counter(map(_FACTS, records))
        except AttributeError:  # a record type without these facts (a caller's own) is simply not counted
            pairs = Counter((getattr(r, "verdict", None), getattr(r, "received", 0.0)) for r in records)
        verdicts, buckets = self._verdicts, self._bucket_counts
        total = 0.0
        for (verdict, received), n in pairs.items():
            if verdict is None:  # the writer's own records (chain restart, losses): no verdict
                continue
            verdicts[verdict] = verdicts.get(verdict, 0) + n
            if received:
                # A clock step back would make it negative: counted in the first bucket, summed as 0.
                latency = max(0.0, now - received)
                buckets[bisect_left(LATENCY_BUCKETS, latency)] += n
                total += latency * n
        self._sum += total

    def verdicts(self) -> dict[tuple[str, str, str], int]:
        """(disposition, direction, tier) -> records written; "" where a record has no direction or tier."""
        return dict(self._verdicts)

    def latency(self) -> LatencySnapshot:
        counts = list(self._bucket_counts)
        cumulative, running = [], 0
        for n in counts:
            running += n
            cumulative.append(running)
        return LatencySnapshot(tuple(cumulative), self._sum, running)
