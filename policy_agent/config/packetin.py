"""The `packetin:` and `meters:` config sections: admission of packet-ins in the agent and in OVS."""

from __future__ import annotations

from dataclasses import dataclass, field

from policy_agent.config.checks import QUEUE_MAX, U32_MAX, bounded, checked, optional_file, positive
from policy_agent.config.overload import FairShareConfig


@dataclass(frozen=True)
class CategoryLimits:
    # Token bucket: packet-ins admitted per second and burst size.
    rate: float = field(default=20000.0, metadata=checked(positive))
    burst: float = field(default=40000.0, metadata=checked(positive))
    # Bounded channel between the reader and the subscriber; full = drop and count. At most 10,000,000.
    queue_size: int = field(default=65536, metadata=checked(bounded(1, QUEUE_MAX)))


@dataclass(frozen=True)
class PacketInConfig:
    # Category 0, policy audit. Generous: OVS meters are the first limit.
    policy: CategoryLimits = CategoryLimits()
    # Category 1, traceflow: at most 9 copies per trace (npaudit trace); 500/s is ~50 traces/s.
    traceflow: CategoryLimits = CategoryLimits(rate=500.0, burst=500.0, queue_size=1024)
    fair_share: FairShareConfig = FairShareConfig()  # within the policy category (config/overload.py)
    # Debug tap: write one JSON line per delivered packet-in to this path
    # ("-" = stdout, "" = off; else an absolute path). Not the audit log.
    tap: str = field(default="", metadata=checked(lambda v: None if v == "-" else optional_file(v)))


@dataclass(frozen=True)
class MeterLimit:
    # OVS meter: packet-ins per second and burst, enforced in the datapath (32-bit in OVS).
    rate: int = field(default=1000, metadata=checked(bounded(1, U32_MAX)))
    burst: int = field(default=200, metadata=checked(bounded(0, U32_MAX)))


@dataclass(frozen=True)
class PerRuleMeters:
    # OVN's fair=true: every rule that sends to the agent (logged, or Reject) gets an OVS meter
    # of its own, with its class's rate and burst (policy_allow or policy_deny), from the ids
    # id_base .. id_base + max - 1, so a flood on one rule cannot use up another rule's
    # budget. When every id is in use, further rules share their class meter (warned;
    # npaudit_meter_per_rule_shared_rules). Off by default.
    enabled: bool = False
    id_base: int = field(default=4096, metadata=checked(bounded(4, 0x7FFFFFFF)))  # above the class meters 1..3
    max: int = field(default=1024, metadata=checked(bounded(1, 262144)))


@dataclass(frozen=True)
class MetersConfig:
    # One meter per category and disposition class: a drop flood starves
    # neither allow records nor traceflow (DESIGN.md §3).
    policy_allow: MeterLimit = MeterLimit()
    policy_deny: MeterLimit = MeterLimit()  # Drop, Reject, Pass
    traceflow: MeterLimit = MeterLimit(rate=500, burst=200)  # at most 9 copies per trace
    # Seconds between reads of the meters' drop counts (npaudit_meter_dropped_*); each read
    # ends a window whose losses (meter, OVS queue, admission, writer; a port's and the datapath's
    # drops before the pipeline; per logged rule, from its flow counts) go into a loss record.
    stats_interval: float = field(default=5.0, metadata=checked(bounded(0.1, 3600)))
    per_rule: PerRuleMeters = PerRuleMeters()
