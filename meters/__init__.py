"""Rate limiting: agent token buckets, OVS meter programming and the eBPF drop offload."""

from meters.token_bucket import TokenBucket

__all__ = ["TokenBucket"]
