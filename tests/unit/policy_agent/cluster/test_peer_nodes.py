"""The other nodes from Node objects: which become peers, which are refused and why, each problem
logged and counted once per node and change, and the merged set handed on only when it changes."""

from __future__ import annotations

import logging
from typing import Any, Sequence

import pytest
from prometheus_client import CollectorRegistry

from policy_agent.cluster.nodes import PeerNode
from policy_agent.cluster.peer_nodes import (
    BAD_POD_CIDR, NO_ADDRESS, NO_POD_CIDR, OVERLAP, POD_OUTSIDE, KnownNodes, KnownNodesCollector, NodeProblem,
    node_address, peers_from_nodes,
)


def node(name: str, cidr: str | None = None, *addresses: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"podCIDR": cidr, "podCIDRs": [cidr]} if cidr else {},
            "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}


INTERNAL = ("InternalIP", "192.0.2.11")


class Routes:
    """A downstream PeerSink recording every set it is handed."""

    def __init__(self) -> None:
        self.sets: list[tuple[str, list[PeerNode]]] = []

    def set_peers(self, source: str, peers: Sequence[PeerNode]) -> None:
        self.sets.append((source, list(peers)))


def test_internal_ip_is_the_address_else_external_and_never_ipv6() -> None:
    assert node_address(node("b", None, ("Hostname", "b"), ("ExternalIP", "203.0.113.5"),
                             ("InternalIP", "fd00::5"), ("InternalIP", "192.0.2.5"))) == "192.0.2.5"
    assert node_address(node("b", None, ("Hostname", "b"), ("ExternalIP", "203.0.113.5"))) == "203.0.113.5"
    assert node_address(node("b", None, ("InternalIP", "fd00::5"), ("InternalIP", "not-an-ip"))) is None
    assert node_address({"metadata": {"name": "b"}, "status": "junk"}) is None


def test_peers_are_the_other_nodes_with_a_subnet_and_an_address() -> None:
    nodes = [node("a", "10.244.0.0/24", ("InternalIP", "192.0.2.10")),
             node("c", "10.244.2.0/24", ("InternalIP", "192.0.2.12")),
             node("b", "10.244.1.0/24", ("ExternalIP", "203.0.113.11"))]
    peers, problems = peers_from_nodes(nodes, "a")
    assert peers == [PeerNode("b", "10.244.1.0/24", "203.0.113.11"), PeerNode("c", "10.244.2.0/24", "192.0.2.12")]
    assert problems == []


def test_a_node_without_subnet_or_address_or_with_a_bad_subnet_is_a_problem_not_a_peer() -> None:
    nodes = [node("b", None, INTERNAL), node("c", "10.244.2.0/24"), node("d", "10.244.3.7/24", INTERNAL),
             node("e", "fd00:10::/64", INTERNAL), node("f", "10.244.5.0/24", ("InternalIP", "192.0.2.15")),
             {"metadata": "junk"}, {"spec": {"podCIDR": 7}}]
    peers, problems = peers_from_nodes(nodes, "a")
    assert peers == [PeerNode("f", "10.244.5.0/24", "192.0.2.15")]
    assert [(p.node, p.reason) for p in problems] == [
        ("b", NO_POD_CIDR), ("c", NO_ADDRESS), ("d", BAD_POD_CIDR), ("e", BAD_POD_CIDR)]


def test_overlapping_subnets_the_node_seen_first_keeps_its_routes(caplog: pytest.LogCaptureFixture) -> None:
    routes = Routes()
    known = KnownNodes(lambda: "10.244.0.0/24", routes)
    b, c = PeerNode("b", "10.244.1.0/24", "192.0.2.11"), PeerNode("c", "10.244.2.0/24", "192.0.2.12")
    known.set_peers("kubernetes", [b, c])
    assert routes.sets == [("merged", [b, c])]
    # A later node claiming b's subnet (a wider one) and one claiming ours: both refused, b and c unaffected.
    late = PeerNode("a0", "10.244.0.0/16", "192.0.2.9")
    mine = PeerNode("z", "10.244.0.128/25", "192.0.2.20")
    with caplog.at_level(logging.ERROR):
        known.set_peers("kubernetes", [late, b, c, mine])
        known.set_peers("kubernetes", [late, b, c, mine])  # the same again: nothing new to say
    assert known.peers == [b, c] and len(routes.sets) == 1
    assert known.problems[OVERLAP] == 2
    assert "node a0: Pod subnet 10.244.0.0/16 overlaps this node's 10.244.0.0/24" in caplog.text
    assert "node z: Pod subnet 10.244.0.128/25 overlaps this node's 10.244.0.0/24" in caplog.text
    assert caplog.text.count("cluster: node") == 2
    # b and the refused ones go: c stays, and the routes hear of it.
    known.set_peers("kubernetes", [c])
    assert routes.sets[-1] == ("merged", [c])


