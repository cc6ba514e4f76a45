"""Audit aggregation windows: a key's first packet at once, the rest of its window as one exact-count record.

auditlog/_aggregate_fast.c is this Aggregator again in C, line for line (what the agent runs where it is built:
record_fast.aggregator()); a change here is made there too, and tests/unit/auditlog/test_aggregate.py, which runs
both side by side, fails until it is.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, Protocol, TypeAlias

# (rule id, disposition, direction, src, dst, protocol, dst port or ICMP type): the caller
# builds it; the aggregator only hashes and compares it.
AggregateKey: TypeAlias = tuple[Hashable, ...]
Kind: TypeAlias = Literal["first", "aggregate", "immediate"]


class Emission(NamedTuple):
    """One audit record to write: the packets (and eBPF-offloaded drops) it stands for.

    `sample` is the caller's opaque object: the packet's own for "first" and "immediate";
    for "aggregate" the first packet the record covers, else the window's "first" packet,
    else the sample given with the offloaded counts (None when there was none).
    A NamedTuple, not a frozen dataclass: one is made per distinct flow, and it is the
    cheaper of the two to build.
    """

    key: AggregateKey
    sample: object
    packets: int
    bytes: int
    first: float
    last: float
    offloaded_packets: int
    offloaded_bytes: int
    kind: Kind


# tuple.__new__ with all fields in order: skips the NamedTuple's Python-level __new__
# on the per-packet paths.
_new: Callable[..., Emission] = tuple.__new__


@dataclass(frozen=True)
class AggregatorStats:
    """A snapshot of the aggregator's counters and of what its open windows hold."""

    packets_in: int
    records_out: int
    packets_out: int
    offloaded_packets_in: int
    offloaded_packets_out: int
    evicted_early: int
    clock_steps: int
    open_windows: int
    packets_held: int  # in open windows, not yet in any record


class Aggregation(Protocol):
    """What the pipeline and the metrics use of an aggregator: Aggregator below, or the same class in C
    (auditlog/_aggregate_fast.c, which record_fast.aggregator() gives where it is built)."""

    @property
    def window(self) -> float: ...

    @property
    def stats(self) -> dict[str, int]: ...

    def snapshot(self) -> AggregatorStats: ...

    def packets_held(self) -> int: ...

    def offloaded_held(self) -> int: ...

    def next_deadline(self) -> float | None: ...

    def add(self, key: AggregateKey, sample: object, size: int, now: float, aggregate: bool, /) -> list[Emission]: ...

    def add_many(self, key: AggregateKey, sample: object, count: int, size: int, now: float,
                 second: Callable[[], object] | None = None, /) -> list[Emission]: ...

    def add_offloaded(self, key: AggregateKey, packets: int, bytes_: int, now: float,
                      sample: object = None) -> list[Emission]: ...

    def tick(self, now: float, /) -> list[Emission]: ...

    def flush(self, now: float, /) -> list[Emission]: ...


def snapshot(agg: Aggregation) -> AggregatorStats:
    """An aggregator's counters and what its open windows hold, as one value."""
    return AggregatorStats(**agg.stats, packets_held=agg.packets_held())


class _Window:
    """What one key holds between its "first" record and the close of its window."""

    __slots__ = ("key", "deadline", "sample", "announced", "live",
                 "packets", "bytes", "first", "last", "off_packets", "off_bytes")

    def __init__(self, key: AggregateKey, deadline: float, sample: object, announced: bool) -> None:
        self.key = key
        self.deadline = deadline
        self.sample = sample
        self.announced = announced  # a "first" record went out for this window
        self.live = True  # False once closed: the expiry deque drops it lazily
        self.packets = 0
        self.bytes = 0
        self.first = 0.0
        self.last = 0.0
        self.off_packets = 0
        self.off_bytes = 0


