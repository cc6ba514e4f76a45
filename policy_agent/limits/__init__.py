"""The agent side of rate limiting: packet-in admission, per-rule meter sync, the eBPF drop-offload cache, losses."""
