"""The Kubernetes source watches this node's Node object: its podCIDR is the node's Pod subnet."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from kubernetes import client

from policy_agent.cni.subnet import BAD_POD_CIDR, NO_POD_CIDR, NodeSubnet
from policy_agent.sources.kubernetes import KubernetesSource
from tests.support.fake_apiserver import NODES, FakeApiServer
from tests.support.fake_apiserver import server  # noqa: F401 (fixture)
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


async def _watch(server: FakeApiServer, subnet: NodeSubnet, script: Any) -> None:
    cfg = client.Configuration(host=server.url)
    cfg.proxy = None
    api = client.ApiClient(cfg)
    source = KubernetesSource(api, _NullEngine(), node_name=NODE, subnet=subnet)
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
