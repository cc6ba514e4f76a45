"""Packets each logged rule's flows matched, as an independent client (ovs-ofctl) reads them from OVS, and a
policy of two logged Drop rules to flood."""

from __future__ import annotations

import re
import textwrap

from tests.support.cluster import Cluster

# Namespaces one, two, target with Pods a, b, t; one policy whose two logged Drop rules take UDP 53 from
# namespace one and UDP 54 from namespace two into target.
TWO_LOGGED_DROPS = "---\n".join(
    [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    kubernetes.io/metadata.name: {ns}\n"
     for ns in ("one", "two", "target")]
    + [f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    pod: {name}\n"
       for ns, name in (("one", "a"), ("two", "b"), ("target", "t"))]
) + textwrap.dedent("""
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: rule-losses}
    spec:
      tier: securityops
      priority: 3
      appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: target}}}]
      ingress:
      - name: drop-from-one
        action: Drop
        enableLogging: true
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: one}}}]
        ports: [{protocol: UDP, port: 53}]
      - name: drop-from-two
        action: Drop
        enableLogging: true
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: two}}}]
        ports: [{protocol: UDP, port: 54}]
""")
RULES = ("drop-from-one", "drop-from-two")

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