class Aggregator:
    """Per-key aggregation windows; every method takes `now` and returns the records to write.

    Invariant: stats["packets_in"] == stats["packets_out"] + packets_held(), at all times.
    `now` should not go backwards; jitter up to one window is clamped, a larger step back
    (wall clock reset) closes every open window at once so none waits for the clock to
    catch up.
    """

    def __init__(self, window: float = 1.0, max_keys: int = 100_000) -> None:
        if not (window >= 0 and math.isfinite(window)):
            raise ValueError(f"aggregation window must be a finite number of seconds >= 0, got {window!r}")
        if max_keys < 1:
            raise ValueError(f"aggregation max_keys must be >= 1, got {max_keys!r}")
        self._window = float(window)
        self._max_keys = max_keys
        self._open: dict[AggregateKey, _Window] = {}
        # Every window has the same length and times are clamped to never decrease, so
        # insertion order is deadline order: a deque beats a heap (O(1), no tuples).
        self._expiry: deque[_Window] = deque()
        self._latest = -math.inf
        self._held = 0
        self._off_held = 0
        # Plain attributes rather than a dict on the per-packet path; `stats` snapshots them.
        self._packets_in = 0
        self._packets_out = 0
        self._records_out = 0
        self._off_in = 0
        self._off_out = 0
        self._evicted = 0
        self._clock_steps = 0

    @property
    def window(self) -> float:
        return self._window

    @property
    def stats(self) -> dict[str, int]:
        return {
            "packets_in": self._packets_in,
            "records_out": self._records_out,
            "packets_out": self._packets_out,
            "offloaded_packets_in": self._off_in,
            "offloaded_packets_out": self._off_out,
            "evicted_early": self._evicted,
            "clock_steps": self._clock_steps,
            "open_windows": len(self._open),
        }

    def snapshot(self) -> AggregatorStats:
        return snapshot(self)

    def packets_held(self) -> int:
        """OVS packets accumulated in open windows, not yet in any record."""
        return self._held

    def offloaded_held(self) -> int:
        """eBPF-offloaded packets folded into open windows, not yet in any record."""
        return self._off_held

    def next_deadline(self) -> float | None:
        """When the soonest open window closes (call `tick` then), or None if none is open."""
        q = self._expiry
        while q and not q[0].live:
            q.popleft()
        return q[0].deadline if q else None

    def add(self, key: AggregateKey, sample: object, size: int, now: float, aggregate: bool) -> list[Emission]:
        """Account one admitted packet-in; aggregate=False (Allow) is written at once, never held."""
        self._packets_in += 1
        if not aggregate or not self._window:
            self._records_out += 1
            self._packets_out += 1
            return [_new(Emission, (key, sample, 1, size, now, now, 0, 0, "immediate"))]
        if now >= self._latest:
            self._latest = now
            out: list[Emission] = []
        else:
            now, out = self._stepped_back(now)
        w = self._open.get(key)
        if w is not None and now < w.deadline:
            if w.announced:
                # The hot path under a flood: fold in place, allocate nothing but `out`.
                if w.packets:
                    w.packets += 1
                    w.bytes += size
                else:
                    if not w.off_packets:
                        w.first = now
                    w.sample = sample
                    w.packets = 1
                    w.bytes = size
                w.last = now
                self._held += 1
                return out
            # Opened by offloaded counts only: no record named this key yet, and nothing
            # is to wait a window (DESIGN §5), so this packet is a "first" too.
            w.announced = True
            w.sample = sample
        else:
            if w is not None:
                self._close(w, out)
            self._open_window(key, sample, now, True, out)
        self._records_out += 1
        self._packets_out += 1
        out.append(_new(Emission, (key, sample, 1, size, now, now, 0, 0, "first")))
        return out

    def add_many(self, key: AggregateKey, sample: object, count: int, size: int, now: float,
                 second: Callable[[], object] | None = None) -> list[Emission]:
        """Account `count` packet-ins of `size` bytes each, all at `now`, aggregated: what `count`
        calls add(key, sample_i, size, now, True) give, `sample` standing for the first and for
        the others but when the first opens the key's window: then `second()` (the second
        packet-in's sample) is the window's sample, as it would be one by one."""
        out = self.add(key, sample, size, now, True)
        rest = count - 1
        if rest <= 0:
            return out
        if not self._window:
            for _ in range(rest):
                out += self.add(key, sample, size, now, True)
            return out
        # add() left the key's window open and announced, at the time it used (now, clamped).
        at = self._latest
        w = self._open[key]
        if w.packets:
            w.packets += rest
            w.bytes += size * rest
        else:
            if not w.off_packets:
                w.first = at
            w.sample = second() if second is not None and out and out[-1].key is key and out[-1].kind == "first" \
                else sample
            w.packets = rest
            w.bytes = size * rest
        w.last = at
        self._packets_in += rest
        self._held += rest
        return out

    def add_offloaded(self, key: AggregateKey, packets: int, bytes_: int, now: float,
                      sample: object = None) -> list[Emission]:
        """Fold drops the eBPF offload counted (never seen by OVS) into the key's window.

        `sample` (optional) stands for the key when no OVS packet of the window does,
        so that the caller can still build the record.
        """
        if packets < 0 or bytes_ < 0:
            raise ValueError(f"offloaded counts must be >= 0, got packets={packets} bytes={bytes_} for {key!r}")
        if not packets:
            return []  # a map counter that did not move
        self._off_in += packets
        if not self._window:
            self._records_out += 1
            self._off_out += packets
            return [Emission(key, sample, 0, 0, now, now, packets, bytes_, "aggregate")]
        if now >= self._latest:
            self._latest = now
            out: list[Emission] = []
        else:
            now, out = self._stepped_back(now)
        w = self._open.get(key)
        if w is None or now >= w.deadline:
            if w is not None:
                self._close(w, out)
            w = self._open_window(key, sample, now, False, out)
        if not (w.packets or w.off_packets):
            w.first = now
        if w.sample is None:
            w.sample = sample
        w.off_packets += packets
        w.off_bytes += bytes_
        w.last = now
        self._off_held += packets
        return out

    def tick(self, now: float) -> list[Emission]:
        """Close every window whose end is <= now; one "aggregate" per window that holds anything."""
        if now >= self._latest:
            self._latest = now
            out: list[Emission] = []
        else:
            now, out = self._stepped_back(now)
        self._expire(now, out)
        return out

    def flush(self, now: float) -> list[Emission]:
        """Close every window now (shutdown): afterwards nothing is held."""
        out = self.tick(now)
        self._close_all(out)
        return out

    # --- internals ---------------------------------------------------------------------

    def _open_window(self, key: AggregateKey, sample: object, now: float, announced: bool,
                     out: list[Emission]) -> _Window:
        # Close what is due first, so that eviction only ever takes a window that is
        # genuinely still open and memory stays bounded even if the caller ticks late.
        # (_expire, inline: with a new key every packet-in this runs per packet-in, and
        # most windows it closes saw only their "first" packet: they close silently.)
        q, open_ = self._expiry, self._open
        while q:
            due = q[0]
            if due.live and due.deadline > now:
                break
            q.popleft()
            if due.live:
                if due.packets or due.off_packets:
                    self._close(due, out)
                else:
                    due.live = False
                    del open_[due.key]
        if len(open_) >= self._max_keys:
            while not q[0].live:
                q.popleft()
            # Evict the window that closes soonest: its record goes out early, never lost.
            self._evicted += 1
            self._close(q.popleft(), out)
        w = _Window(key, now + self._window, sample if announced else None, announced)
        open_[key] = w
        q.append(w)
        return w

    def _expire(self, now: float, out: list[Emission]) -> None:
        q = self._expiry
        while q:
            w = q[0]
            if w.live and w.deadline > now:
                return
            q.popleft()
            if w.live:
                self._close(w, out)

    def _close(self, w: _Window, out: list[Emission]) -> None:
        w.live = False
        del self._open[w.key]
        if not (w.packets or w.off_packets):
            return  # an empty window closes silently; the key's next packet is a "first" again
        self._held -= w.packets
        self._off_held -= w.off_packets
        self._packets_out += w.packets
        self._off_out += w.off_packets
        self._records_out += 1
        out.append(Emission(w.key, w.sample, w.packets, w.bytes, w.first, w.last,
                            w.off_packets, w.off_bytes, "aggregate"))

    def _close_all(self, out: list[Emission]) -> None:
        q = self._expiry
        while q:
            w = q.popleft()
            if w.live:
                self._close(w, out)

    def _stepped_back(self, now: float) -> tuple[float, list[Emission]]:
        """The time to use when `now` is earlier than one already seen, and what that closes."""
        if math.isnan(now):
            raise ValueError("aggregation time is NaN")
        if self._latest - now <= self._window:
            # Jitter between the clocks that stamp packets and drive ticks: clamp, so that
            # deadlines stay ordered and no record's times run backwards.
            return self._latest, []
        # The wall clock was reset: windows of the old timeline would otherwise stay
        # open until it caught up (possibly hours), so write them all now.
        out: list[Emission] = []
        self._close_all(out)
        self._clock_steps += 1
        self._latest = now
        return now, out
