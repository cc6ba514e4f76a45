"""Helpers shared by tests and benches (real OVS bridges, Pods in network namespaces)."""
