"""Traffic between nodes, end to end: two nodes on this machine (tests/support/multinode.py), each its
own agent and embedded OVS, joined by an underlay bridge; Geneve by default, routed as the option.

Policy across nodes: egress judged (and recorded) on the source Pod's node before the tunnel,
ingress on the destination Pod's node after it; each node names both Pods from the Pod objects
applied on it, in its own audit file with its own observer.hostname.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.crossnode import connect, labelled, place_pods, pod_objects, udp_arrivals, wait_records
from tests.support.multinode import MultiNode, node_ip

MTU_1500_GENEVE = 1450  # cluster.underlay_mtu 1500 less Geneve's 50 bytes


@pytest.fixture
def geneve() -> Iterator[MultiNode]:
    with MultiNode(2, "geneve") as m:
        yield m


def test_pods_on_two_nodes_talk_tcp_and_udp_through_geneve_and_a_full_mtu_bulk_transfer_arrives_whole(
        geneve: MultiNode) -> None:
    n1, n2 = geneve.nodes[1], geneve.nodes[2]
    a = n1.add_pod("x", "a")
    b = n2.add_pod("y", "b")
    assert a.ip.startswith("10.246.1.") and b.ip.startswith("10.246.2.")
    # Each agent resolved the other node's underlay next hop for its OVS when it added the peer, so no
    # first packet is lost to OVS's own ARP (tests/e2e/test_tunnel_first_packet_e2e.py sends lone datagrams);
    # every first connection goes through, a single UDP datagram too, both ways (a Pod's ARP for its
    # gateway is answered by OVS alone: policy_agent/cni/rtnl.py, NOARP).
    t80 = f"{b.ip}:80/tcp"
    assert n1.probe("x/a", [t80], timeout=3.0) == {t80: "connected"}
    u53 = f"{b.ip}:53/udp"
    assert n1.probe("x/a", [u53], timeout=2.0) == {u53: "connected"}
    back = [f"{a.ip}:81/tcp", f"{a.ip}:53/udp"]
    assert n2.probe("y/b", back, timeout=2.0) == {t: "connected" for t in back}
    # The tunnel really carried it: the peer routes on both sides counted packets (OVS folds the
    # datapath's counts into its flows' statistics about once a second).
    for c in (n1, n2):
        deadline = time.monotonic() + 15
        while not [f for f in c.flows() if "->tun_dst" in f and not re.search(r"n_packets=0,", f)]:
            assert time.monotonic() < deadline, c.flows()
            time.sleep(0.5)

    # Pod interfaces leave room for Geneve's headers; a bulk transfer moves full-size segments across.
    assert geneve.link_mtu(a.netns) == MTU_1500_GENEVE and geneve.link_mtu(b.netns) == MTU_1500_GENEVE
    geneve.bulk_sink(2, b, 9000)
    total = 8 * 1024 * 1024
    got, mss = geneve.bulk_send(a, b.ip, 9000, total)
    assert got == total
    # Full-MTU segments (MTU less IPv4 and TCP headers, less 12 bytes when timestamps are on),
    # not a path squeezed by a smaller MTU somewhere.
    assert MTU_1500_GENEVE - 40 - 12 <= mss <= MTU_1500_GENEVE - 40


def send_through_tunnel(c: Cluster, frame: bytes, peer_address: str, vni: int) -> None:
    """`frame` into node `c`'s tunnel to the node at `peer_address` with Geneve VNI `vni` (an OpenFlow
    packet-out by an independent client, as a node of another version would send it)."""
    spec = (f"in_port=controller packet={frame.hex()} "
            f"actions=set_field:{peer_address}->tun_dst,set_field:{vni}->tun_id,output:1")
    subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "packet-out", f"unix:{c.dir / 'ovs' / 'br-int.mgmt'}", spec],
                   check=True, capture_output=True)


def test_a_packet_from_the_tunnel_with_a_vni_other_than_0_reaches_no_pod_and_is_counted_and_stated(geneve: MultiNode) -> None:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    n1, n2 = geneve.nodes[1], geneve.nodes[2]
    a = n1.add_pod("x", "a")
    b = n2.add_pod("y", "b")
    t = f"{b.ip}:80/tcp"
    assert n1.probe("x/a", [t], timeout=3.0) == {t: "connected"}  # the underlay neighbour is resolved
    frame = bytes(Ether(src=a.mac, dst="02:00:00:00:00:01") / IP(src=a.ip, dst=b.ip) / UDP(sport=40000, dport=9)
                  / b"unknown vni")

    def arrived(vni: int) -> int:
        before = udp_arrivals(b.netns)
        send_through_tunnel(n1, frame, node_ip(2), vni)
        time.sleep(1.0)
        return udp_arrivals(b.netns) - before

    assert arrived(0) == 1  # the way in works: VNI 0 is Pod traffic
    # A VNI node 2 does not know (a newer node's mark; 0x7FFFFC is next to the trace marks) reaches no Pod.
    assert arrived(5) == 0 and arrived(0x7FFFFC) == 0
    dropped = [f for f in n2.flows() if "table=0" in f and "priority=99" in f and "in_port=1" in f]
    assert len(dropped) == 1 and "n_packets=2," in dropped[0], dropped
    deadline = time.monotonic() + 15  # read once per meters.stats_interval (5 s)
    while geneve.metric(2, "npaudit_cluster_unknown_vni_drops_total") != 2:
        assert time.monotonic() < deadline, geneve.metric(2, "npaudit_cluster_unknown_vni_drops_total")
        time.sleep(0.5)
    assert "packets from the tunnel dropped before any rule since start: their Geneve VNI" in n2.log()
    # No record can hold them (no rule saw them): node 2's trail states both as losses, so what was sent
    # there adds up to its records and its stated losses.
    def vni_losses(records: list[dict]) -> int:
        return sum(b["count"] for r in records if r.get("event", {}).get("action") == "audit-loss"
                   for b in r["npaudit"]["loss"]["by_reason"] if b["reason"] == "unknown_vni")

    records = wait_records(n2, lambda rs: vni_losses(rs) >= 2)
    assert vni_losses(records) == 2, records
    assert all(b["source"] == "tunnel" and b["unit"] == "frames" for r in records
               if r.get("event", {}).get("action") == "audit-loss"
               for b in r["npaudit"]["loss"]["by_reason"] if b["reason"] == "unknown_vni")


def test_egress_is_judged_on_the_source_node_and_ingress_on_the_destination_each_node_recording_both_pods(
        geneve: MultiNode) -> None:
    n1, n2 = geneve.nodes[1], geneve.nodes[2]
    a, b = place_pods(geneve)
    t80, t81, t82 = (f"{b.ip}:{p}/tcp" for p in (80, 81, 82))
    assert n1.probe("x/client", [t80], timeout=3.0) == {t80: "connected"}
    # Dropped by the client's egress rule on node 1: never reaches node 2.
    assert n1.probe("x/client", [t81], timeout=2.0) == {t81: "timeout"}
    # Rejected by the server's ingress rule on node 2: the RST comes back through the tunnel.
    assert n1.probe("x/client", [t82], timeout=5.0) == {t82: "refused"}

    both = {"source": {"namespace": "x", "name": "client"}, "destination": {"namespace": "y", "name": "server"}}

    def pods_of(r: dict) -> dict:
        return {side: r["npaudit"][side]["pod"] for side in ("source", "destination")}

    r1 = wait_records(n1, lambda rs: bool(labelled(rs, "egress-drop")) and bool(labelled(rs, "egress-allow")))
    r2 = wait_records(n2, lambda rs: bool(labelled(rs, "ingress-allow")) and bool(labelled(rs, "ingress-reject")))
    drop = labelled(r1, "egress-drop")
    assert drop and all(r["event"]["action"] == "dropped" and pods_of(r) == both for r in drop), r1
    assert drop[0]["destination"]["port"] == 81 and drop[0]["observer"]["hostname"] == "node-1"
    # The connection on port 80, judged at both ends: records on each node, each with its own hostname
    # (a SYN sent again is judged again: a connection may have two).
    allow1, allow2 = labelled(r1, "egress-allow"), labelled(r2, "ingress-allow")
    assert allow1 and allow2, (r1, r2)
    assert all(pods_of(r) == both and r["observer"]["hostname"] == "node-1" for r in allow1), allow1
    assert all(pods_of(r) == both and r["observer"]["hostname"] == "node-2" for r in allow2), allow2
    assert {r["source"]["port"] for r in allow1} & {r["source"]["port"] for r in allow2}  # the same connection
    reject = labelled(r2, "ingress-reject")
    assert reject and reject[0]["event"]["action"] == "rejected" and pods_of(reject[0]) == both
    # What one node judged, the other never records.
    assert not labelled(r2, "egress-drop") and not labelled(r2, "egress-allow")
    assert not labelled(r1, "ingress-allow") and not labelled(r1, "ingress-reject")


@pytest.fixture
def routed() -> Iterator[MultiNode]:
    with MultiNode(2, "routed") as m:
        yield m


def test_routed_mode_carries_pod_traffic_unmasqueraded_and_policy_still_judges_both_ends(routed: MultiNode) -> None:
    n1, n2 = routed.nodes[1], routed.nodes[2]
    a, b = place_pods(routed)
    assert routed.link_mtu(a.netns) == 1500  # no encapsulation, no overhead
    targets = [f"{b.ip}:80/tcp", f"{b.ip}:53/udp"]
    # Routed, the kernels hold a first packet while they resolve the next hop: nothing is lost, no retry.
    assert n1.probe("x/client", targets, timeout=2.0) == {t: "connected" for t in targets}
    t81 = f"{b.ip}:81/tcp"
    assert n1.probe("x/client", [t81], timeout=2.0) == {t81: "timeout"}
    r2 = wait_records(n2, lambda rs: bool(labelled(rs, "ingress-allow")))
    allow = labelled(r2, "ingress-allow")
    # The server's node sees the client's own address (not node 1's): no masquerade between nodes.
    assert allow and allow[0]["source"]["ip"] == a.ip, r2
    assert allow[0]["npaudit"]["source"]["pod"] == {"namespace": "x", "name": "client"}
    r1 = wait_records(n1, lambda rs: bool(labelled(rs, "egress-drop")))
    assert labelled(r1, "egress-drop")[0]["observer"]["hostname"] == "node-1"


def test_a_peer_with_an_unreachable_address_is_logged_and_counted_the_other_peer_works_and_a_restart_keeps_it() -> None:
    # (Overlapping peers in the config stop the start naming the field; those a live source hands
    # over are refused one by one: tests/unit/policy_agent/ovs/test_tunnel.py.)
    with MultiNode(2, "geneve", extra_peers={1: "  - {name: node-far, pod_cidr: '10.246.9.0/24', address: '203.0.113.9'}\n"}) as m:
        n1, n2 = m.nodes[1], m.nodes[2]
        n1.add_pod("x", "a")
        b = n2.add_pod("y", "b")
        t = f"{b.ip}:80/tcp"
        assert n1.probe("x/a", [t], timeout=3.0) == {t: "connected"}
        log = n1.log()
        assert "peer node-far at 203.0.113.9 is unreachable" in log, log
        assert "Traceback" not in log
        assert m.metric(1, "npaudit_cluster_peers", 'state="unreachable"') == 1
        assert m.metric(1, "npaudit_cluster_peers", 'state="refused"') == 0
        assert m.metric(1, "npaudit_cluster_peers", 'state="routed"') == 2  # node-2 and node-far
        assert m.metric(1, "npaudit_cluster_peer_problems_total", 'reason="unreachable"') == 1
        assert m.metric(2, "npaudit_cluster_peers", 'state="routed"') == 1
        # A restart of node 1's agent finds its underlay as it left it and routes again.
        n1.stop_agent()
        n1.start(120)
        assert connect(n1, "x/a", [t]) == {t: "connected"}
        assert "Traceback" not in n1.log()


def test_with_deny_unknown_sources_a_pod_of_another_node_reaches_this_one_only_once_its_object_is_here() -> None:
    with MultiNode(2, "geneve", deny_unknown_sources=True) as m:
        n1, n2 = m.nodes[1], m.nodes[2]
        a = n1.add_pod("x", "a")
        b = n2.add_pod("y", "b")
        # Node 2 knows no Pod of node 1 yet: a's new connections are dropped at the tunnel, before any rule.
        t = f"{b.ip}:80/tcp"
        assert connect(n1, "x/a", [t], timeout=6.0) == {t: "timeout"}
        n2.apply(pod_objects({"x/a": (a, 1, "client")}))
        assert connect(n1, "x/a", [t]) == {t: "connected"}  # (b's answers pass node 1: established)
        # The other way, node 1 still knows nothing of b: b's SYN never gets past node 1's tunnel port.
        back = f"{a.ip}:80/tcp"
        assert connect(n2, "y/b", [back], timeout=6.0) == {back: "timeout"}
        dropped = [f for f in n1.flows() if "table=25" in f and "priority=40" in f and "in_port=1" in f]
        assert dropped and not re.search(r"n_packets=0,", dropped[0]), dropped
