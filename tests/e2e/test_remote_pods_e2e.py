"""Pods of other nodes, end to end on one node: the real agent with its node gateway, a "remote" Pod
known only from its Pod object (spec.nodeName another node, status.podIP in another node's subnet).

Each "remote" address lives in a namespace of its own, joined to the node's host side (the embedded
OVS's namespace) by a veth on 192.0.2.0/24 (TEST-NET-1); the route to it is in the node's namespace
only, and its route to the node's Pod subnet points at the node's end of the veth, so its packets
enter br-int through the gateway port as another node's would.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.support.cluster import SUBNET, Cluster
from tests.support.crossnode import labelled, wait_records
from tests.support.podnet import ip

REMOTE_IP, STRANGER_IP = "10.245.0.7", "10.245.0.8"  # another node's subnet: a Pod's address, and no one's


pytestmark = pytest.mark.cluster(gateway=True)


def remote_host(cluster: Cluster, address: str, link: int) -> str:
    """A namespace holding `address`, reached from the node's namespace over veth 192.0.2.<4 link>/30."""
    node_side, far_side = f"192.0.2.{4 * link + 1}", f"192.0.2.{4 * link + 2}"
    ns = cluster.linked_netns(f"rpt-{link}", f"{node_side}/30", f"{far_side}/30")
    ip("route", "add", f"{address}/32", "via", far_side, netns=cluster.node_netns)
    ip("addr", "add", f"{address}/32", "dev", "eth0", netns=ns)
    ip("route", "add", SUBNET, "via", node_side, "src", address, netns=ns)
    return ns


def remote_pod(name: str, node: str = "node-b") -> str:
    return textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}, namespace: y, labels: {{app: client}}}}
        spec: {{nodeName: {node}, containers: [{{name: c, image: client}}]}}
        status: {{podIP: {REMOTE_IP}, podIPs: [{{ip: {REMOTE_IP}}}]}}
        """)


POLICY = textwrap.dedent("""
    apiVersion: v1
    kind: Namespace
    metadata: {name: x}
    ---
    apiVersion: v1
    kind: Namespace
    metadata: {name: y}
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: clients-only}
    spec:
      tier: securityops
      priority: 1
      appliedTo: [{podSelector: {matchLabels: {app: server}}}]
      ingress:
      - name: allow-clients
        action: Allow
        enableLogging: true
        logLabel: clients
        from: [{podSelector: {matchLabels: {app: client}}, namespaceSelector: {}}]
        ports: [{protocol: TCP, port: 80}]
      - name: drop-rest
        action: Drop
        enableLogging: true
        logLabel: rest
        from: [{ipBlock: {cidr: 0.0.0.0/0}}]
    """)


def test_a_remote_pod_is_matched_by_its_labels_and_named_and_a_reused_address_takes_the_new_name(
        cluster: Cluster) -> None:
    cluster.apply(POLICY)
    cluster.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n"
                  "apiVersion: v1\nkind: Pod\nmetadata: {name: server, namespace: x, labels: {app: server}}\n")
    server = cluster.add_pod("x", "server")
    remote = remote_host(cluster, REMOTE_IP, 1)
    stranger = remote_host(cluster, STRANGER_IP, 2)
    target = f"{server.ip}:80/tcp"

    # Before its Pod object: the address is nobody's, so only the catch-all judges it.
    assert cluster.probe_from(remote, [target]) == {target: "timeout"}
    cluster.apply(remote_pod("client-1"))
    assert cluster.probe_from(remote, [target]) == {target: "connected"}
    assert cluster.probe_from(stranger, [target]) == {target: "timeout"}

    records = wait_records(cluster, lambda rs: len(labelled(rs, "clients")) >= 1 and any(
        r["source"]["ip"] == STRANGER_IP for r in labelled(rs, "rest")))
    allowed = labelled(records, "clients")
    assert len(allowed) == 1, records
    assert allowed[0]["source"]["ip"] == REMOTE_IP and allowed[0]["event"]["action"] == "allowed"
    assert allowed[0]["npaudit"]["source"]["pod"] == {"namespace": "y", "name": "client-1"}
    assert allowed[0]["npaudit"]["destination"]["pod"] == {"namespace": "x", "name": "server"}
    for r in labelled(records, "rest"):  # the address no Pod holds: dropped, named by no one
        assert r["event"]["action"] == "dropped" and r["source"]["ip"] in (REMOTE_IP, STRANGER_IP)
        assert "pod" not in r["npaudit"].get("source", {}), r
    assert any(r["source"]["ip"] == STRANGER_IP for r in labelled(records, "rest"))

    # The Pod goes; another one on another node gets its address: records name only the new one.
    cluster.apply(remote_pod("client-1"), op="delete")
    assert cluster.probe_from(remote, [target]) == {target: "timeout"}
    cluster.apply(remote_pod("client-2", node="node-c"))
    assert cluster.probe_from(remote, [target]) == {target: "connected"}
    records = wait_records(cluster, lambda rs: len(labelled(rs, "clients")) >= 2)
    allowed = labelled(records, "clients")
    assert len(allowed) == 2, records
    assert allowed[1]["npaudit"]["source"]["pod"] == {"namespace": "y", "name": "client-2"}
    after_delete = records[records.index(allowed[0]) + 1:]  # the audit file is in write order
    assert not any(r.get("npaudit", {}).get("source", {}).get("pod", {}).get("name") == "client-1"
                   for r in after_delete), after_delete