def test_between_two_new_overlapping_nodes_the_earlier_name_wins_and_history_then_decides() -> None:
    known = KnownNodes()
    x, y = PeerNode("x", "10.9.0.0/24", "192.0.2.1"), PeerNode("y", "10.9.0.0/25", "192.0.2.2")
    known.set_peers("kubernetes", [y])
    known.set_peers("kubernetes", [x, y])  # x sorts first, but y was there before it
    assert known.peers == [y]
    assert [(p["node"], p["reason"]) for p in known.status()["problems"]] == [("x", OVERLAP)]


def test_sources_merge_and_the_first_source_to_name_a_node_wins() -> None:
    routes = Routes()
    known = KnownNodes(downstream=routes)
    known.set_peers("config", [PeerNode("b", "10.244.1.0/24", "192.0.2.11")])
    known.set_peers("kubernetes", [PeerNode("b", "10.244.1.0/24", "192.0.2.99"),
                                   PeerNode("c", "10.244.2.0/24", "192.0.2.12")])
    assert known.peers == [PeerNode("b", "10.244.1.0/24", "192.0.2.11"), PeerNode("c", "10.244.2.0/24", "192.0.2.12")]
    known.set_peers("config", [])
    assert routes.sets[-1][1] == [PeerNode("b", "10.244.1.0/24", "192.0.2.99"),
                                  PeerNode("c", "10.244.2.0/24", "192.0.2.12")]


def test_a_problem_is_logged_and_counted_once_per_node_and_change(caplog: pytest.LogCaptureFixture) -> None:
    known = KnownNodes()
    no_cidr = NodeProblem("b", NO_POD_CIDR, "no spec.podCIDR")
    with caplog.at_level(logging.INFO):
        for _ in range(3):  # a Node's watch events with nothing new in them
            known.set_peers("kubernetes", [], [no_cidr])
        assert known.problems[NO_POD_CIDR] == 1 and caplog.text.count("node b: no spec.podCIDR") == 1
        known.set_peers("kubernetes", [PeerNode("b", "10.244.1.0/24", "192.0.2.11")])  # it got one
        assert "node b: no longer a problem" in caplog.text
        known.set_peers("kubernetes", [], [no_cidr])  # and lost it again: a change, said again
    assert known.problems[NO_POD_CIDR] == 2


def test_a_pod_address_outside_every_node_subnet_is_counted_once_and_checked_when_nodes_arrive(
        caplog: pytest.LogCaptureFixture) -> None:
    own = {"cidr": ""}
    known = KnownNodes(lambda: own["cidr"])
    with caplog.at_level(logging.ERROR):
        # Pods listed before any Node: nothing is known to be outside yet.
        known.pods_changed([(("x", "a"), ("10.244.0.5",)), (("y", "b"), ("10.244.1.5",)),
                            (("z", "c"), ("172.16.0.9",)), (("z", "d"), ())])
        assert known.problems[POD_OUTSIDE] == 0
        own["cidr"] = "10.244.0.0/24"
        known.refresh()  # this node's subnet alone: the other nodes not listed yet, nothing judged
        assert known.problems[POD_OUTSIDE] == 0
        known.set_peers("kubernetes", [PeerNode("n2", "10.244.1.0/24", "192.0.2.12")])
        assert known.problems[POD_OUTSIDE] == 1
        assert known.status()["pods_outside"] == 1
        # The same Pod again (a label change): not said again; another address outside: said.
        known.pods_changed([(("z", "c"), ("172.16.0.9",))])
        assert known.problems[POD_OUTSIDE] == 1
        known.pods_changed([(("z", "c"), ("172.16.0.10",))])
        assert known.problems[POD_OUTSIDE] == 2
        known.pods_changed([], gone=[("z", "c")])
        assert known.status()["pods_outside"] == 0
    assert caplog.text.count("outside every node's Pod subnet") == 2
    assert "Pod z/c has address 172.16.0.9 outside" in caplog.text


def test_metrics_count_the_nodes_routed_and_the_problems_by_reason() -> None:
    known = KnownNodes(lambda: "10.244.0.0/24")
    registry = CollectorRegistry()
    registry.register(KnownNodesCollector(known))
    known.set_peers("kubernetes", [PeerNode("b", "10.244.1.0/24", "192.0.2.11"),
                                   PeerNode("c", "10.244.1.0/25", "192.0.2.12")],
                    [NodeProblem("d", NO_ADDRESS, "no address")])
    assert registry.get_sample_value("npaudit_cluster_nodes") == 1
    assert registry.get_sample_value("npaudit_cluster_node_problems_total", {"reason": OVERLAP}) == 1
    assert registry.get_sample_value("npaudit_cluster_node_problems_total", {"reason": NO_ADDRESS}) == 1
    assert registry.get_sample_value("npaudit_cluster_node_problems_total", {"reason": NO_POD_CIDR}) == 0
