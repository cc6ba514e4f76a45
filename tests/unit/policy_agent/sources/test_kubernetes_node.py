"""The Kubernetes source watches this node's Node object: its podCIDR is the node's Pod subnet."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from kubernetes import client

from policy_agent.cluster.nodes import PeerNode
from policy_agent.cluster.peer_nodes import NO_ADDRESS, POD_OUTSIDE, KnownNodes
from policy_agent.cni.subnet import BAD_POD_CIDR, NO_POD_CIDR, NodeSubnet
from policy_agent.sources.kubernetes import KubernetesSource
from tests.support.fake_apiserver import NODES, FakeApiServer
from tests.support.fake_apiserver import server  # noqa: F401 (fixture)
from tests.support.k8s_objects import node
from tests.support.waiting import eventually

NODE = "node-a"


class _NullEngine:
    async def apply(self, **objects: Any) -> None:
        pass

    async def delete(self, **objects: Any) -> None:
        pass


def _node(name: str, cidr: str | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": "5"},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]} if cidr else {}}


async def _watch(server: FakeApiServer, subnet: NodeSubnet, script: Any, peers: KnownNodes | None = None) -> None:
    cfg = client.Configuration(host=server.url)
    cfg.proxy = None
    api = client.ApiClient(cfg)
    source = KubernetesSource(api, _NullEngine(), node_name=NODE, subnet=subnet, peers=peers)
    source.start()
    try:
        await asyncio.wait_for(source.synced.wait(), 5)
        await script(source)
    finally:
        await source.close()
        api.close()


def test_the_subnet_is_this_nodes_node_objects_and_a_changed_one_is_refused(  # noqa: F811
        server: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    server.set_items(NODES, [_node("node-b", "10.244.2.0/24"), _node(NODE, "10.244.1.0/24")], "4")
    subnet = NodeSubnet()

    async def script(source: KubernetesSource) -> None:
        assert (subnet.cidr, subnet.gateway) == ("10.244.1.0/24", "10.244.1.1")  # before synced is set
        server.send(NODES, "MODIFIED", _node("node-b", "10.244.9.0/24"))  # another node: not ours
        # Kubernetes never changes a Node's podCIDR; a Node made again with another one is refused.
        server.send(NODES, "MODIFIED", _node(NODE, "10.244.5.0/24"))
        server.send(NODES, "MODIFIED", {**_node(NODE, "10.244.5.0/24"), "status": {"conditions": []}})
        await eventually(lambda: subnet.problems[BAD_POD_CIDR] >= 1, timeout=5)
        server.send(NODES, "MODIFIED", _node("node-b", "10.244.8.0/24"))  # the events after it were taken
        await eventually(lambda: source.node is not None and source.node.queue.empty(), timeout=5)
        await asyncio.sleep(0.05)

    with caplog.at_level(logging.ERROR):
        asyncio.run(_watch(server, subnet, script))
    assert subnet.cidr == "10.244.1.0/24"
    # Once for the change, not once per event of the same Node.
    assert subnet.problems[BAD_POD_CIDR] == 1
    assert f"Node {NODE} podCIDR changed from 10.244.1.0/24 to 10.244.5.0/24: refused" in caplog.text
    # Every Node is watched: no selector narrows them to this one.
    assert {q.get("fieldSelector") for p, q in server.requests if p == NODES} == {None}


def test_a_node_without_pod_cidr_is_logged_and_counted(server: FakeApiServer,  # noqa: F811
                                                       caplog: pytest.LogCaptureFixture) -> None:
    server.set_items(NODES, [_node(NODE, None)], "4")
    subnet = NodeSubnet()

    async def script(source: KubernetesSource) -> None:
        assert subnet.cidr == "" and subnet.problems[NO_POD_CIDR] == 1
        server.send(NODES, "MODIFIED", _node(NODE, "10.244.3.0/24"))  # the node IPAM assigns one later
        await eventually(lambda: subnet.cidr == "10.244.3.0/24", timeout=5)

    with caplog.at_level(logging.ERROR):
        asyncio.run(_watch(server, subnet, script))
    assert f"Node {NODE} has no spec.podCIDR" in caplog.text and "Traceback" not in caplog.text


def test_the_other_nodes_become_peers_and_follow_their_node_objects(server: FakeApiServer,  # noqa: F811
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    server.set_items(NODES, [node(NODE, "10.244.1.0/24", "192.0.2.10"), node("node-b", "10.244.2.0/24", "192.0.2.11"),
                             node("node-c", "10.244.3.0/24")], "4")
    subnet = NodeSubnet()
    known = KnownNodes(lambda: subnet.cidr)
    subnet.subscribe(lambda _cidr: known.refresh())

    async def script(source: KubernetesSource) -> None:
        assert known.peers == [PeerNode("node-b", "10.244.2.0/24", "192.0.2.11")]  # before synced is set
        for rv in ("5", "6", "7"):  # heartbeats: nothing read changes, nothing said again
            server.send(NODES, "MODIFIED", node("node-c", "10.244.3.0/24", rv=rv))
        server.send(NODES, "ADDED", node("node-d", "10.244.4.0/24", "192.0.2.13"))
        await eventually(lambda: len(known.peers) == 2, timeout=5)
        server.send(NODES, "DELETED", node("node-b", "10.244.2.0/24", "192.0.2.11"))
        server.send(NODES, "MODIFIED", node("node-c", "10.244.3.0/24", "192.0.2.12"))  # it got an address
        await eventually(lambda: [p.name for p in known.peers] == ["node-c", "node-d"], timeout=5)

    with caplog.at_level(logging.ERROR):
        asyncio.run(_watch(server, subnet, script, peers=known))
    assert known.problems[NO_ADDRESS] == 1 and caplog.text.count("node node-c: no IPv4") == 1
    assert known.status()["problems"] == []


def test_pods_in_no_nodes_subnet_are_counted_once_the_nodes_are_listed(server: FakeApiServer) -> None:  # noqa: F811
    # The recorded Pods: node-a's in 10.10.0.0/24, node-b's in 10.10.1.0/24.
    server.set_items(NODES, [node(NODE, "10.10.0.0/24", "192.0.2.10"), node("node-b", "10.10.8.0/24", "192.0.2.11")],
                     "4")
    subnet = NodeSubnet()
    known = KnownNodes(lambda: subnet.cidr)
    subnet.subscribe(lambda _cidr: known.refresh())

    async def script(source: KubernetesSource) -> None:
        await eventually(lambda: known.problems[POD_OUTSIDE] == 2, timeout=5)  # node-b's two Pods
        server.send(NODES, "MODIFIED", node("node-b", "10.10.1.0/24", "192.0.2.11"))
        await eventually(lambda: known.status()["pods_outside"] == 0, timeout=5)

    asyncio.run(_watch(server, subnet, script, peers=known))
    assert known.problems[POD_OUTSIDE] == 2
