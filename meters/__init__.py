"""Rate limiting: agent token buckets, OVS meter programming and the eBPF drop offload."""

from meters.ovs import (METER_POLICY_ALLOW, METER_POLICY_DENY, METER_TRACEFLOW, MeterLimits, MeterSpec,
                        MeterSupport, desired_meters)
from meters.errors import InvalidOffloadEntry, MeterError, OffloadError, OffloadUnavailable
from meters.token_bucket import TokenBucket

__all__ = ["METER_POLICY_ALLOW", "METER_POLICY_DENY", "METER_TRACEFLOW", "InvalidOffloadEntry", "MeterError",
           "MeterLimits", "MeterSpec", "MeterSupport", "OffloadError", "OffloadUnavailable", "TokenBucket",
           "desired_meters"]
