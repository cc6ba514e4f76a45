"""`npaudit cluster` end to end: 3 nodes on this machine (each a namespace with its own embedded OVS and
agent, joined by an underlay namespace) come up ready, every node's config loads, status lists them,
the per-node verbs work with `--config DIR/<node>/npaudit.yaml`, the shared source reaches every node,
Pods are made through a node's own `npaudit cni` and known to every node, and `down` stops exactly what
`up` started (twice is fine).

Traffic between nodes is the tunnel datapath's part; here Pods talk only to Pods of their own node.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.cluster import logged_udp_drop
from tests.support.local_cluster import LocalCluster, npaudit
from tests.support.processes import alive
from tests.support.waiting import wait_for

NODES = ("n1", "n2", "n3")
ISOLATE_Z = """apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-z, namespace: z}
spec: {podSelector: {}, policyTypes: [Ingress]}
"""


@pytest.fixture
def local() -> Iterator[LocalCluster]:
    c = LocalCluster()
    try:
        yield c
    finally:
        c.close()


def _netns() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def _policies(local: LocalCluster, node: str) -> int:
    return int(local.node_status(node)["policy"]["policies"])


def test_three_nodes_up_status_apply_pods_and_down(local: LocalCluster, tmp_path: Path) -> None:
    local.up(3)
    record = local.record()
    assert [n["name"] for n in record["nodes"]] == list(NODES)

    # Every node's config is a valid agent config.
    for node in NODES:
        res = npaudit("check-config", local.config(node))
        assert res.returncode == 0, res.stdout + res.stderr

    # Status lists the nodes, their subnets and addresses, each agent alive and ready.
    st = local.status()
    assert [(n["name"], n["pod_cidr"], n["address"], n["alive"], n["ready"]) for n in st["nodes"]] == [
        ("n1", "10.248.1.0/24", "198.51.100.11/24", True, True),
        ("n2", "10.248.2.0/24", "198.51.100.12/24", True, True),
        ("n3", "10.248.3.0/24", "198.51.100.13/24", True, True)]
    assert {n["netns"] for n in st["nodes"]} | {st["underlay_netns"]} <= _netns()
    # Each node's underlay end is in its OVS namespace, the other on the underlay bridge.
    for node in record["nodes"]:
        link = subprocess.run(["ip", "-n", node["netns"], "-o", "link", "show", "underlay0"], capture_output=True,
                              text=True)
        assert link.returncode == 0 and "UP" in link.stdout, link.stderr
        port = subprocess.run(["ip", "-n", record["underlay_netns"], "-o", "link", "show", node["underlay_port"]],
                              capture_output=True, text=True)
        assert "master br-underlay" in port.stdout

    # Per node: `npaudit apply --config` reaches that node only.
    policy = tmp_path / "isolate-z.yaml"
    policy.write_text(ISOLATE_Z)
    res = npaudit("apply", "-f", str(policy), "--config", local.config("n2"))
    assert res.returncode == 0, res.stderr
    assert [_policies(local, n) for n in NODES] == [0, 1, 0]

    # The shared source reaches every node.
    drop = tmp_path / "drop-udp.yaml"
    drop.write_text(logged_udp_drop("drop-udp-x-from-y", "x", "y", "cluster-drop"))
    res = local.cluster("apply", "-f", str(drop))
    assert res.returncode == 0, res.stderr
    wait_for(lambda: [_policies(local, n) for n in NODES] == [1, 2, 1], timeout=120,
             what=lambda: f"the shared policy on every node: {[_policies(local, n) for n in NODES]}")

    # Pods through a node's own CNI; every node knows every Pod object.
    a = local.add_pod("n1", "x/a", "app=a")
    b = local.add_pod("n1", "y/b", "app=b")
    c = local.add_pod("n3", "x/c", "app=c")
    assert [a["ip"].rsplit(".", 1)[0], b["ip"].rsplit(".", 1)[0], c["ip"].rsplit(".", 1)[0]] == [
        "10.248.1", "10.248.1", "10.248.3"]
    wait_for(lambda: [local.node_status(n)["policy"]["pods"] for n in NODES] == [3, 3, 3], timeout=120,
             what=lambda: f"3 Pods known on every node: {[local.node_status(n)['policy']['pods'] for n in NODES]}")
    assert {p["pod"]: (p["node"], p["ip"]) for p in local.status()["pods"]} == {
        "x/a": ("n1", a["ip"]), "y/b": ("n1", b["ip"]), "x/c": ("n3", c["ip"])}

    # The shared policy is enforced on n1 and logged there; `npaudit logs --config` reads n1's records.
    got = local.probe(b["netns"], [f"{a['ip']}:53/udp", f"{a['ip']}:80/tcp"])
    assert got == {f"{a['ip']}:53/udp": "timeout", f"{a['ip']}:80/tcp": "connected"}
    wait_for(lambda: any(r.get("labels", {}).get("log_label") == "cluster-drop" for r in local.audit_records("n1")),
             timeout=60, what="n1's record of the drop")
    res = npaudit("logs", "--config", local.config("n1"), "-o", "json")
    assert res.returncode == 0, res.stderr
    shown = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    drops = [r for r in shown if r.get("labels", {}).get("log_label") == "cluster-drop"]
    assert drops, res.stdout[-2000:]
    assert drops[0]["npaudit"]["source"]["pod"] == {"namespace": "y", "name": "b"}
    assert drops[0]["npaudit"]["destination"]["pod"] == {"namespace": "x", "name": "a"}
    assert local.audit_records("n2") == [] and local.audit_records("n3") == []

    # `npaudit trace --config` asks that node's agent: the drop is decided by the shared policy.
    res = npaudit("trace", "--from", "y/b", "--to", "x/a", "--protocol", "udp", "--port", "53", "-o", "json",
                  "--config", local.config("n1"))
    assert res.returncode == 1 and "drop-udp-x-from-y" in res.stdout, res.stdout + res.stderr
    res = npaudit("trace", "--from", "y/b", "--to", "x/a", "--port", "80", "-o", "json", "--config", local.config("n1"))
    assert res.returncode == 0 and json.loads(res.stdout)["outcome"]["result"] == "delivered", res.stdout + res.stderr

    # Down: every pid it started gone, every namespace it made gone, files left; a second down is fine.
    pids = [n["pid"] for n in local.status()["nodes"]]
    ovs_pids = [int(p.read_text()) for node in NODES for p in (local.dir / node / "ovs").glob("*.pid")]
    assert len(ovs_pids) == 6 and all(alive(p) for p in pids + ovs_pids)
    made = {n["netns"] for n in record["nodes"]} | {record["underlay_netns"]} | {
        p["netns"] for p in local.record()["pods"]}
    assert len(made) == 7 and made <= _netns()
    res = local.cluster("down")
    assert res.returncode == 0, res.stderr
    assert not any(alive(p) for p in pids + ovs_pids)
    assert made & _netns() == set()
    assert (local.dir / "n1" / "npaudit.yaml").exists() and (local.dir / "n1" / "agent.log").exists()
    res = local.cluster("down")
    assert res.returncode == 0, res.stderr
    st = local.status()
    assert [(n["alive"], n["ready"]) for n in st["nodes"]] == [(False, False)] * 3
