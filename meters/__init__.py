"""Rate limiting: agent token buckets, OVS meter programming and the eBPF drop offload.

The names below load on first use (PEP 562): importing meters.token_bucket or meters.stats must not
import os-ken (meters.ovs) with it (bench/cli_startup.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meters.errors import InvalidOffloadEntry, MeterError, OffloadError, OffloadUnavailable
    from meters.ovs import (METER_POLICY_ALLOW, METER_POLICY_DENY, METER_TRACEFLOW, MeterLimits, MeterSpec,
                            MeterSupport, desired_meters)
    from meters.token_bucket import TokenBucket

_HOMES = {
    **dict.fromkeys(("METER_POLICY_ALLOW", "METER_POLICY_DENY", "METER_TRACEFLOW", "MeterLimits", "MeterSpec",
                     "MeterSupport", "desired_meters"), "meters.ovs"),
    **dict.fromkeys(("InvalidOffloadEntry", "MeterError", "OffloadError", "OffloadUnavailable"), "meters.errors"),
    "TokenBucket": "meters.token_bucket",
}

__all__ = ["InvalidOffloadEntry", "METER_POLICY_ALLOW", "METER_POLICY_DENY", "METER_TRACEFLOW", "MeterError",
           "MeterLimits", "MeterSpec", "MeterSupport", "OffloadError", "OffloadUnavailable", "TokenBucket",
           "desired_meters"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    module: Any
    # One import statement per home (tests/unit/project/test_layers.py reads import statements).
    if home == "meters.ovs":
        from meters import ovs as module
    elif home == "meters.errors":
        from meters import errors as module
    elif home == "meters.token_bucket":
        from meters import token_bucket as module
    else:
        raise AttributeError(f"module 'meters' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
