"""The agent side of rate limiting: the eBPF drop-offload cache, per-rule meter sync and loss accounting."""
