"""The agent in Kubernetes mode against the test API server: every node's Pods and every Node.

The real agent process (embedded OVS in its own namespace) with no node_network.pod_cidr: its
Node gets a podCIDR only after start, and the gateway must come with it. A Pod on another node,
known only from the API, is matched by a rule and named in its record; the other Nodes become
peers; each bad input (a Node without podCIDR or address, overlapping subnets, a Pod address in
no node's subnet, a changed podCIDR) gives its log line and metric and leaves the rest working.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from typing import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import GATEWAY, SUBNET, Cluster, _npaudit
from tests.support.fake_apiserver import ACNP, ANP, NAMESPACES, NETPOL, NODES, PODS, TIERS, FakeApiServer
from tests.support.k8s_objects import namespace, node, pod, write_kubeconfig
from tests.support.ports import free_port

NODE = "node-a"
REMOTE_IP, STRAY_IP = "10.245.0.7", "172.16.5.5"  # in node-b's subnet; in no node's
BOUND = 30.0  # seconds; a hang guard, not a speed claim

NO_CLIENTS = {
    "apiVersion": "crd.antrea.io/v1beta1", "kind": "ClusterNetworkPolicy",
    "metadata": {"name": "no-clients", "resourceVersion": "20"},
    "spec": {"tier": "securityops", "priority": 1,
             "appliedTo": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}],
             "egress": [{"name": "drop-clients", "action": "Drop", "enableLogging": True, "logLabel": "clients",
                         "to": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                         "ports": [{"protocol": "TCP", "port": 80}]}]}}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    srv = FakeApiServer()
    srv.set_items(NODES, [node(NODE, None, "192.0.2.10"),
                          node("node-b", "10.245.0.0/24", "192.0.2.11"),
                          node("node-c", "10.247.0.0/24"),                  # no address
                          node("node-d", "10.245.0.0/25", "192.0.2.13"),    # overlaps node-b
                          node("node-e", None, "192.0.2.14")], "30")       # no podCIDR
    srv.set_items(NAMESPACES, [namespace("x"), namespace("y")], "30")
    srv.set_items(PODS, [pod("x", "a", NODE, labels={"app": "web"}),
                         pod("y", "client-b", "node-b", REMOTE_IP, {"app": "client"}),
                         pod("y", "stray", "node-b", STRAY_IP, {"app": "other"})], "30")
    for path in (NETPOL, TIERS, ANP):
        srv.set_items(path, [], "30")
    srv.set_items(ACNP, [NO_CLIENTS], "30")
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def cluster(api: FakeApiServer) -> Iterator[Cluster]:
    c = Cluster(metrics_listen=f"127.0.0.1:{free_port()}")
    c.gateway = True  # Pods take the agent's range and route through its gateway, as with the shipped conflist
    kubeconfig = write_kubeconfig(c.dir / "kubeconfig", api.url)
    c.config.write_text(c.config.read_text() + f"node_name: {NODE}\n"
                        f"kubernetes:\n  enabled: true\n  kubeconfig: {kubeconfig}\n  sync_timeout: 20\n")
    try:
        c.start(timeout=60)
        yield c
    finally:
        c.close()


def metrics(cluster: Cluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    listen = [line.split(": ", 1)[1].strip(" '\"") for line in cluster.config.read_text().splitlines()
              if line.strip().startswith("listen:")][0]
    text = urllib.request.urlopen(f"http://{listen}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def problems(cluster: Cluster, reason: str) -> float:
    return metrics(cluster).get(("npaudit_cluster_node_problems_total", (("reason", reason),)), -1.0)


def gateway_address(cluster: Cluster) -> str:
    out = subprocess.run(["ip", "-n", cluster.node_netns, "-4", "-o", "addr", "show", "dev", "npaudit-gw0"],
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else ""


def wait(predicate: Callable[[], bool], what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{cluster.log()}")
        time.sleep(0.1)


def status(cluster: Cluster) -> dict:
    res = _npaudit("status", "--config", str(cluster.config), "-o", "json")
    assert res.returncode == 0, res.stderr.decode()
    return json.loads(res.stdout)


def test_pods_and_nodes_of_the_cluster_the_gateway_from_the_node_and_bad_input_said_once(
        api: FakeApiServer, cluster: Cluster) -> None:
    # The other Nodes: node-b routed; node-c, node-d and node-e each refused with its reason.
    nodes = status(cluster)["nodes"]
    assert nodes["subnet"] is None and [n["name"] for n in nodes["nodes"]] == ["node-b"], nodes
    assert sorted((p["node"], p["reason"]) for p in nodes["problems"]) == [
        ("node-c", "node_without_address"), ("node-d", "node_pod_cidr_overlaps"),
        ("node-e", "node_without_pod_cidr")]
    m = metrics(cluster)
    assert m[("npaudit_cluster_nodes", ())] == 1
    assert m[("npaudit_node_subnet_known", ())] == 0
    for reason in ("node_without_address", "node_pod_cidr_overlaps", "node_without_pod_cidr"):
        assert problems(cluster, reason) == 1, reason
    # No Pod subnet yet: no gateway (nothing would hold its address).
    assert gateway_address(cluster) == ""

    # The Node gets its podCIDR: the gateway port comes up with the subnet's first address.
    api.send(NODES, "MODIFIED", node(NODE, SUBNET, "192.0.2.10", rv="31"))
    wait(lambda: f"{GATEWAY}/24" in gateway_address(cluster), "the gateway address", cluster)
    wait(lambda: any(f"nw_dst={GATEWAY}" in f for f in cluster.flows()), "the gateway flows", cluster)
    # With this node's subnet known, the stray Pod's address is in no node's subnet: said once.
    wait(lambda: problems(cluster, "pod_ip_outside_node_subnets") == 1, "the stray Pod counted", cluster)

    # A Pod here, its egress to a Pod on node-b (known only from the API) judged by the rule and named.
    local = cluster.add_pod("x", "a", server=False)
    assert local.ip.startswith("10.246.0.")
    target = f"{REMOTE_IP}:80/tcp"
    deadline = time.monotonic() + BOUND
    dropped: list[dict] = []
    while not dropped and time.monotonic() < deadline:
        cluster.probe(local.ref, [target], timeout=0.5)
        dropped = [r for r in cluster.audit_records() if r.get("labels", {}).get("log_label") == "clients"]
    assert dropped, cluster.log()
    assert dropped[0]["event"]["action"] == "dropped" and dropped[0]["destination"]["ip"] == REMOTE_IP
    assert dropped[0]["npaudit"]["destination"]["pod"] == {"namespace": "y", "name": "client-b"}
    assert dropped[0]["npaudit"]["source"]["pod"] == {"namespace": "x", "name": "a"}

    # Kubernetes never changes a podCIDR; a Node made again with another one is refused, the gateway stays.
    api.send(NODES, "MODIFIED", node(NODE, "10.246.9.0/24", "192.0.2.10", rv="32"))
    api.send(NODES, "MODIFIED", node(NODE, "10.246.9.0/24", "192.0.2.10", rv="33"))  # a heartbeat
    wait(lambda: "podCIDR changed from 10.246.0.0/24 to 10.246.9.0/24: refused" in cluster.log(),
         "the refusal", cluster)
    # A Node heartbeat repeating the same bad input is not said again.
    api.send(NODES, "MODIFIED", node("node-c", "10.247.0.0/24", rv="34"))
    api.send(NODES, "MODIFIED", node("node-b", "10.245.0.0/24", "192.0.2.11", rv="35"))
    time.sleep(1.0)
    log = cluster.log()
    assert log.count("podCIDR changed from 10.246.0.0/24") == 1
    assert log.count("node node-c: no IPv4 InternalIP") == 1 and problems(cluster, "node_without_address") == 1
    assert log.count("Pod y/stray has address 172.16.5.5 outside every node's Pod subnet") == 1
    assert f"{GATEWAY}/24" in gateway_address(cluster)
    assert status(cluster)["nodes"]["subnet"] == SUBNET
    assert "Traceback" not in log
    table = _npaudit("status", "--config", str(cluster.config)).stdout.decode()
    assert f"this node's Pod subnet {SUBNET}; 1 other nodes routed; 3 node problems" in table, table
