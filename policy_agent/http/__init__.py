"""The agent's HTTP side: /metrics, /readyz and /healthz on one selector thread, with connection caps and timeouts."""
