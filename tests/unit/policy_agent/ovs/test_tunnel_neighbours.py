"""Peers' underlay next hops for OVS's userspace tunnel: OVS's route answer read, ARP frames checked against
scapy and fuzzed, and TunnelNeighbours against a fake unixctl and a fake ARP exchange."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import pytest
from hypothesis import given, strategies as st

from policy_agent.errors import OvsError
from policy_agent.ovs.tunnel_neighbours import (NextHop, TunnelNeighbours, arp_reply, arp_request, garp, next_hop,
                                                parse_aging)

MAC = bytes.fromhex("020000000001")


def test_ovs_route_answers_give_the_bridge_and_the_peer_or_the_gateway_towards_it() -> None:
    on_link = "src 198.51.100.1\ngateway ::\ndev br-phy\n"
    assert next_hop("198.51.100.2", on_link) == NextHop("br-phy", "198.51.100.2", "198.51.100.1")
    routed = "src 198.51.100.1\ngateway 198.51.100.254\ndev br-phy\n"
    assert next_hop("203.0.113.9", routed) == NextHop("br-phy", "198.51.100.254", "198.51.100.1")
    mapped = "src ::ffff:198.51.100.1\ngateway ::ffff:198.51.100.254\ndev br-ex\n"
    assert next_hop("203.0.113.9", mapped) == NextHop("br-ex", "198.51.100.254", "198.51.100.1")
    with pytest.raises(ValueError, match="no route to 203.0.113.9"):
        next_hop("203.0.113.9", "")
    assert parse_aging("900\n") == 900


def test_the_arp_request_and_the_gratuitous_arp_are_what_scapy_reads() -> None:
    from scapy.layers.l2 import ARP, Ether

    req = Ether(arp_request(MAC, "198.51.100.1", "198.51.100.2"))
    assert req.dst == "ff:ff:ff:ff:ff:ff" and req.src == "02:00:00:00:00:01" and req.type == 0x0806
    a = req[ARP]
    assert (a.op, a.hwsrc, a.psrc, a.hwdst, a.pdst) == (1, "02:00:00:00:00:01", "198.51.100.1",
                                                         "00:00:00:00:00:00", "198.51.100.2")
    g = Ether(garp(MAC, "198.51.100.1"))[ARP]
    assert g.op == 1 and g.psrc == g.pdst == "198.51.100.1"  # what OVS's is_garp() takes


def test_only_an_arp_reply_gives_its_sender() -> None:
    from scapy.layers.l2 import ARP, Ether

    reply = bytes(Ether(src="02:aa:00:00:00:02", dst="02:00:00:00:00:01") / ARP(
        op=2, hwsrc="02:aa:00:00:00:02", psrc="198.51.100.2", hwdst="02:00:00:00:00:01", pdst="198.51.100.1"))
    assert arp_reply(reply) == ("198.51.100.2", "02:aa:00:00:00:02")
    assert arp_reply(arp_request(MAC, "198.51.100.1", "198.51.100.2")) is None  # our own request, seen going out
    assert arp_reply(reply[:30]) is None
    assert arp_reply(bytes(Ether(type=0x0800)) + bytes(28)) is None


@given(st.binary(max_size=80))
def test_any_frame_is_read_without_raising(frame: bytes) -> None:
    got = arp_reply(frame)
    assert got is None or len(got[1]) == 17


class FakeOvs:
    """unixctl as ovs-vswitchd answers it: routes by peer, a tunnel neighbour cache."""

    def __init__(self, routes: dict[str, str]) -> None:
        self.routes = routes
        self.neigh: dict[tuple[str, str], str] = {}

    def __call__(self, ctl: Path, command: str, args: Sequence[str] = ()) -> str:
        if command == "ovs/route/lookup":
            if args[0] not in self.routes:
                raise OvsError(f"{command} on {ctl} failed: Not found")
            return self.routes[args[0]]
        if command == "tnl/neigh/set":
            self.neigh[(args[0], args[1])] = args[2]
            return "OK"
        if command == "tnl/neigh/aging":
            return "900"
        raise AssertionError(command)


ON_LINK = "src 198.51.100.1\ngateway ::\ndev br-phy\n"
VIA_GW = "src 198.51.100.1\ngateway 198.51.100.254\ndev br-phy\n"


def test_each_peer_answering_is_set_in_ovs_and_the_others_are_said_why() -> None:
    ovs = FakeOvs({"198.51.100.2": ON_LINK, "198.51.100.3": ON_LINK, "203.0.113.9": VIA_GW,
                   "203.0.113.10": VIA_GW})
    asked: list[tuple[str, str, list[str]]] = []

    def ask(bridge: str, source: str, targets: Sequence[str], timeout: float,
            answered: Callable[[str, str], None]) -> dict[str, str]:
        asked.append((bridge, source, list(targets)))
        got = {t: "02:aa:00:00:00:02" if t == "198.51.100.2" else "02:aa:00:00:00:fe"
               for t in targets if t != "198.51.100.3"}
        for ip, mac in got.items():
            answered(ip, mac)
        return got

    n = TunnelNeighbours(lambda: Path("/run/ovs.ctl"), "", call=ovs, ask=ask)
    failed = n.resolve(["198.51.100.2", "198.51.100.3", "203.0.113.9", "203.0.113.10", "192.0.2.1"])
    # One ARP exchange per bridge, one request per next hop (two peers behind one gateway: one request).
    assert asked == [("br-phy", "198.51.100.1", ["198.51.100.2", "198.51.100.254", "198.51.100.3"])]
    assert ovs.neigh == {("br-phy", "198.51.100.2"): "02:aa:00:00:00:02",
                         ("br-phy", "198.51.100.254"): "02:aa:00:00:00:fe"}
    assert set(failed) == {"198.51.100.3", "192.0.2.1"}
    assert failed["198.51.100.3"] == "no ARP answer from 198.51.100.3 on br-phy within 1s"
    assert failed["192.0.2.1"].startswith("OVS has no route to it")
    assert n.aging() == 900


def test_a_bridge_no_arp_can_leave_fails_its_peers_saying_so() -> None:
    def ask(bridge: str, source: str, targets: Sequence[str], timeout: float,
            answered: Callable[[str, str], None]) -> dict[str, str]:
        raise OSError(19, "No such device")

    n = TunnelNeighbours(lambda: Path("/run/ovs.ctl"), "", call=FakeOvs({"198.51.100.2": ON_LINK}), ask=ask)
    assert n.resolve(["198.51.100.2"]) == {"198.51.100.2": "no ARP request out of br-phy: [Errno 19] No such device"}


def test_a_next_hop_is_set_as_its_answer_comes_not_after_the_others_time_out() -> None:
    """Two peers on one bridge, one silent: the other's next hop is in OVS, and said set, while the ARP
    exchange still waits; the silent one fails when it ends. An answer given twice is set once."""
    ovs = FakeOvs({"198.51.100.2": ON_LINK, "198.51.100.3": ON_LINK})
    set_peers: list[str] = []
    during: list[tuple[dict[tuple[str, str], str], list[str]]] = []

    def ask(bridge: str, source: str, targets: Sequence[str], timeout: float,
            answered: Callable[[str, str], None]) -> dict[str, str]:
        answered("198.51.100.2", "02:aa:00:00:00:02")
        during.append((dict(ovs.neigh), list(set_peers)))  # ...then 198.51.100.3's wait runs out
        return {"198.51.100.2": "02:aa:00:00:00:02"}

    n = TunnelNeighbours(lambda: Path("/run/ovs.ctl"), "", call=ovs, ask=ask)
    failed = n.resolve(["198.51.100.2", "198.51.100.3"], set_peers.append)
    assert during == [({("br-phy", "198.51.100.2"): "02:aa:00:00:00:02"}, ["198.51.100.2"])]
    assert set_peers == ["198.51.100.2"]
    assert failed == {"198.51.100.3": "no ARP answer from 198.51.100.3 on br-phy within 1s"}
