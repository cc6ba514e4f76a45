"""Policy enforced for real: Pods created through CNI, manifests applied through the CLI, real probes.

Modelled on the Kubernetes/Antrea e2e suites: a reachability matrix over
namespaces x, y, z and Pods a, b, c, compared in full against what the
policies say; the four Antrea cases of "Egress NetworkPolicy are not
enforced fast enough"; and a zero-escape check for Pods created under a
deny-all policy.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import time

from tests.support.cluster import SERVER_PORTS, UDP_PORT, Cluster
from tests.support.e2e_scenarios import NAMESPACES, PODS, matrix_expect, matrix_policies, namespaces_and_pods

def full_matrix(cluster: Cluster) -> dict[tuple[str, str, str], str]:
    """(src, dst, "port/proto") -> outcome, for every ordered pair of Pods."""
    out = {}
    for src in cluster.pods:
        targets = []
        for dst, pod in cluster.pods.items():
            if dst == src:
                continue
            targets += [f"{pod.ip}:{p}/tcp" for p in SERVER_PORTS] + [f"{pod.ip}:{UDP_PORT}/udp"]
        result = cluster.probe(src, targets)
        by_ip = {pod.ip: ref for ref, pod in cluster.pods.items()}
        for target, outcome in result.items():
            addr, proto = target.split("/")
            ip, port = addr.rsplit(":", 1)
            out[(src, by_ip[ip], f"{port}/{proto}")] = outcome
    return out


def test_reachability_matrix_with_tiers_pass_reject_k8s_and_ip_blocks(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_pods())
    pods = {f"{ns}/{p}": cluster.add_pod(ns, p) for ns, p in itertools.product(NAMESPACES, PODS)}
    yb_ip = pods["y/b"].ip
    cluster.apply(matrix_policies(yb_ip, "10.246.0.0/24"))

    observed = full_matrix(cluster)
    expected = {key: matrix_expect(*key) for key in observed}
    wrong = {k: (observed[k], expected[k]) for k in observed if observed[k] != expected[k]}
    assert not wrong, f"{len(wrong)} of {len(observed)} probes differ (observed, expected): {wrong}"
    assert len(observed) == 9 * 8 * 3

    # The logged drop reached the agent as typed packet-ins with the rule's identity.
    drops = [t for t in cluster.tap_lines() if t["disposition"] == 1 and t["in_port"] is not None]
    assert drops, "no packet-in for the logged Drop"


def antrea_case_pods(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_pods(logging_ns=""))


def test_egress_to_server_in_cidr_block_is_enforced_from_the_first_packet(cluster: Cluster) -> None:
    antrea_case_pods(cluster)
    server = cluster.add_pod("y", "a")
    other = cluster.add_pod("y", "b")
    cluster.apply(textwrap.dedent(f"""
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {{name: allow-cidr, namespace: x}}
        spec:
          podSelector: {{matchLabels: {{pod: a}}}}
          policyTypes: [Egress]
          egress:
          - to: [{{ipBlock: {{cidr: "{server.ip}/32"}}}}]
    """))
    client = cluster.add_pod("x", "a", server=False)  # created right after the policy
    res = cluster.probe(client.ref, [f"{server.ip}:80/tcp", f"{other.ip}:80/tcp"])
    assert res == {f"{server.ip}:80/tcp": "connected", f"{other.ip}:80/tcp": "timeout"}


def test_egress_to_pod_in_other_namespace_by_pod_and_namespace_selector(cluster: Cluster) -> None:
    antrea_case_pods(cluster)
    server = cluster.add_pod("y", "b")
    decoy = cluster.add_pod("y", "c")
    cluster.apply(textwrap.dedent("""
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {name: allow-yb, namespace: x}
        spec:
          podSelector: {}
          policyTypes: [Egress]
          egress:
          - to: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
    """))
    client = cluster.add_pod("x", "a", server=False)
    res = cluster.probe(client.ref, [f"{server.ip}:80/tcp", f"{decoy.ip}:80/tcp"])
    assert res == {f"{server.ip}:80/tcp": "connected", f"{decoy.ip}:80/tcp": "timeout"}


def test_ingress_only_from_pod_in_other_namespace(cluster: Cluster) -> None:
    antrea_case_pods(cluster)
    cluster.apply(textwrap.dedent("""
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {name: only-from-xa, namespace: y}
        spec:
          podSelector: {matchLabels: {pod: a}}
          ingress:
          - from: [{podSelector: {matchLabels: {pod: a}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
    """))
    server = cluster.add_pod("y", "a")
    allowed = cluster.add_pod("x", "a", server=False)
    denied = cluster.add_pod("x", "b", server=False)
    assert cluster.probe(allowed.ref, [f"{server.ip}:80/tcp"]) == {f"{server.ip}:80/tcp": "connected"}
    assert cluster.probe(denied.ref, [f"{server.ip}:80/tcp"]) == {f"{server.ip}:80/tcp": "timeout"}


def test_multiple_egress_policies_allow_all_takes_precedence(cluster: Cluster) -> None:
    antrea_case_pods(cluster)
    server = cluster.add_pod("y", "a")
    cluster.apply(textwrap.dedent(f"""
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {{name: only-81, namespace: x}}
        spec:
          podSelector: {{}}
          policyTypes: [Egress]
          egress:
          - to: [{{ipBlock: {{cidr: "{server.ip}/32"}}}}]
            ports: [{{protocol: TCP, port: 81}}]
        ---
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {{name: allow-all, namespace: x}}
        spec:
          podSelector: {{}}
          policyTypes: [Egress]
          egress:
          - {{}}
    """))
    client = cluster.add_pod("x", "a", server=False)
    res = cluster.probe(client.ref, [f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"])
    assert res == {f"{server.ip}:80/tcp": "connected", f"{server.ip}:81/tcp": "connected"}


# Sends to argv[1] (about 20k packets/s) until the file argv[2] exists, then
# 0.3 s more. It starts before CNI ADD and sends from the moment the Pod's
# interface appears, with a static neighbour entry for the target (MAC argv[3])
# so that no ARP round trip hides a window where the Pod could forward
# without policy.
BLASTER = r"""
import os, socket, subprocess, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n = 0
end = None
neigh = False
while end is None or time.monotonic() < end:
    if end is None and os.path.exists(sys.argv[2]):
        end = time.monotonic() + 0.3
    if not neigh and os.path.exists("/sys/class/net/eth0"):
        neigh = subprocess.run(["ip", "neigh", "replace", sys.argv[1], "lladdr", sys.argv[3],
                                "dev", "eth0", "nud", "permanent"], capture_output=True).returncode == 0
    try:
        s.sendto(b"escape", (sys.argv[1], 9999)); n += 1
    except OSError:
        time.sleep(0.0005)
        continue
    if n % 20 == 0:
        time.sleep(0.001)  # continuous, without starving vswitchd of CPU
print(n)
"""


def test_zero_escape_for_pods_created_under_deny_all_egress(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_pods(logging_ns=""))
    listener = cluster.add_pod("y", "a", server=False)
    count_file = cluster.dir / "received"
    code = (f"import socket, signal, sys\n"
            f"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 9999))\n"
            f"n = 0\n"
            f"def done(*_):\n    open('{count_file}', 'w').write(str(n)); sys.exit(0)\n"
            f"signal.signal(signal.SIGTERM, done)\n"
            f"print('ready', flush=True)\n"
            f"while True:\n    s.recvfrom(64); n += 1\n")
    lproc = subprocess.Popen(["ip", "netns", "exec", listener.netns, sys.executable, "-c", code],
                             stdout=subprocess.PIPE)
    try:
        assert lproc.stdout is not None and lproc.stdout.readline().strip() == b"ready"
        cluster.apply(textwrap.dedent("""
            apiVersion: networking.k8s.io/v1
            kind: NetworkPolicy
            metadata: {name: deny-all-egress, namespace: x}
            spec:
              podSelector: {}
              policyTypes: [Egress]
        """))
        blasters = []
        for i in range(50):  # ADDs in sequence; each Pod's sender overlaps the next ADDs
            netns = cluster.new_netns()
            added = cluster.dir / f"added-{i}"
            blasters.append(subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", BLASTER,
                                              listener.ip, str(added), listener.mac],
                                             stdout=subprocess.PIPE, text=True))
            cluster.add_pod("x", f"p{i}", server=False, netns=netns)
            added.touch()
        sent = sum(int(b.communicate(timeout=60)[0].strip() or 0) for b in blasters)
        assert sent > 50 * 1000  # every Pod really did send, during and after its ADD
        # ...and the listener was reachable at all: an allowed Pod gets through.
        cluster.apply(textwrap.dedent("""
            apiVersion: networking.k8s.io/v1
            kind: NetworkPolicy
            metadata: {name: allow-control, namespace: z}
            spec:
              podSelector: {}
              policyTypes: [Egress]
              egress: [{}]
        """))
        control = cluster.add_pod("z", "control", server=False)
        subprocess.run(["ip", "netns", "exec", control.netns, sys.executable, "-c",
                        f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('{listener.ip}', 9999))"],
                       check=True)
        time.sleep(0.3)
    finally:
        lproc.terminate()
        lproc.wait(timeout=10)
    # Exactly the control packet arrived: nothing from the 50 Pods under deny-all.
    assert count_file.read_text() == "1", f"{int(count_file.read_text()) - 1} packets escaped"


def test_an_invalid_manifest_set_is_rejected_whole_and_the_agent_keeps_enforcing(cluster: Cluster) -> None:
    antrea_case_pods(cluster)
    server = cluster.add_pod("y", "a")
    client = cluster.add_pod("x", "a", server=False)
    bad_set = textwrap.dedent("""
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {name: deny-all-ingress, namespace: y}
        spec:
          podSelector: {}
        ---
        apiVersion: crd.antrea.io/v1beta1
        kind: ClusterNetworkPolicy
        metadata: {name: typo}
        spec:
          priority: 1
          appliedTo: [{podSelector: {}}]
          ingress:
          - action: Deny
    """)
    path = cluster.dir / "bad.yaml"
    path.write_text(bad_set)
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "apply", "-f", str(path), "--config",
                          str(cluster.config)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "ClusterNetworkPolicy/typo" in res.stderr and "spec.ingress[0].action" in res.stderr, res.stderr
    # Nothing of the set was applied: the valid deny-all in it did not take effect.
    assert cluster.probe(client.ref, [f"{server.ip}:80/tcp"]) == {f"{server.ip}:80/tcp": "connected"}
    assert cluster.agent is not None and cluster.agent.poll() is None
