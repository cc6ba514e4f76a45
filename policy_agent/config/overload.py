"""Configuration of fair admission (packetin.fair_share) and of the audit overload mode (audit.overload)."""

from __future__ import annotations

from dataclasses import dataclass, field
from policy_agent.config.checks import bounded, fraction, positive


@dataclass(frozen=True)
class FairShareConfig:
    # Fair admission in the policy category between (rule, applied-to Pod) keys: each key has
    # its own token bucket under the category's (packetin.policy); a key past its share only
    # borrows while the category holds more than half its burst, so one flooding key cannot
    # starve the others. Drops: npaudit_packetin_total{outcome="dropped_fair_share"}.
    enabled: bool = True
    key_rate: float = field(default=100.0, metadata={"check": positive})  # packet-ins/s assured per key
    key_burst: float = field(default=200.0, metadata={"check": lambda v: None if v >= 1 else f"must be >= 1, got {v}"})
    # Keys tracked at once (LRU; evictions counted), at most 10000000.
    max_keys: int = field(default=65536, metadata={"check": bounded(1, 10_000_000)})


@dataclass(frozen=True)
class OverloadConfig:
    # Above high_mark (fill of the policy packet-in queue or of the writer queue, 0..1) the
    # audit pipeline aggregates with a coarser key, ports dropped (then peers, above
    # peers_mark) and writes fewer, wider records marked npaudit.aggregate.coarsened; full
    # detail again below low_mark. OpenFlow reads of 512+ packet-ins one after another for 0.1 s,
    # each leaving the TCP socket at least half full (input pressure), count as high_mark for
    # 0.5 s while the policy category's admission turns nothing away (packetin/reader.py
    # InputPressure). Every packet is still counted.
    enabled: bool = True
    # Marks are fills of the queues, not rates: a backlog the agent works off (a catch-up after
    # time off the CPU on a busy node) stays below high_mark; one that keeps growing passes it.
    high_mark: float = field(default=0.25, metadata={"check": fraction})
    peers_mark: float = field(default=0.5, metadata={"check": fraction})
    low_mark: float = field(default=0.05, metadata={"check": fraction})

    def problems(self) -> list[str]:
        if not self.low_mark < self.high_mark <= self.peers_mark:
            return [f"audit.overload: needs low_mark < high_mark <= peers_mark, got {self.low_mark}, "
                    f"{self.high_mark}, {self.peers_mark}"]
        return []
