"""The node agent: the composition root (agent.py) and its homes (config, cli, policy, ovs, sources, cni,
traceflow, limits, bundle)."""
