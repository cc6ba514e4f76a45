"""Tier 3 of the rate limiter: an XDP program on each Pod's host-side veth drops judged floods before OVS."""

from meters.ebpf.loader import Probe, XdpOffload, probe
from meters.ebpf.maps import OffloadCounts, OffloadKey, OffloadRule, icmp_port, rule_until

__all__ = ["OffloadCounts", "OffloadKey", "OffloadRule", "Probe", "XdpOffload", "icmp_port", "probe", "rule_until"]
