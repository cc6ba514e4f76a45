"""Zero escapes while policy changes continuously and Pods are added: TCP 80 into namespace y is
dropped in every version applied, and not one connection gets through, to the Pods there from
the start or to Pods added during the churn, from their first packet on.

Each version of the churn keeps the Drop of TCP 80 into y but changes what is around it: rules
inserted before it in its own policy (its OpenFlow priority moves), the policy moved between
tiers, a higher-priority Allow of TCP 81, a K8s NetworkPolicy allowing 80 from x (which the
Antrea Drop must still override), Pod and Namespace labels. Meanwhile new server Pods join y
(listening on 80 before their CNI ADD) and new client Pods join x (knocking from before
theirs). Knockers connect to every address the new Pods can get, with static neighbour
entries, so the first SYN that could reach a new Pod is sent at once.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time

from policy_agent.cni.netdev import mac_for_ip
from policy_agent.sources.local_api import call
from tests.support.cluster import SUBNET, Cluster, PodHandle
from tests.support.e2e_scenarios import namespaces_and_pods
from tests.support.background import Background

DENIED = 80

# Connects (non-blocking) to argv[3] on every address of argv[2] at once, every 50 ms, until the
# file argv[1] exists; once eth0 exists, static neighbour entries (addresses argv[2], MACs
# argv[4]) so no ARP round trip delays the first SYN. Prints {"rounds": n, "connected": {ip: n}}.
KNOCKER = r"""
import errno, json, os, select, socket, subprocess, sys, time
stop, ips, port, macs = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4].split(",")
connected, rounds, neigh = {}, 0, False
while not os.path.exists(stop):
    if not neigh and os.path.exists("/sys/class/net/eth0"):
        neigh = all(subprocess.run(["ip", "neigh", "replace", ip, "lladdr", mac, "dev", "eth0", "nud", "permanent"],
                                   capture_output=True).returncode == 0 for ip, mac in zip(ips, macs))
    pending = {}
    for ip in ips:
        s = socket.socket(); s.setblocking(False)
        if s.connect_ex((ip, port)) in (0, errno.EINPROGRESS):
            pending[s] = ip
        else:
            s.close()
    deadline = time.monotonic() + 0.05
    while pending and (left := deadline - time.monotonic()) > 0:
        _, ready, _ = select.select([], list(pending), [], left)
        for s in ready:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                connected[pending[s]] = connected.get(pending[s], 0) + 1
            s.close(); del pending[s]
    for s in pending:
        s.close()
    rounds += 1
    time.sleep(0.005)
print(json.dumps({"rounds": rounds, "connected": connected}))
"""


def no_80_into_y(version: int) -> str:
    """The policy holding the Drop of TCP 80 into y, in version `version`: `version % 4` Drop rules
    on unused ports before it (its priority moves), and every other version in securityops."""
    before = [f"  - {{action: Drop, name: d{p}, ports: [{{protocol: TCP, port: {p}}}]}}"
              for p in range(3000 + version, 3000 + version + version % 4)]
    tier = "securityops" if version % 2 else "application"
    return ("apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: no-80-into-y}\nspec:\n"
            f"  priority: 5\n  tier: {tier}\n"
            "  appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]\n"
            "  ingress:\n" + "".join(line + "\n" for line in before)
            + f"  - {{action: Drop, name: no-{DENIED}, ports: [{{protocol: TCP, port: {DENIED}}}]}}\n"
            f"  - {{action: Drop, name: after, ports: [{{protocol: TCP, port: {4000 + version}}}]}}\n")


ALLOW_81 = """apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: allow-81}
spec:
  priority: 1
  tier: securityops
  appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
  ingress: [{action: Allow, ports: [{protocol: TCP, port: 81}]}]
"""
K8S_ALLOW_80 = """apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-80-from-x, namespace: y}
spec:
  podSelector: {}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
    ports: [{protocol: TCP, port: 80}]
