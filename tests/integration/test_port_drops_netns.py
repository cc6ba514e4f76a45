"""The kept port-drop reader (policy_agent/ovs/port_stats.py) in a namespace of the test's own: its
sockets stay in the namespace they were opened in, so a namespace made again must be read anew."""

from __future__ import annotations

import secrets
import socket
import subprocess
from typing import Iterator

import pytest

from meters.netns import call_in_netns
from policy_agent.ovs.port_stats import PortDropReader

ETH_P_ALL = 0x0003


def _netns(name: str, op: str) -> None:
    subprocess.run(["ip", "netns", op, name], check=op == "add", capture_output=True)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"nppd-{secrets.token_hex(3)}"
    _netns(name, "add")
    try:
        yield name
    finally:
        _netns(name, "delete")


def packet_socket_on_lo(netns: str) -> socket.socket:
    def bind() -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind(("lo", 0))
        return sock
    return call_in_netns(netns, bind)


def test_a_namespace_made_again_is_read_through_new_sockets_not_the_old_ones(netns: str) -> None:
    reader = PortDropReader(netns)
    try:
        assert reader.read() == {} and reader.read() == {}  # no packet socket reads a port there yet
        assert reader.opened == 1
        _netns(netns, "delete")
        _netns(netns, "add")
        with packet_socket_on_lo(netns):
            assert reader.read() == {"lo socket_dropped": 0, "lo rx_dropped": 0}
        assert reader.opened == 2
    finally:
        reader.close()
