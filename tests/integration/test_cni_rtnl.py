"""The hand-encoded rtnetlink requests of a CNI ADD (policy_agent/cni/rtnl.py), checked against what
`ip` then shows, in two namespaces of the test's own."""

from __future__ import annotations

import errno
import ipaddress
import json
import secrets
import subprocess
from typing import Any, Iterator

import pytest

from meters.netns import call_in_netns
from policy_agent.cni.rtnl import Rtnl


def _ip(netns: str, *args: str) -> Any:
    return json.loads(subprocess.run(["ip", "-j", "-n", netns, *args], capture_output=True, text=True,
                                     check=True).stdout or "[]")


@pytest.fixture
def two_netns() -> Iterator[tuple[str, str]]:
    tag = secrets.token_hex(3)
    names = (f"nprt-{tag}-h", f"nprt-{tag}-p")
    for ns in names:
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        yield names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def test_veth_mac_address_and_routes_as_ip_shows_them(two_netns: tuple[str, str]) -> None:
    host, pod = two_netns

    def host_side() -> tuple[str, int]:
        with Rtnl() as rtnl:
            rtnl.add_veth("nph0", "eth0", f"/run/netns/{pod}")
            with pytest.raises(OSError) as again:
                rtnl.add_veth("nph0", "eth1", f"/run/netns/{pod}")
            assert again.value.errno == errno.EEXIST
            return rtnl.link("nph0")

    mac, peer_index = call_in_netns(host, host_side)
    (link,) = _ip(host, "link", "show", "nph0")
    assert link["address"] == mac and "UP" in link["flags"]
    assert "NOARP" in link["flags"]  # a switch port: the kernel of its namespace answers no ARP on it
    (eth0,) = _ip(pod, "link", "show", "eth0")
    assert eth0["ifindex"] == peer_index

    def pod_side() -> None:
        with Rtnl() as rtnl:
            rtnl.set_mac_up(peer_index, "02:00:0a:f7:00:05")
            rtnl.add_address(peer_index, ipaddress.IPv4Interface("10.247.0.5/24"))
            rtnl.add_routes(peer_index, [{"dst": "0.0.0.0/0", "gw": "10.247.0.1"}, {"dst": "192.0.2.0/28"}])
            with pytest.raises(OSError) as twice:
                rtnl.add_address(peer_index, ipaddress.IPv4Interface("10.247.0.5/24"))
            assert twice.value.errno == errno.EEXIST

    call_in_netns(pod, pod_side)
    (eth0,) = _ip(pod, "addr", "show", "eth0")
    assert eth0["address"] == "02:00:0a:f7:00:05" and "UP" in eth0["flags"]
    assert [(a["local"], a["prefixlen"]) for a in eth0["addr_info"] if a["family"] == "inet"] == [("10.247.0.5", 24)]
    routes = {(r["dst"], r.get("gateway"), r.get("scope")) for r in _ip(pod, "route", "show")}
    assert ("default", "10.247.0.1", None) in routes
    assert ("192.0.2.0/28", None, "link") in routes

    def delete() -> None:
        with Rtnl() as rtnl:
            rtnl.delete_link("nph0")
            with pytest.raises(OSError) as gone:
                rtnl.link("nph0")
            assert gone.value.errno == errno.ENODEV

    call_in_netns(host, delete)
    assert _ip(pod, "link", "show") and not any(link["ifname"] == "eth0" for link in _ip(pod, "link", "show"))
