"""Every packet that reached the node is accounted, end to end: sent = in records + stated losses, exactly,
whatever the netdev datapath did with a burst.

An unpaced burst from a Pod overflows ovs-vswitchd's packet socket on the Pod's port (the thread that
reads it also runs the datapath and its upcalls); with the meters raised every packet is an upcall
and a packet-in, and the thread falls further behind. Either way the frames it never read are counted
by the kernel only, and the trail states them (port_socket_overflow, per port) beside what the meters
and the agent dropped: no datagram that left the Pod is missing from the sum. With OVS's queue of packet-ins
for the agent at its smallest, the packet-ins ovs-vswitchd emitted and then dropped there are stated too
(ovs_queue_overflow), as many as its own counter says.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any, Iterator

import jsonschema
import pytest

from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import SCHEMA
from tests.support.rule_flows import TWO_LOGGED_DROPS, logged_rule_flow_packets
from tests.support.udp_flood import send_flood

RULE = "drop-from-one"
BEFORE_PIPELINE = ("port_rx_dropped", "port_socket_overflow", "datapath_drop")



def flood_cluster(meters: str = "", packetin: str = "", ovs: str = "") -> Iterator[Cluster]:
    c = Cluster(extra_config="meters:\n  stats_interval: 0.5\n" + meters)
    if packetin:
        c.add_settings("packetin", packetin)
    if ovs:
        c.add_settings("ovs", ovs)
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture
def default_meters() -> Iterator[Cluster]:
    yield from flood_cluster()


@pytest.fixture
def raised_meters() -> Iterator[Cluster]:
    """The overload bench's settings: the deny meter and the agent's admission far above any flood here."""
    yield from flood_cluster("  policy_deny: {rate: 10000000, burst: 10000000}\n",
                             "policy: {rate: 1000000000, burst: 1000000000, queue_size: 65536}\n"
                             "fair_share: {enabled: false}\n")


@pytest.fixture
def small_ovs_queue() -> Iterator[Cluster]:
    """The meters and admission raised, and OVS's queue of packet-ins for the agent at 1 (OVS allows 1..512): a
    burst's packet-ins outrun the agent's reads inside ovs-vswitchd, which drops them (rconn_overflow)."""
    yield from flood_cluster("  policy_deny: {rate: 10000000, burst: 10000000}\n",
                             "policy: {rate: 1000000000, burst: 1000000000, queue_size: 65536}\n"
                             "fair_share: {enabled: false}\n", "controller_queue_size: 1\n")


def tally(records: list[dict[str, Any]]) -> tuple[int, dict[str, int], int]:
    """(packets in the rule's records, stated losses by reason (every unit but records), records refused)."""
    recorded, stated, refused = 0, {}, 0
    for r in records:
        if r["event"]["action"] == "audit-loss":
            for item in r["npaudit"]["loss"]["by_reason"]:
                if item["unit"] == "records":
                    refused += item["count"]
                else:
                    stated[item["reason"]] = stated.get(item["reason"], 0) + item["count"]
        elif r.get("rule", {}).get("name") == RULE:
            recorded += r["npaudit"]["aggregate"]["packets"]
    return recorded, stated, refused


def quiet_source(netns: str, target_ip: str, target_mac: str) -> None:
    """Only the flood leaves the source Pod: no IPv6 (router solicitations, MLD) and the target's address
    resolved for good (no ARP; a datagram to an unresolved neighbour dies in the Pod's own stack after
    sendto() said it left). The port's lost frames are then the flood's."""
    for cmd in (["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
                ["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
                ["ip", "neigh", "replace", target_ip, "lladdr", target_mac, "dev", "eth0", "nud", "permanent"]):
        subprocess.run(["ip", "netns", "exec", netns, *cmd], check=True, timeout=30)


def burst(cluster: Cluster, seconds: float) -> int:
    """Flood the logged Drop rule unpaced for `seconds`: the datagrams that left the Pod."""
    cluster.apply(TWO_LOGGED_DROPS)
    source = cluster.add_pod("one", "a", server=False)
    target = cluster.add_pod("target", "t")
    quiet_source(source.netns, target.ip, target.mac)
    time.sleep(1.0)  # what the Pod sent before (its first IPv6 frames) is through the port
    return send_flood(source.netns, target.ip, seconds, port=53)


def settle(cluster: Cluster, sent: int, timeout: float = 60.0) -> tuple[int, dict[str, int], int]:
    deadline = time.monotonic() + timeout
    while True:
        recorded, stated, refused = tally(cluster.audit_records())
        if recorded + sum(stated.values()) >= sent or time.monotonic() > deadline:
            time.sleep(1.5)  # a window or two more: nothing may be stated twice
            return tally(cluster.audit_records())
        time.sleep(0.5)


def check_exact(cluster: Cluster, sent: int) -> dict[str, int]:
    recorded, stated, refused = settle(cluster, sent)
    flows = logged_rule_flow_packets(cluster)
    print(f"sent {sent}: {recorded} in records, stated lost {stated}, records refused {refused}, flows {flows}")
    assert refused == 0
    assert recorded + sum(stated.values()) == sent, (sent, recorded, stated)
    assert stated.get("port_socket_overflow", 0) > 0, "the burst did not overflow the port: the test shows nothing"
    before = sum(stated.get(reason, 0) for reason in BEFORE_PIPELINE)
    assert sum(flows.values()) == sent - before, "what reached the pipeline is what its flows matched"
    cluster.stop_agent()
    records = cluster.audit_records()
    assert tally(records) == (recorded, stated, refused), "stopping stated more"
    for r in records:
        if r["event"]["action"] == "audit-loss":
            jsonschema.validate(r, SCHEMA)
    return stated


def test_an_unpaced_burst_is_accounted_exactly_with_the_frames_the_port_lost(default_meters: Cluster) -> None:
    sent = burst(default_meters, 1.0)
    stated = check_exact(default_meters, sent)
    assert stated.get("meter", 0) > 0


def test_with_the_meters_raised_the_frames_the_busy_datapath_never_read_are_stated(raised_meters: Cluster) -> None:
    sent = burst(raised_meters, 2.0)
    stated = check_exact(raised_meters, sent)
    assert stated.get("meter", 0) == 0 and stated.get("admission", 0) == 0, stated


def test_packet_ins_ovs_dropped_from_the_agents_full_queue_are_stated_in_the_trail(small_ovs_queue: Cluster) -> None:
    """Packet-ins OVS emitted but never sent, its queue for the agent full, are in no record: the trail states them
    (ovs_queue_overflow, from OVS's own counter), as many as OVS counted, and the burst still sums exactly."""
    overflow0 = small_ovs_queue.rconn_overflow()
    sent = burst(small_ovs_queue, 2.0)
    recorded, stated, refused = settle(small_ovs_queue, sent)
    dropped_by_ovs = small_ovs_queue.rconn_overflow() - overflow0
    print(f"sent {sent}: {recorded} in records, stated lost {stated}, records refused {refused}, "
          f"rconn_overflow {dropped_by_ovs}")
    assert dropped_by_ovs > 0, "OVS never dropped a packet-in from the agent's queue: the test shows nothing"
    assert stated.get("ovs_queue_overflow", 0) == dropped_by_ovs
    assert refused == 0
    assert recorded + sum(stated.values()) == sent, (sent, recorded, stated)
