"""The `offload:` config section: the eBPF drop offload (DESIGN.md §4, tier 3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from policy_agent.config.checks import bounded, optional_file

# meters/ebpf/maps.py bounds what the program's bucket arithmetic takes.
_MAX_RATE = 1_000_000


def _seconds(low: float, high: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if low < v <= high else f"must be > {low:g} and <= {high:g} seconds, got {v}"
    return check


@dataclass(frozen=True)
class OffloadConfig:
    # Load the XDP program (bcc: kernel headers, CAP_BPF/CAP_SYS_ADMIN) and attach it to every
    # Pod's host-side veth. If it cannot load, the agent says so once (warning, metric
    # npaudit_ebpf_offload_active 0) and runs on meters and token buckets. Off by default:
    # compiling the program takes seconds at start.
    enabled: bool = False
    # A logged Drop flow (ingress veth, source, destination, protocol, port or ICMP type/code)
    # whose packet-ins reach this many per second is cached: XDP drops it before OVS.
    threshold_pps: int = field(default=100, metadata={"check": bounded(1, _MAX_RATE)})
    # What a cached flow still sends on to OVS (token bucket, packets per second and burst),
    # so OVS keeps deciding and the log keeps real samples. The rest is counted, not seen.
    rate_pps: int = field(default=10, metadata={"check": bounded(0, _MAX_RATE)})
    burst: int = field(default=10, metadata={"check": bounded(0, _MAX_RATE)})
    # Seconds an entry lives without being refreshed by a sampled packet-in of its flow.
    ttl_s: float = field(default=5.0, metadata={"check": _seconds(0.0, 3600.0)})
    # Seconds between reads of the program's counters (folded into the audit records).
    read_interval: float = field(default=1.0, metadata={"check": _seconds(0.0, 60.0)})
    # Entries in the program's maps (and the agent's mirror of them).
    max_entries: int = field(default=16384, metadata={"check": bounded(16, 1 << 20)})
    # native (driver) or generic XDP on the veths.
    mode: str = field(default="native", metadata={"check": lambda v: None if v in ("native", "generic")
                                                   else f"must be one of native, generic; got {v!r}"})
    # The program's C source ("" = the one shipped in meters/ebpf/xdp_offload.c).
    source: str = field(default="", metadata={"check": optional_file})