"""


def relabelled(version: int) -> str:
    return (f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n"
            f"  labels: {{kubernetes.io/metadata.name: x, team: t{version % 3}}}\n---\n"
            f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  namespace: y\n"
            f"  labels: {{pod: a, version: v{version}}}\n")


class Churn(Background):
    """Applies and deletes versions back to back, through the agent's local API (the client the
    CLI uses, without a Python start per request), until stopped."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.versions = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                v = self.versions + 1
                for op, text in (("apply", no_80_into_y(v)), ("apply" if v % 2 else "delete", ALLOW_81),
                                 ("apply" if v % 3 else "delete", K8S_ALLOW_80), ("apply", relabelled(v))):
                    reply = call(self.cluster.state / "api.sock", {"op": op, "manifests": text, "source": "churn"})
                    if not reply["ok"]:
                        raise AssertionError(f"{op} of version {v} failed: {reply}")
                self.versions = v
                time.sleep(0.05)  # continuous, without starving the knockers of CPU
        except BaseException as exc:  # reported by the test, which must not pass on a dead churn
            self.failure = exc


def knock(cluster: Cluster, netns: str, ips: list[str], port: int, stop: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", KNOCKER, stop, ",".join(ips),
                             str(port), ",".join(mac_for_ip(ip) for ip in ips)], stdout=subprocess.PIPE, text=True)


def test_zero_escape_while_policies_churn_and_pods_are_added(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_pods(logging_ns=""))
    cluster.apply(no_80_into_y(0))
    server = cluster.add_pod("y", "a")
    client = cluster.add_pod("x", "a", server=False)
    assert cluster.probe(client.ref, [f"{server.ip}:{DENIED}/tcp", f"{server.ip}:81/tcp"]) == {
        f"{server.ip}:{DENIED}/tcp": "timeout", f"{server.ip}:81/tcp": "connected"}
    # Every address a Pod of this test can get: the new ones are knocked before they exist.
    candidates = [str(ip) for ip in list(ipaddress.ip_network(SUBNET).hosts())[1:40]]
    stop = str(cluster.dir / "stop-knocking")
    knockers = [knock(cluster, client.netns, candidates, DENIED, stop)]
    added: list[PodHandle] = []
    try:
        with Churn(cluster) as churn:
            for i in range(12):
                netns = cluster.new_netns()
                if i % 3 == 2:  # a client in x, knocking from before its ADD
                    knockers.append(knock(cluster, netns, candidates, DENIED, stop))
                    added.append(cluster.add_pod("x", f"c{i}", server=False, netns=netns))
                else:  # a server in y, listening on 80 from before its ADD
                    pod = PodHandle("y", f"s{i}", netns, "", "")
                    cluster.serve(pod)
                    added.append(cluster.add_pod("y", f"s{i}", server=False, netns=netns))
            after_adds, since = churn.versions, time.monotonic()
            while (churn.versions < after_adds + 10 or time.monotonic() < since + 2) and churn.failure is None:
                time.sleep(0.1)  # the churn goes on after the last ADD too
        assert churn.failure is None, f"the churn stopped: {churn.failure}"
    finally:
        (cluster.dir / "stop-knocking").touch()
        results = [json.loads(k.communicate(timeout=60)[0]) for k in knockers]
    servers = {p.ip for p in added if p.namespace == "y"} | {server.ip}
    assert len(servers) == 9 and servers <= set(candidates)
    escaped = {ip: n for r in results for ip, n in r["connected"].items() if ip in servers}
    assert not escaped, f"connections to TCP {DENIED} in y got through ({churn.versions} versions applied): {escaped}"
    assert all(r["rounds"] > 10 for r in results), [r["rounds"] for r in results]  # they knocked throughout

    # The servers were there to be reached: 81 answers, and 80 too once the Drop goes (without
    # the K8s policy, which isolates y for everything but 80 from x).
    cluster.apply(K8S_ALLOW_80, op="delete")
    targets = [f"{ip}:81/tcp" for ip in sorted(servers)]
    assert set(cluster.probe(client.ref, targets).values()) == {"connected"}
    cluster.apply(no_80_into_y(0), op="delete")
    targets = [f"{ip}:{DENIED}/tcp" for ip in sorted(servers)]
    assert set(cluster.probe(client.ref, targets).values()) == {"connected"}
