"""The node gateway end to end: the real agent with node_network.pod_cidr, Pods through CNI.

The node's host side is the embedded OVS's network namespace (where the gateway port is); "outside
the cluster" is a namespace this test makes and joins to the node's with a veth on 192.0.2.0/24
(TEST-NET-1). Addresses, routes and NAT exist only in those namespaces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.cluster import GATEWAY, Cluster, _npaudit

NODE_SIDE, OUTSIDE = "192.0.2.1", "192.0.2.2"  # the node's address towards the outside, the outside host
RECOVERY_BOUND = 20.0  # seconds; a bound for the test, not a speed claim


pytestmark = pytest.mark.cluster(gateway=True)


def outside_network(cluster: Cluster) -> str:
    """A namespace holding OUTSIDE, joined to the node's namespace (NODE_SIDE) by a veth."""
    return cluster.linked_netns("gwt-out", f"{NODE_SIDE}/24", f"{OUTSIDE}/24")


def peers(path: Path, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text().split() if path.exists() else []


def trace(cluster: Cluster, *args: str) -> tuple[int, dict]:
    res = _npaudit("trace", *args, "-o", "json", "--config", str(cluster.config))
    return res.returncode, json.loads(res.stdout or b"{}")


def test_pods_and_their_node_reach_each_other_through_the_gateway_even_under_ingress_isolation(
        cluster: Cluster) -> None:
    cluster.apply(textwrap.dedent("""
        apiVersion: v1
        kind: Namespace
        metadata: {name: x}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {name: a, namespace: x, labels: {pod: a}}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {name: b, namespace: x, labels: {pod: b}}
        ---
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {name: deny-all-ingress, namespace: x}
        spec:
          podSelector: {matchLabels: {pod: a}}
          policyTypes: [Ingress]
        ---
        apiVersion: crd.antrea.io/v1beta1
        kind: ClusterNetworkPolicy
        metadata: {name: b-from-nowhere}
        spec:
          tier: securityops
          priority: 1
          appliedTo: [{podSelector: {matchLabels: {pod: b}}}]
          ingress:
          - name: drop-all
            action: Drop
            from: [{ipBlock: {cidr: 0.0.0.0/0}}]
        """))
    a = cluster.add_pod("x", "a")
    b = cluster.add_pod("x", "b")
    node_listener = cluster.listen(cluster.node_netns, GATEWAY, 8080)

    # A Pod reaches a listener on the node's side at the gateway address (its default router).
    assert cluster.probe("x/a", [f"{GATEWAY}:8080/tcp"]) == {f"{GATEWAY}:8080/tcp": "connected"}
    assert peers(node_listener) == [a.ip]
    # The node reaches the Pods (a kubelet probe): neither K8s isolation nor an Antrea ingress Drop
    # applies to the node itself...
    got = cluster.probe_from(cluster.node_netns, [f"{a.ip}:80/tcp", f"{b.ip}:81/tcp"])
    assert got == {f"{a.ip}:80/tcp": "connected", f"{b.ip}:81/tcp": "connected"}
    # ...while both do to another Pod.
    assert cluster.probe("x/b", [f"{a.ip}:80/tcp"]) == {f"{a.ip}:80/tcp": "timeout"}
    assert cluster.probe("x/a", [f"{b.ip}:80/tcp"]) == {f"{b.ip}:80/tcp": "timeout"}


def test_pod_traffic_to_the_outside_is_masqueraded_and_meets_egress_ipblock_rules(cluster: Cluster) -> None:
    outside = outside_network(cluster)
    cluster.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    cluster.add_pod("x", "a", server=False)
    allowed = cluster.listen(outside, OUTSIDE, 8080)
    dropped = cluster.listen(outside, OUTSIDE, 8081)
    cluster.listen(outside, OUTSIDE, 8082)

    # Outside the cluster: the Pod's connection leaves through the gateway, SNATed to the node's address.
    assert cluster.probe("x/a", [f"{OUTSIDE}:8080/tcp"]) == {f"{OUTSIDE}:8080/tcp": "connected"}
    assert peers(allowed) == [NODE_SIDE]
    # The rule is in the node's namespace only, never in the machine's root namespace.
    assert "NPAUDIT-MASQ" in subprocess.run(["ip", "netns", "exec", cluster.node_netns, "iptables", "-t", "nat", "-S"],
                                            capture_output=True, text=True, check=True).stdout
    assert "NPAUDIT-MASQ" not in subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True,
                                                check=True).stdout

    cluster.apply(textwrap.dedent(f"""
        apiVersion: crd.antrea.io/v1beta1
        kind: ClusterNetworkPolicy
        metadata: {{name: no-outside-8081}}
        spec:
          tier: securityops
          priority: 1
          appliedTo: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
          egress:
          - name: drop-8081
            action: Drop
            enableLogging: true
            logLabel: outside
            to: [{{ipBlock: {{cidr: 192.0.2.0/24}}}}]
            ports: [{{protocol: TCP, port: 8081}}]
          - name: reject-8082
            action: Reject
            to: [{{ipBlock: {{cidr: {OUTSIDE}/32}}}}]
            ports: [{{protocol: TCP, port: 8082}}]
        """))
    got = cluster.probe("x/a", [f"{OUTSIDE}:8080/tcp", f"{OUTSIDE}:8081/tcp", f"{OUTSIDE}:8082/tcp"])
    assert got == {f"{OUTSIDE}:8080/tcp": "connected", f"{OUTSIDE}:8081/tcp": "timeout",
                   f"{OUTSIDE}:8082/tcp": "refused"}
    assert peers(dropped, timeout=0.5) == []

    deadline = time.monotonic() + 5
    drops: list[dict] = []
    while not drops and time.monotonic() < deadline:
        drops = [r for r in cluster.audit_records() if r.get("rule", {}).get("name") == "drop-8081"]
        time.sleep(0.1)
    assert drops, cluster.audit_records()
    record = drops[0]
    assert record["event"]["action"] == "dropped"
    assert record["destination"]["ip"] == OUTSIDE and record["destination"]["port"] == 8081
    assert record["labels"]["log_label"] == "outside"

    # traceflow to the outside address shows the gateway.
    code, out = trace(cluster, "--from", "x/a", "--to", OUTSIDE, "--port", "8080")
    assert code == 0, out
    assert out["outcome"]["result"] == "forwarded" and "npaudit-gw0" in out["outcome"]["detail"], out
    assert out["observations"][-1]["table"] == 70 and "node gateway" in out["observations"][-1]["detail"]
    code, out = trace(cluster, "--from", "x/a", "--to", OUTSIDE, "--port", "8081")
    assert code == 1 and out["outcome"]["result"] == "dropped", out
    assert out["outcome"]["rule"]["name"] == "drop-8081"


