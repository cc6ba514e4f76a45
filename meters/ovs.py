"""OVS meters: their ids, how one is specified, what the datapath supports, and which the bridge needs.

Pure values and one pure function; packetin/messages.py encodes a MeterSpec as
an OpenFlow meter_mod and the channel installs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from os_ken.ofproto import ofproto_v1_5 as ofp

# One meter per category and disposition class (DESIGN.md §3), so a drop flood
# starves neither allow records nor traceflow.
METER_POLICY_ALLOW = 1
METER_POLICY_DENY = 2  # Drop, Reject, Pass
METER_TRACEFLOW = 3


@dataclass(frozen=True, slots=True)
class MeterSpec:
    """A packets-per-second drop meter with a burst, one band."""

    meter_id: int
    rate_pps: int
    burst: int = 0
    stats: bool = True

    def describe(self) -> str:
        return f"meter_id={self.meter_id} rate={self.rate_pps}pktps burst={self.burst}"


@dataclass(frozen=True, slots=True)
class MeterSupport:
    """What OFPMP_METER_FEATURES said; `supported` is False on datapaths without meters."""

    max_meter: int
    band_types: int
    max_bands: int

    @property
    def supported(self) -> bool:
        return self.max_meter > 0 and bool(self.band_types & (1 << ofp.OFPMBT_DROP))


# (packet-ins per second, burst) of one meter.
Limit = tuple[int, int]


@dataclass(frozen=True, slots=True)
class MeterLimits:
    """The configured (rate, burst) of each category meter."""

    policy_allow: Limit
    policy_deny: Limit  # Drop, Reject, Pass
    traceflow: Limit


def desired_meters(limits: MeterLimits, supported: bool) -> list[MeterSpec]:
    """The meters the bridge should have for `limits`: none when the datapath has no meters."""
    if not supported:
        return []
    return [MeterSpec(meter_id, rate, burst) for meter_id, (rate, burst) in (
        (METER_POLICY_ALLOW, limits.policy_allow),
        (METER_POLICY_DENY, limits.policy_deny),
        (METER_TRACEFLOW, limits.traceflow),
    )]
