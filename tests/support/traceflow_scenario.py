"""The traceflow scenario's Pods and policies, and a flood against the traceflow meter, shared by
its e2e tests and bench."""

from __future__ import annotations

import subprocess
import textwrap

from tests.support.cluster import Cluster, PodHandle

PODS = (("x", "a"), ("x", "b"), ("y", "b"), ("y", "c"), ("y", "d"))
POLICIES = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: sec-drop-web}
    spec:
      tier: securityops
      priority: 5
      appliedTo: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress:
      - action: Drop
        name: no-web-from-x
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
        ports: [{protocol: TCP, port: 80}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: reject-81}
    spec:
      tier: securityops
      priority: 6
      appliedTo: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress:
      - action: Reject
        name: refuse-81
        enableLogging: true
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
        ports: [{protocol: TCP, port: 81}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: pass-to-k8s}
    spec:
      tier: networkops
      priority: 1
      appliedTo: [{podSelector: {matchLabels: {pod: c}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress:
      - action: Pass
        name: defer-x
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
    ---
    apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: c-from-a, namespace: y}
    spec:
      podSelector: {matchLabels: {pod: c}}
      ingress:
      - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}, podSelector: {matchLabels: {pod: a}}}]
        ports: [{protocol: TCP, port: 80}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: flood-drop}
    spec:
      tier: emergency
      priority: 1
      appliedTo: [{podSelector: {matchLabels: {pod: d}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress:
      - action: Drop
        name: drop-udp-9
        enableLogging: true
        ports: [{protocol: UDP, port: 9}]
""")


def setup(cluster: Cluster) -> dict[str, PodHandle]:
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n"
            f"    kubernetes.io/metadata.name: {ns}\n" for ns in ("x", "y")]
    docs += [f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {p}\n  namespace: {ns}\n  labels:\n    pod: {p}\n"
             for ns, p in PODS]
    cluster.apply("---\n".join(docs))
    pods = {f"{ns}/{p}": cluster.add_pod(ns, p) for ns, p in PODS}
    cluster.apply(POLICIES)
    return pods


FLOOD = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.monotonic() + float(sys.argv[2])
n = 0
while time.monotonic() < end:
    for _ in range(100):
        try:
            s.sendto(b"flood", (sys.argv[1], 9))
        except OSError:
            pass
        n += 1
print(n, flush=True)
"""


def meter_drops(cluster: Cluster, meter_id: int) -> int:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "meter-stats",
                          f"unix:{cluster.dir / 'ovs' / 'br-int.mgmt'}", f"meter={meter_id}"],
                         capture_output=True, text=True).stdout
    # "0: packet_count:N byte_count:M" for the band: packets the band dropped.
    return sum(int(part.split(":")[1]) for line in out.splitlines() if line.strip().startswith("0:")
               for part in line.split() if part.startswith("packet_count:"))
