"""OVS meter band statistics turned into counters that never go backwards.

OVS keeps a meter's band counts only while the meter exists: an ovs-vswitchd
restart (or a meter deleted and added again) starts them from zero. The
agent's totals keep growing across that: a reading below the previous one, or a
meter younger than the previous reading, counts from zero again. Drops between
the last reading before a reset and the reset itself are not knowable and are
not counted. Pure logic: the caller passes each reading and its time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meters.ovs import METER_POLICY_ALLOW, METER_POLICY_DENY, METER_TRACEFLOW

# The `meter` label of npaudit_meter_dropped_*_total and the name loss records use.
METER_NAMES = {METER_POLICY_ALLOW: "policy_allow", METER_POLICY_DENY: "policy_deny", METER_TRACEFLOW: "traceflow"}
# The packet-in category each meter limits (packetin.model.Category names, lower case).
METER_CATEGORIES = {METER_POLICY_ALLOW: "policy", METER_POLICY_DENY: "policy", METER_TRACEFLOW: "traceflow"}


def meter_name(meter_id: int) -> str:
    return METER_NAMES.get(meter_id, str(meter_id))


@dataclass(frozen=True, slots=True)
class MeterReading:
    """One meter in an OFPMP_METER reply: what its bands dropped since the meter was created."""

    meter_id: int
    dropped_packets: int  # summed over the meter's bands
    dropped_bytes: int
    age: float  # seconds since OVS created the meter (duration_sec + duration_nsec)


@dataclass(frozen=True, slots=True)
class Dropped:
    packets: int = 0
    bytes: int = 0


class _Counter:
    """One meter: the last raw reading, and the total accumulated over resets."""

    __slots__ = ("packets", "bytes", "raw_packets", "raw_bytes", "created")

    def __init__(self) -> None:
        self.packets = self.bytes = self.raw_packets = self.raw_bytes = 0
        self.created = float("-inf")


class MeterTotals:
    """Dropped packets and bytes per meter since `started` (a monotonic time), across meter resets.

    A meter first seen that OVS created before `started` (a restarted agent on a
    running OVS) is taken as the baseline: its earlier drops are not this
    agent's to count. One created after `started` counts from zero.

    `fold` (per reading) names the meter a reading's drops count under: per-rule fair
    meters (meters/rule_meters.py) fold into their class meter, so the totals keep one
    entry per class however many rules there are; None ignores the reading (a meter
    that is not the agent's). Resets are still told apart per meter id.
    """

    def __init__(self, started: float) -> None:
        self._started = started
        self._meters: dict[int, _Counter] = {}
        self._totals: dict[int, list[int]] = {}  # folded meter id -> [packets, bytes]
        self.resets = 0

    def update(self, readings: list[MeterReading], now: float,
               fold: Callable[[int], int | None] = lambda meter_id: meter_id) -> None:
        """Fold in the readings of one reply taken at monotonic time `now`."""
        for r in readings:
            into = fold(r.meter_id)
            if into is None:
                continue
            total = self._totals.setdefault(into, [0, 0])
            created = now - r.age
            c = self._meters.get(r.meter_id)
            if c is None:
                c = self._meters[r.meter_id] = _Counter()
                if created < self._started:  # drops from before this agent: the baseline
                    c.raw_packets, c.raw_bytes, c.created = r.dropped_packets, r.dropped_bytes, created
                    continue
            # A meter made after the previous reading (its age says so) or counts that went down: a reset.
            # 0.5 s of slack: age and `now` come from two clocks read a little apart.
            elif created > c.created + 0.5 or r.dropped_packets < c.raw_packets or r.dropped_bytes < c.raw_bytes:
                c.raw_packets = c.raw_bytes = 0
                self.resets += 1
            c.packets += r.dropped_packets - c.raw_packets
            c.bytes += r.dropped_bytes - c.raw_bytes
            total[0] += r.dropped_packets - c.raw_packets
            total[1] += r.dropped_bytes - c.raw_bytes
            c.raw_packets, c.raw_bytes, c.created = r.dropped_packets, r.dropped_bytes, created

    def packets_by_meter(self) -> dict[int, int]:
        """Per meter id, before folding: its dropped packets counted so far (a baseline meter from 0)."""
        return {meter_id: c.packets for meter_id, c in self._meters.items()}

    def totals(self) -> dict[int, Dropped]:
        """Per (folded) meter id: dropped packets and bytes counted so far."""
        return {meter_id: Dropped(*t) for meter_id, t in sorted(self._totals.items())}
