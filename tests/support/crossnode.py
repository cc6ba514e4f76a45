"""Cross-node test steps shared by the two-node e2e tests (tests/e2e/test_tunnel_e2e.py and
tests/e2e/test_tunnel_external_ovs_e2e.py): probing through a tunnel, waiting for records, a client
and a server Pod on two nodes with logged egress and ingress rules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from typing import Callable

from tests.support.cluster import Cluster, PodHandle
from tests.support.multinode import MultiNode, node_name


def connect(c: Cluster, src: str, targets: list[str], want: str = "connected", timeout: float = 30.0
            ) -> dict[str, str]:
    """Probe until every target gives `want` or `timeout` passes: for what takes time to come about
    (a Pod object reaching a node, an agent restarted)."""
    deadline = time.monotonic() + timeout
    while True:
        got = c.probe(src, targets, timeout=2.0)
        if all(v == want for v in got.values()) or time.monotonic() > deadline:
            return got


def udp_arrivals(netns: str) -> int:
    """UDP datagrams the namespace's IP stack has received (to a socket or to no port): no other traffic
    of the test (TCP, ARP) moves it."""
    lines = [line.split() for line in subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/snmp"],
                                                     capture_output=True, text=True, check=True).stdout.splitlines()
             if line.startswith("Udp:")]
    udp = dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=True))
    return udp["InDatagrams"] + udp["NoPorts"]


def send_datagram(netns: str, ip: str, port: int) -> None:
    """ONE UDP datagram from `netns` to ip:port, never sent again (a DNS client's first query)."""
    code = ("import socket, sys\n"
            "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'one', (sys.argv[1], int(sys.argv[2])))")
    subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code, ip, str(port)], check=True, timeout=30)


def datagram_arrives(src_netns: str, dst_netns: str, ip: str, port: int, within: float = 3.0) -> bool:
    """Whether one datagram from `src_netns` to ip:port reaches `dst_netns` within `within` seconds."""
    before = udp_arrivals(dst_netns)
    send_datagram(src_netns, ip, port)
    deadline = time.monotonic() + within
    while udp_arrivals(dst_netns) == before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def wait_records(c: Cluster, want: Callable[[list[dict]], bool], timeout: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    records = c.audit_records()
    while not want(records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = c.audit_records()
    return records


def labelled(records: list[dict], label: str) -> list[dict]:
    return [r for r in records if r.get("labels", {}).get("log_label") == label]


def pod_objects(pods: dict[str, tuple[PodHandle, int, str]]) -> str:
    """Namespace and Pod objects (spec.nodeName; status.podIP once the Pod has an address) for `pods`:
    {ref: (handle, node, app)}."""
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n" for ns in sorted({p.namespace for p, _, _
                                                                                              in pods.values()})]
    for pod, node, app in pods.values():
        docs.append(textwrap.dedent(f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: {pod.name}, namespace: {pod.namespace}, labels: {{app: {app}}}}}
            spec: {{nodeName: {node_name(node)}, containers: [{{name: c, image: i}}]}}
            """) + (f"status: {{podIP: {pod.ip}, podIPs: [{{ip: {pod.ip}}}]}}\n" if pod.ip else ""))
    return "---\n".join(docs)


POLICIES = textwrap.dedent("""\
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: client-egress}
    spec:
      tier: securityops
      priority: 1
      appliedTo: [{podSelector: {matchLabels: {app: client}}}]
      egress:
      - name: drop-81
        action: Drop
        enableLogging: true
        logLabel: egress-drop
        to: [{podSelector: {matchLabels: {app: server}}, namespaceSelector: {}}]
        ports: [{protocol: TCP, port: 81}]
      - name: allow-80
        action: Allow
        enableLogging: true
        logLabel: egress-allow
        to: [{podSelector: {matchLabels: {app: server}}, namespaceSelector: {}}]
        ports: [{protocol: TCP, port: 80}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: server-ingress}
    spec:
      tier: securityops
      priority: 2
      appliedTo: [{podSelector: {matchLabels: {app: server}}}]
      ingress:
      - name: allow-80
        action: Allow
        enableLogging: true
        logLabel: ingress-allow
        from: [{podSelector: {matchLabels: {app: client}}, namespaceSelector: {}}]
        ports: [{protocol: TCP, port: 80}]
      - name: reject-udp
        action: Reject
        enableLogging: true
        logLabel: ingress-reject
        from: [{podSelector: {matchLabels: {app: client}}, namespaceSelector: {}}]
        ports: [{protocol: TCP, port: 82}]
    """)


def place_pods(m: MultiNode) -> tuple[PodHandle, PodHandle]:
    """x/client on node 1, y/server on node 2, both nodes told of both (labels before the Pods start,
    addresses once they have them)."""
    n1, n2 = m.nodes[1], m.nodes[2]
    labels = {"x/client": (PodHandle("x", "client", "", "", ""), 1, "client"),
              "y/server": (PodHandle("y", "server", "", "", ""), 2, "server")}
    for c in (n1, n2):
        c.apply(pod_objects(labels))
        c.apply(POLICIES)
    a = n1.add_pod("x", "client")
    b = n2.add_pod("y", "server")
    known = {"x/client": (a, 1, "client"), "y/server": (b, 2, "server")}
    for c in (n1, n2):
        c.apply(pod_objects(known))
    return a, b