def test_the_gateway_comes_back_with_its_address_after_ovs_vswitchd_is_killed(cluster: Cluster) -> None:
    cluster.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    a = cluster.add_pod("x", "a")
    node_listener = cluster.listen(cluster.node_netns, GATEWAY, 8080)
    assert cluster.probe("x/a", [f"{GATEWAY}:8080/tcp"]) == {f"{GATEWAY}:8080/tcp": "connected"}

    # Once the agent restarted vswitchd (and ensured the bridge and its gateway again), the gateway works.
    pid = int((cluster.dir / "ovs" / "ovs-vswitchd.pid").read_text().strip())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + RECOVERY_BOUND
    got: dict[str, str] = {}
    while time.monotonic() < deadline:
        got = cluster.probe("x/a", [f"{GATEWAY}:8080/tcp"], timeout=0.5)
        if got == {f"{GATEWAY}:8080/tcp": "connected"}:
            break
        time.sleep(0.2)
    assert got == {f"{GATEWAY}:8080/tcp": "connected"}, cluster.log()
    assert peers(node_listener) == [a.ip, a.ip]
    assert cluster.probe_from(cluster.node_netns, [f"{a.ip}:80/tcp"]) == {f"{a.ip}:80/tcp": "connected"}


# Sends one ARP request for argv[1] on eth0 and prints the sender MACs of every reply within a second.
ARP_WHO_HAS = r"""
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806)); s.bind(("eth0", 0))
mine = bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":", ""))
me = socket.inet_aton(sys.argv[2]); target = socket.inet_aton(sys.argv[1])
s.send(b"\xff" * 6 + mine + b"\x08\x06" + b"\x00\x01\x08\x00\x06\x04\x00\x01" + mine + me + b"\x00" * 6 + target)
seen, end = [], time.monotonic() + 1.0
s.settimeout(0.1)
while time.monotonic() < end:
    try:
        frame = s.recv(100)
    except socket.timeout:
        continue
    if frame[20:22] == b"\x00\x02" and frame[28:32] == target:
        seen.append(frame[22:28].hex(":"))
print(" ".join(seen))
"""


def test_only_the_gateway_port_answers_arp_for_the_gateway_address(cluster: Cluster) -> None:
    """A Pod's host-side veth end is a kernel interface in the node's namespace, which holds the gateway
    address: unless it is told not to, the kernel answers ARP on it too, and a Pod that learned that MAC
    sends its packets into the node's kernel as well as into OVS. Across nodes the kernel has no route
    for a peer's Pods and answers "unreachable", so a Pod's first connections to another node were at
    times reset. Only OVS (the gateway's MAC) may answer."""
    from policy_agent.ovs.tables import mac_for_ip

    cluster.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n"
                  "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: x}\n")
    pod = cluster.add_pod("x", "a", server=False)
    res = subprocess.run(["ip", "netns", "exec", pod.netns, "python3", "-c", ARP_WHO_HAS, GATEWAY, pod.ip],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [mac_for_ip(GATEWAY)], res.stdout
