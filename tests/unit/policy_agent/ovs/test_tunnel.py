"""Which underlay recipe NodeUnderlay.ensure follows, by OVS mode and the datapath the switch runs:
the OVS calls and addresses replaced by a record of what would be done."""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest

from policy_agent.config.loader import loads
from policy_agent.ovs.tunnel import NodeUnderlay

CLUSTER = ("node_network: {pod_cidr: 10.246.1.0/24}\n"
           "cluster:\n  node_address: 198.51.100.1/24\n  underlay_interface: underlay0\n"
           "  peers: [{name: node-2, pod_cidr: 10.246.2.0/24, address: 198.51.100.2}]\n")
EXTERNAL = "ovs: {mode: external}\n"


def ensured(monkeypatch: pytest.MonkeyPatch, text: str, datapath_type: str) -> list[Any]:
    done: list[Any] = []
    monkeypatch.setattr(NodeUnderlay, "_ovs_underlay", lambda self, ovsdb, dp: done.append(("br-phy", dp)))
    monkeypatch.setattr(NodeUnderlay, "_address", lambda self, ifname, timeout, bridged:
                        done.append(("address", ifname, bridged)))
    monkeypatch.setattr(NodeUnderlay, "_tunnel_port", lambda self, ovsdb, timeout: done.append(("tunnel",)))
    monkeypatch.setattr(NodeUnderlay, "_run", lambda self, cmd: done.append(("run", *cmd)) or "")
    monkeypatch.setattr(NodeUnderlay, "announce", lambda self: done.append(("announce", self.resolves_next_hops)))
    cfg = loads(text)
    underlay = NodeUnderlay.of(cfg.cluster, cfg.node_network, cfg.ovs)
    assert underlay is not None
    monkeypatch.setattr("policy_agent.ovs.tunnel.call_in_netns", lambda netns, fn: fn())
    underlay.ensure(object(), datapath_type)  # type: ignore[arg-type]
    return done


@pytest.mark.parametrize("mode", ["", EXTERNAL])
def test_the_userspace_datapath_gets_br_phy_whoever_runs_the_ovs(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # An external netdev OVS with the address in the kernel sends no tunnel packet at all (the old
    # behaviour, caught by tests/e2e/test_tunnel_external_ovs_e2e.py): br-phy, as for the embedded one.
    # The port's kernel side answers no ARP for the address (only br-phy does: one MAC for the peers to take),
    # and the node announces itself to the other nodes' OVS.
    assert ensured(monkeypatch, CLUSTER + mode, "netdev") == [
        ("br-phy", "netdev"), ("address", "br-phy", True), ("run", "sysctl", "-qw",
                                                             "net/ipv4/conf/underlay0/arp_ignore=1"),
        ("tunnel",), ("announce", True)]


def test_an_external_kernel_datapath_keeps_the_address_on_the_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel resolves next hops there (and holds the packet meanwhile): the agent resolves none.
    assert ensured(monkeypatch, CLUSTER + EXTERNAL, "system") == [("address", "underlay0", False), ("tunnel",),
                                                                  ("announce", False)]


def test_an_external_netdev_ovs_without_underlay_interface_is_warned_of(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    text = CLUSTER.replace("  underlay_interface: underlay0\n", "") + EXTERNAL
    with caplog.at_level(logging.INFO, "policy_agent.ovs.tunnel"):
        assert ensured(monkeypatch, text, "netdev") == [("tunnel",), ("announce", True)]
    assert [r for r in caplog.records if r.levelno == logging.WARNING and "OVS bridge port" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.INFO, "policy_agent.ovs.tunnel"):
        assert ensured(monkeypatch, text, "system") == [("tunnel",), ("announce", False)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class CountingNeighbours:
    """TunnelNeighbours' surface, recording what it was asked to resolve."""

    def __init__(self) -> None:
        self.resolved: list[list[str]] = []

    def resolve(self, peers: list[str], on_set: Callable[[str], None] = lambda peer: None) -> dict[str, str]:
        self.resolved.append(list(peers))
        return {}

    def announce(self, bridge: str, address: str) -> None:
        pass


def test_an_ovs_restart_resolves_the_kept_peers_again_and_the_kernel_datapath_resolves_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NodeUnderlay, "_ovs_underlay", lambda self, ovsdb, dp: None)
    monkeypatch.setattr(NodeUnderlay, "_address", lambda self, ifname, timeout, bridged: None)
    monkeypatch.setattr(NodeUnderlay, "_tunnel_port", lambda self, ovsdb, timeout: None)
    monkeypatch.setattr(NodeUnderlay, "_run", lambda self, cmd: "")
    monkeypatch.setattr("policy_agent.ovs.tunnel.call_in_netns", lambda netns, fn: fn())
    cfg = loads(CLUSTER)
    base = NodeUnderlay.of(cfg.cluster, cfg.node_network, cfg.ovs)
    assert base is not None
    fake = CountingNeighbours()
    underlay = NodeUnderlay(base.plan, "br-int", "", fake)  # type: ignore[arg-type]
    assert underlay.resolve_peers(["198.51.100.2"]) == {} and fake.resolved == []  # before ensure: not known yet
    underlay.ensure(object(), "netdev")  # type: ignore[arg-type]
    assert fake.resolved == [["198.51.100.2"]]  # kept from before: resolved at once
    underlay.resolve_peers(["198.51.100.3"], drop=["198.51.100.2"])
    underlay.ensure(object(), "netdev")  # type: ignore[arg-type]  # an OVS restart: the cache is empty again
    assert fake.resolved[-2:] == [["198.51.100.3"], ["198.51.100.3"]]
    underlay.ensure(object(), "system")  # type: ignore[arg-type]
    assert not underlay.resolves_next_hops and len(fake.resolved) == 3
