"""Connections tracked under an old policy never carry a new connection past a new one.

The sequence of issue 9 (nine Pods x,y,z × a,b,c probed from every Pod to every
Pod concurrently between policy changes, as the Kubernetes netpol e2e suite
does), and a closed connection's 5-tuple reused on purpose after the policy
changed.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from typing import Callable

from tests.support.cluster import Cluster

NAMESPACES = ("x", "y", "z")
PODS = ("a", "b", "c")
ATTEMPTS = 3  # the netpol e2e suite's attempts of 1 s


def namespaces_and_named_port_pods() -> str:
    docs = []
    for ns in NAMESPACES:
        docs.append(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n"
                    f"    kubernetes.io/metadata.name: {ns}\n")
        for pod in PODS:
            docs.append(textwrap.dedent(f"""\
                apiVersion: v1
                kind: Pod
                metadata: {{name: {pod}, namespace: {ns}, labels: {{pod: {pod}}}}}
                spec:
                  containers:
                  - name: c
                    ports:
                    - {{name: serve-80-tcp, containerPort: 80, protocol: TCP}}
                    - {{name: serve-81-tcp, containerPort: 81, protocol: TCP}}
            """))
    return "---\n".join(docs)


def ingress_policy(name: str, pod_selector: str, ingress: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.k8s.io/v1
        kind: NetworkPolicy
        metadata: {{name: {name}, namespace: x}}
        spec:
          podSelector: {pod_selector}
          policyTypes: [Ingress]
          ingress: {ingress}
    """)


FROM_Y = "{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}"
ALLOW_Y_81 = ingress_policy("allow-y-81", "{matchLabels: {pod: a}}", f"[{{from: [{FROM_Y}], ports: [{{port: 81}}]}}]")
ALLOW_Y_80 = ingress_policy("allow-y-80", "{matchLabels: {pod: a}}", f"[{{from: [{FROM_Y}], ports: [{{port: 80}}]}}]")
ALLOW_ALL = ingress_policy("allow-all", "{}", "[{}]")
ONLY_NAMED_81 = ingress_policy("only-serve-81", "{}", "[{ports: [{port: serve-81-tcp}]}]")

Allowed = Callable[[str, str], bool]


def wrong_probes(cluster: Cluster, port: int, allowed: Allowed) -> dict[tuple[str, str], list[str]]:
    """Every Pod probes every other Pod on TCP `port`, all sources at once; an allowed pair gets
    up to ATTEMPTS tries to connect, a denied pair is tried ATTEMPTS times and must never connect.
    Returns the pairs that did otherwise, with their outcomes."""
    pods = cluster.pods
    pairs = [(s, d) for s, d in itertools.permutations(pods, 2)]
    outcomes: dict[tuple[str, str], list[str]] = {pair: [] for pair in pairs}
    for _ in range(ATTEMPTS):
        todo = [(s, d) for s, d in pairs if not (allowed(s, d) and "connected" in outcomes[(s, d)])]
        targets: dict[str, list[str]] = {}
        for s, d in todo:
            targets.setdefault(s, []).append(f"{pods[d].ip}:{port}/tcp")
        by_ip = {pod.ip: ref for ref, pod in pods.items()}
        for src, result in cluster.probe_concurrently(targets).items():
            for target, outcome in result.items():
                outcomes[(src, by_ip[target.split(":")[0]])].append(outcome)
    return {pair: got for pair, got in outcomes.items()
            if ("connected" in got) != allowed(*pair) or (not allowed(*pair) and set(got) != {"timeout"})}


def check(cluster: Cluster, step: str, port: int, allowed: Allowed) -> list[str]:
    wrong = wrong_probes(cluster, port, allowed)
    if not wrong:
        return []
    ips = {ref: pod.ip for ref, pod in cluster.pods.items()}
    datapath = [f for f in cluster.ovs_appctl("dpctl/dump-flows").splitlines()
                if any(f"dst={ips[d]}," in f and f"src={ips[s]}," in f for s, d in wrong)]
    flows = "\n".join(f for f in cluster.flows() if "table=4" in f)
    return [f"step {step}, TCP {port}: {len(wrong)} pairs wrong (src, dst): outcomes {wrong}\n"
            f"Pods: {ips}\npolicy flows:\n{flows}\ntheir datapath flows:\n" + "\n".join(datapath)]


