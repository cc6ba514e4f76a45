"""Packets each logged rule's flows matched, as an independent client (ovs-ofctl) reads them from OVS."""

from __future__ import annotations

import re

from tests.support.cluster import Cluster

_USERDATA = re.compile(r"userdata=([0-9a-f.]+)")
_PACKETS = re.compile(r"n_packets=(\d+)")


def logged_rule_flow_packets(cluster: Cluster) -> dict[int, int]:
    """{rule id: n_packets summed over its flows}: flows whose controller action carries our userdata
    (version, category 0, flags with LOG, 32-bit rule id; DESIGN.md §3)."""
    out: dict[int, int] = {}
    for line in cluster.flows():
        ud, packets = _USERDATA.search(line), _PACKETS.search(line)
        if ud is None or packets is None:
            continue
        raw = bytes.fromhex(ud.group(1).replace(".", ""))
        if len(raw) < 7 or raw[1] != 0 or not raw[2] & 0x01:
            continue
        rule_id = int.from_bytes(raw[3:7], "big")
        out[rule_id] = out.get(rule_id, 0) + int(packets.group(1))
    return out
