"""The first packet towards a peer node, end to end: a lone UDP datagram (a DNS query to a CoreDNS Pod
on another node) is sent once, never again, so nothing may lose it while the way to the peer is
found. Two nodes on this machine (tests/support/multinode.py), Geneve and routed.

Geneve on the userspace datapath: OVS resolves the peer's underlay address itself, and drops the
packet that made it ask; the agent resolves every peer's next hop when the peer is added (and keeps
it resolved), so no Pod packet is the one that asks. Routed: the kernel holds a packet while it
resolves the next hop.
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.support.crossnode import datagram_arrives
from tests.support.multinode import MultiNode
from tests.support.waiting import wait_for


@pytest.fixture
def geneve() -> Iterator[MultiNode]:
    with MultiNode(2, "geneve") as m:
        yield m


def test_through_a_fresh_geneve_tunnel_the_first_lone_udp_datagram_arrives_both_ways(geneve: MultiNode) -> None:
    n1, n2 = geneve.nodes[1], geneve.nodes[2]
    a = n1.add_pod("x", "client", server=False)
    b = n2.add_pod("y", "dns", server=False)
    # No Pod packet crossed the underlay yet: each datagram is the first towards its peer, sent once.
    assert datagram_arrives(a.netns, b.netns, b.ip, 53), "node 1's first datagram to node 2 was lost"
    assert datagram_arrives(b.netns, a.netns, a.ip, 53), "node 2's first datagram to node 1 was lost"


def test_routed_the_first_lone_udp_datagram_to_another_node_arrives_both_ways() -> None:
    with MultiNode(2, "routed") as m:
        a = m.nodes[1].add_pod("x", "client", server=False)
        b = m.nodes[2].add_pod("y", "dns", server=False)
        assert datagram_arrives(a.netns, b.netns, b.ip, 53), "node 1's first datagram to node 2 was lost"
        assert datagram_arrives(b.netns, a.netns, a.ip, 53), "node 2's first datagram to node 1 was lost"


@pytest.mark.parametrize("refresh", [1, 3000])
def test_an_idle_peers_next_hop_is_kept_resolved_past_ovs_aging_and_a_refresh_too_rare_loses_the_datagram(
        refresh: int) -> None:
    # OVS forgets a tunnel neighbour unused for tnl/neigh/aging seconds (900 by default; 2 here). Refreshed
    # every second, node 2 stays known however long the nodes are idle; refreshed every 3000 s (the degraded
    # path, said at start), the entry lapses and the first datagram after the idle time is lost again.
    with MultiNode(2, "geneve", cluster_settings=f"underlay_refresh: {refresh}") as m:
        n1, n2 = m.nodes[1], m.nodes[2]
        a = n1.add_pod("x", "client", server=False)
        b = n2.add_pod("y", "dns", server=False)
        for c in (n1, n2):
            assert "OK" in c.ovs_appctl("tnl/neigh/aging", "2")
        wait_for(lambda: m.metric(1, "npaudit_cluster_peers", 'state="unresolved"') == 0, timeout=30,
                 what="node 1 resolving node 2's next hop")
        time.sleep(5)  # idle: more than twice the aging, no packet between the nodes
        assert datagram_arrives(a.netns, b.netns, b.ip, 53) is (refresh == 1)
        said = "is not shorter than OVS's tnl/neigh/aging" in n1.log()
        assert said is (refresh == 3000)
