"""Namespaces, Pods, policies and probes that several end-to-end scenarios (and benches) share."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

from policy_agent.ovs.pids import read_pid
from tests.support.cluster import Cluster, PodHandle

NAMESPACES = ("x", "y", "z")
PODS = ("a", "b", "c")


def namespaces_and_pods(logging_ns: str = "z") -> str:
    docs = []
    for ns in NAMESPACES:
        ann = "\n  annotations:\n    networkpolicy.antrea.io/enable-logging: \"true\"" if ns == logging_ns else ""
        docs.append(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n"
                    f"    kubernetes.io/metadata.name: {ns}{ann}\n")
        for pod in PODS:
            docs.append(f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: {ns}\n"
                        f"  labels:\n    pod: {pod}\n")
    return "---\n".join(docs)


def matrix_policies(yb_ip: str, pod_cidr: str) -> str:
    """The policies of the x/y/z x a/b/c reachability matrix: tiers, Pass, Reject, Kubernetes
    NetworkPolicies and an ipBlock over `pod_cidr` (every Pod's range) except y/b (`yb_ip`)."""
    return textwrap.dedent(f"""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {{name: sec-drop-web}}
    spec:
      tier: securityops
      priority: 5
      appliedTo: [{{podSelector: {{matchLabels: {{pod: a}}}}, namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
      egress:
      - action: Drop
        name: no-web-to-y
        enableLogging: true
        logLabel: sec-web
        to: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: y}}}}}}]
        ports: [{{protocol: TCP, port: 80}}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {{name: reject-81}}
    spec:
      tier: securityops
      priority: 6
      appliedTo: [{{podSelector: {{matchLabels: {{pod: c}}}}}}]
      ingress:
      - action: Reject
        from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: y}}}}}}]
        ports: [{{protocol: TCP, port: 81}}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {{name: pass-then-baseline}}
    spec:
      tier: networkops
      priority: 1
      appliedTo: [{{podSelector: {{matchLabels: {{pod: b}}}}, namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
      ingress:
      - action: Pass
        from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: z}}}}}}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {{name: app-drop-z-to-xb}}
    spec:
      tier: application
      priority: 1
      appliedTo: [{{podSelector: {{matchLabels: {{pod: b}}}}, namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
      ingress:
      - action: Drop
        from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: z}}}}}}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {{name: baseline-drop-z-udp}}
    spec:
      tier: baseline
      priority: 1
      appliedTo: [{{podSelector: {{matchLabels: {{pod: b}}}}, namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
      ingress:
      - action: Drop
        from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: z}}}}}}]
        ports: [{{protocol: UDP, port: 53}}]
    ---
    apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {{name: z-a-from-x-only, namespace: z}}
    spec:
      podSelector: {{matchLabels: {{pod: a}}}}
      ingress:
      - from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
    ---
    apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {{name: y-c-egress-cidr, namespace: y}}
    spec:
      podSelector: {{matchLabels: {{pod: c}}}}
      policyTypes: [Egress]
      egress:
      - to: [{{ipBlock: {{cidr: {pod_cidr}, except: ["{yb_ip}/32"]}}}}]
    """)


def matrix_expect(src: str, dst: str, port: str) -> str:
    """What `src` (ns/pod) sees at `dst` on "port/proto" under matrix_policies."""
    sns, sp = src.split("/")
    dns, dp = dst.split("/")
    if src == "x/a" and dns == "y" and port == "80/tcp":
        return "timeout"  # securityops Drop
    if dp == "c" and sns == "y" and port == "81/tcp":
        return "refused"  # securityops Reject: a RST from the agent
    if dst == "x/b" and sns == "z" and port == "53/udp":
        return "timeout"  # Pass skipped the application Drop; the baseline drops UDP 53
    if dst == "z/a" and sns != "x":
        return "timeout"  # K8s isolation: only x may reach z/a
    if src == "y/c" and dst == "y/b":
        return "timeout"  # K8s egress isolation: ipBlock except y/b
    return "connected"


# Sends TCP SYNs (connect attempts) to argv[1]:argv[2] every 10 ms until argv[3] exists;
# prints how many connected.
KNOCKER = r"""
import os, socket, sys, time
ok = 0
while not os.path.exists(sys.argv[3]):
    s = socket.socket(); s.settimeout(0.05)
    try:
        s.connect((sys.argv[1], int(sys.argv[2]))); ok += 1
    except OSError:
        pass
    finally:
        s.close()
    time.sleep(0.01)
print(ok)
"""


# Pods in namespace y get no TCP 80 (81 stays open).
NO_80_TO_Y = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: no-80-to-y}
    spec:
      priority: 1
      appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress: [{action: Drop, ports: [{protocol: TCP, port: 80}]}]
""")


def server_behind_no_80(cluster: Cluster) -> tuple[PodHandle, PodHandle]:
    """A server Pod in y whose TCP 80 is dropped by policy (81 open), and a client Pod in x."""
    cluster.apply(namespaces_and_pods(logging_ns=""))
    server = cluster.add_pod("y", "a")
    client = cluster.add_pod("x", "a", server=False)
    cluster.apply(NO_80_TO_Y)
    target = [f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"]
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "connected"}
    return server, client


SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "config" / "audit-record.schema.json").read_text())
POLICIES = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: sec-audit}
    spec:
      tier: securityops
      priority: 3
      appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress:
      - name: drop-udp-from-x
        action: Drop
        enableLogging: true
        logLabel: sec-udp
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
        ports: [{protocol: UDP, port: 53}]
      - name: allow-web-from-x
        action: Allow
        enableLogging: true
        logLabel: sec-web
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
        ports: [{protocol: TCP, port: 80}]
    ---
    apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: z-from-x, namespace: z}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress:
      - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
""")


def wait_records(cluster: Cluster, predicate, timeout: float = 5.0) -> list[dict]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        records = cluster.audit_records()
        if predicate(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def daemon_pid(cluster: Cluster, daemon: str) -> int:
    """The pid the daemon wrote in the agent's OVS run dir, while it runs and holds that file's lock (never
    looked up by name)."""
    path = cluster.dir / "ovs" / f"{daemon}.pid"
    pid = read_pid(path)
    assert pid is not None, f"{path} ({path.read_text().strip() if path.exists() else 'gone'}) names no running " \
                            f"{daemon} that holds it"
    return pid