def test_a_fresh_isolation_holds_after_earlier_connections_between_the_same_pods(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_named_port_pods())
    for ns, pod in itertools.product(NAMESPACES, PODS):
        cluster.add_pod(ns, pod)
    problems: list[str] = []

    cluster.apply(ALLOW_Y_81)  # (1) x/a isolated: only namespace y, only TCP 81
    problems += check(cluster, "1", 81, lambda s, d: d != "x/a" or s.startswith("y/"))
    problems += check(cluster, "1", 80, lambda s, d: d != "x/a")
    cluster.apply(ALLOW_Y_80)  # (2) ...and namespace y on TCP 80
    problems += check(cluster, "2", 80, lambda s, d: d != "x/a" or s.startswith("y/"))
    cluster.apply(ALLOW_Y_81 + "---\n" + ALLOW_Y_80, op="delete")  # (3)
    cluster.apply(ALLOW_ALL)  # (4) every Pod of x isolated, everything allowed
    problems += check(cluster, "4", 80, lambda s, d: True)
    problems += check(cluster, "4", 81, lambda s, d: True)
    cluster.apply(ALLOW_ALL, op="delete")  # (5)
    cluster.apply(ONLY_NAMED_81)  # (6) every Pod of x isolated, only its named port serve-81-tcp
    problems += check(cluster, "6", 80, lambda s, d: not d.startswith("x/"))
    assert not problems, "\n".join(problems)


# Connects from a fixed source port and waits for the server (which closes at once) to
# close first, so the client holds no TIME_WAIT and may connect from that port again.
# argv: ip port source-port timeout close(fin|rst); prints connected|timeout|...
REUSER = r"""
import socket, struct, sys
ip, port, sport, timeout, close = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.settimeout(timeout)
s.bind(("0.0.0.0", sport))
try:
    s.connect((ip, port))
    if close == "rst":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        s.recv(1)
    print("connected")
except ConnectionRefusedError: print("refused")
except socket.timeout: print("timeout")
except OSError as e: print("error:%d" % e.errno)
finally:
    s.close()
"""


def connect_from(cluster: Cluster, src: str, dst: str, sport: int, close: str) -> str:
    res = subprocess.run(["ip", "netns", "exec", cluster.pods[src].netns, sys.executable, "-c", REUSER,
                          cluster.pods[dst].ip, "80", str(sport), "1.0", close],
                         capture_output=True, text=True, timeout=30)
    return res.stdout.strip() or res.stderr.strip()


def test_a_closed_connections_5_tuple_reused_after_a_policy_change_meets_the_new_policy(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_named_port_pods())
    cluster.add_pod("x", "a")
    cluster.add_pod("y", "a", server=False)
    # Allowed before the change, closed both ways a FIN (client waits for the server's)
    # and by RST, each from its own fixed source port.
    assert connect_from(cluster, "y/a", "x/a", 40001, "fin") == "connected"
    assert connect_from(cluster, "y/a", "x/a", 40002, "rst") == "connected"
    assert "40001" in cluster.ovs_appctl("dpctl/dump-conntrack")  # the old connection is still tracked
    cluster.apply(ONLY_NAMED_81)
    after = {sport: [connect_from(cluster, "y/a", "x/a", sport, "fin") for _ in range(ATTEMPTS)]
             for sport in (40001, 40002)}
    assert after == {40001: ["timeout"] * ATTEMPTS, 40002: ["timeout"] * ATTEMPTS}, \
        f"{after}\nconntrack:\n{cluster.ovs_appctl('dpctl/dump-conntrack')}"
    # ...and a tuple that was denied connects once the policy allows it again.
    cluster.apply(ONLY_NAMED_81, op="delete")
    assert connect_from(cluster, "y/a", "x/a", 40001, "fin") == "connected"
