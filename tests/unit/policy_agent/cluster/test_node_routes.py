"""The underlay plan, the choice of peers to route, node routes following their sources, and the
masquerade that spares other nodes' Pods: pure parts, and NodeRoutes against a fake channel."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

import pytest

from packetin import messages
from policy_agent.cluster.nodes import PeerNode
from policy_agent.config.loader import ConfigError, loads
from policy_agent.config.node import NodeNetworkConfig
from policy_agent.ovs.gateway import masquerade_steps, plan as gateway_plan
from policy_agent.cluster.node_routes import NodeRoutes, NodeRoutesCollector, choose, config_peers
from policy_agent.ovs.tunnel import NodeUnderlay, TunnelPlan, plan, route_steps
from policy_agent.policy.reject import build_reject
from policy_agent.policy.tunnel_flows import TUN_DST_FIELD

N2 = PeerNode("node-2", "10.246.2.0/24", "198.51.100.2")
N3 = PeerNode("node-3", "10.246.3.0/24", "198.51.100.3")
OWN = "10.246.1.0/24"
CLUSTER = ("node_network: {pod_cidr: 10.246.1.0/24}\n"
           "cluster:\n  node_address: 198.51.100.1/24\n  underlay_interface: underlay0\n"
           "  peers: [{name: node-2, pod_cidr: 10.246.2.0/24, address: 198.51.100.2}]\n")


def test_the_plan_follows_the_cluster_section() -> None:
    cfg = loads(CLUSTER)
    p = plan(cfg.cluster, cfg.node_network, cfg.ovs)
    assert p == TunnelPlan("geneve", "198.51.100.1/24", OWN, "npaudit-tun0", 1, "underlay0", "br-phy", True,
                           deny_unknown_sources=True)
    assert p.on_ovs_bridge and p.node_ip == "198.51.100.1"
    assert config_peers(cfg.cluster) == [N2]
    assert cfg.cluster.pod_mtu == 1450
    one = loads("node_network: {pod_cidr: 10.246.1.0/24}")
    assert plan(one.cluster, one.node_network, one.ovs) is None and one.cluster.pod_mtu == 1500
    routed = loads(CLUSTER.replace("cluster:\n", "cluster:\n  encapsulation: routed\n"))
    rp = plan(routed.cluster, routed.node_network, routed.ovs)
    assert rp is not None and not rp.geneve and not rp.on_ovs_bridge and routed.cluster.pod_mtu == 1500
    ext = loads(CLUSTER.replace("  underlay_interface: underlay0\n", "") + "ovs: {mode: external}\n")
    ep = plan(ext.cluster, ext.node_network, ext.ovs)
    assert ep is not None and ep.geneve and not ep.on_ovs_bridge and not ep.embedded


def test_a_node_address_without_a_pod_subnet_is_refused_naming_both_fields() -> None:
    with pytest.raises(ConfigError) as err:
        loads("cluster: {node_address: 198.51.100.1/24}")
    assert "cluster.node_address: needs node_network.pod_cidr" in str(err.value)


def test_overlapping_or_malformed_peers_are_refused_one_by_one_and_a_routed_peer_keeps_its_place() -> None:
    clash = PeerNode("node-4", "10.246.2.128/25", "198.51.100.4")
    ours = PeerNode("node-5", "10.246.0.0/16", "198.51.100.5")
    bad = PeerNode("node-6", "10.246.6.0/33", "198.51.100.6")
    chosen, refused = choose(OWN, [], [N3, clash, N2, ours, bad, N2])  # N2 from two sources: one route
    # Sorted, the first of two overlapping newcomers wins; node-5 covers our own subnet.
    assert chosen == [N2, N3]
    assert {(r.peer.name, r.reason) for r in refused} == {("node-4", "overlap"), ("node-5", "overlap"),
                                                          ("node-6", "invalid")}
    # A routed peer is never displaced by a newcomer that sorts first.
    early = PeerNode("a-node", "10.246.2.0/24", "198.51.100.9")
    chosen, refused = choose(OWN, [N2], [early, N2])
    assert chosen == [N2] and [r.peer for r in refused] == [early]
    # The same name twice (a moved node) is one route.
    moved = PeerNode("node-2", "10.246.7.0/24", "198.51.100.2")
    chosen, refused = choose(OWN, [N2], [N2, moved])
    assert chosen == [N2] and [r.peer for r in refused] == [moved]


def test_route_steps_add_move_and_remove_only_what_differs() -> None:
    current = ["10.246.2.0/24 via 198.51.100.2 dev underlay0 proto 77",
               "10.246.9.0/24 via 198.51.100.9 dev underlay0 proto 77"]
    assert route_steps(current, [("10.246.2.0/24", "198.51.100.22"), ("10.246.3.0/24", "198.51.100.3")]) == [
        ["replace", "10.246.2.0/24", "via", "198.51.100.22", "proto", "77"],
        ["replace", "10.246.3.0/24", "via", "198.51.100.3", "proto", "77"],
        ["del", "10.246.9.0/24", "proto", "77"]]
    assert route_steps(current[:1], [("10.246.2.0/24", "198.51.100.2")]) == []


def test_masquerade_spares_the_routed_peers_subnets() -> None:
    gw = gateway_plan(NodeNetworkConfig(pod_cidr=OWN))
    assert gw is not None
    done = ["-N NPAUDIT-MASQ", "-A POSTROUTING -j NPAUDIT-MASQ",
            "-A NPAUDIT-MASQ -s 10.246.1.0/24 ! -d 10.246.1.0/24 -j MASQUERADE"]
    steps = masquerade_steps(gw, done, ["10.246.2.0/24"])
    assert steps == [["-t", "nat", "-F", "NPAUDIT-MASQ"],
                     ["-t", "nat", "-A", "NPAUDIT-MASQ", "-d", "10.246.2.0/24", "-j", "RETURN"],
                     ["-t", "nat", "-A", "NPAUDIT-MASQ", "-s", OWN, "!", "-d", OWN, "-j", "MASQUERADE"]]
    after = done[:2] + ["-A NPAUDIT-MASQ -d 10.246.2.0/24 -j RETURN", done[2]]
    assert masquerade_steps(gw, after, ["10.246.2.0/24"]) == []
    assert masquerade_steps(gw, after, []) == [["-t", "nat", "-F", "NPAUDIT-MASQ"], steps[2]]


class FakeChannel:
    """As OVS: an add replaces the flow of the same table, priority and match; a strict delete removes it."""

    def __init__(self) -> None:
        self.flows: list[messages.FlowSpec] = []
        self.deleted: list[messages.FlowSpec] = []

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        keys = {f.key for f in flows}
        self.flows = [f for f in self.flows if f.key not in keys] + list(flows)

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        self.deleted += flows
        keys = {f.key for f in flows}
        self.flows = [f for f in self.flows if f.key not in keys]

    def tun_dsts(self) -> set[str]:
        return {str(a.value) for f in self.flows for a in f.actions
                if isinstance(a, messages.SetField) and a.name == TUN_DST_FIELD}


class FakeUnderlay(NodeUnderlay):
    """The plan without the namespace: routes and reachability recorded, not made."""

    def __init__(self, tunnel: TunnelPlan) -> None:
        super().__init__(tunnel, "br-int", "")
        self.routes: list[tuple[str, str]] = []

    def set_routes(self, routes: Sequence[tuple[str, str]]) -> None:
        self.routes = list(routes)

    def unreachable(self, address: str) -> str | None:
        return None if address.startswith("198.51.100.") else "Network is unreachable"


def routes(encapsulation: str = "geneve") -> tuple[NodeRoutes, FakeChannel, FakeUnderlay, list[list[str]]]:
    tunnel = TunnelPlan(encapsulation, "198.51.100.1/24", OWN, "npaudit-tun0", 1, "underlay0", "br-phy", True)
    channel, underlay, masq = FakeChannel(), FakeUnderlay(tunnel), []
    return NodeRoutes(underlay, channel, lambda: 3, masquerade=lambda c: masq.append(list(c))), channel, underlay, masq


def test_peers_from_several_sources_are_routed_and_one_change_touches_only_its_peer() -> None:
    async def go() -> None:
        r, channel, _, masq = routes()
        r.set_peers("config", [N2])
        await r.start()
        assert channel.tun_dsts() == {"198.51.100.2"} and len(channel.flows) == 4 + 1  # tunnel port + N2
        before = list(channel.flows)
        r.set_peers("kubernetes", [N2, N3])
        await r.sync()
        assert channel.tun_dsts() == {"198.51.100.2", "198.51.100.3"} and channel.deleted == []
        assert all(f in channel.flows for f in before)  # N2's flow untouched
        r.set_peers("config", [])
        await r.sync()
        assert channel.deleted == []  # N2 still comes from kubernetes
        r.set_peers("kubernetes", [N3])
        await r.sync()
        assert channel.tun_dsts() == {"198.51.100.3"} and len(channel.deleted) == 1
        assert masq[-1] == ["10.246.3.0/24"]
        # node-3 gets a new address: its route is rewritten in place, not deleted after the rewrite.
        r.set_peers("kubernetes", [PeerNode("node-3", "10.246.3.0/24", "198.51.100.33")])
        await r.sync()
        assert channel.tun_dsts() == {"198.51.100.33"} and len(channel.deleted) == 1
        # ...and moved where this node has no route: reported under its name, though its old self is gone.
        r.set_peers("kubernetes", [PeerNode("node-3", "10.246.3.0/24", "203.0.113.3")])
        await r.sync()
        assert channel.tun_dsts() == {"203.0.113.3"} and set(r.unreachable) == {"node-3"}
        await r.close()
    asyncio.run(go())


def test_a_refused_or_unreachable_peer_is_logged_and_counted_and_the_others_still_routed(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> NodeRoutes:
        r, channel, _, _ = routes()
        r.set_peers("config", [N2, PeerNode("node-x", "10.246.1.128/25", "198.51.100.8"),
                               PeerNode("node-far", "10.246.4.0/24", "203.0.113.4")])
        await r.start()
        assert channel.tun_dsts() == {"198.51.100.2", "203.0.113.4"}
        await r.close()
        return r
    r = asyncio.run(go())
    assert "peer node-x (Pod subnet 10.246.1.128/25, address 198.51.100.8) refused" in caplog.text
    assert "overlaps this node" in caplog.text
    assert "peer node-far at 203.0.113.4 is unreachable" in caplog.text
    samples = {(s.name, tuple(s.labels.values())): s.value for m in NodeRoutesCollector(r).collect()
               for s in m.samples}
    assert samples[("npaudit_cluster_peers", ("routed",))] == 2
    assert samples[("npaudit_cluster_peers", ("refused",))] == 1
    assert samples[("npaudit_cluster_peers", ("unreachable",))] == 1
    assert samples[("npaudit_cluster_peer_problems_total", ("overlap",))] == 1
    assert samples[("npaudit_cluster_peer_problems_total", ("unreachable",))] == 1


def test_routed_mode_sets_kernel_routes_and_no_peer_flows() -> None:
    async def go() -> None:
        r, channel, underlay, masq = routes("routed")
        r.set_peers("config", [N2, N3])
        await r.start()
        assert channel.flows == [] and underlay.routes == [(N2.pod_cidr, N2.address), (N3.pod_cidr, N3.address)]
        assert masq == [["10.246.2.0/24", "10.246.3.0/24"]]
        await r.close()
    asyncio.run(go())


def test_a_reject_answer_to_a_pod_behind_the_tunnel_goes_back_into_it_addressed_to_its_node() -> None:
    async def go() -> None:
        r, _, _, _ = routes()
        r.set_peers("config", [N2])
        await r.start()
        syn = (bytes(6) + bytes(6) + b"\x08\x00" + bytes.fromhex("450000280000400040060000")
               + bytes([10, 246, 2, 5]) + bytes([10, 246, 1, 2]) + bytes.fromhex("d4310050000000010000000050020000")
               + bytes(4))
        answer = build_reject(syn)
        assert answer is not None
        out = r.answer_out(answer, 1)
        assert out is not None and out.actions[0].value == "198.51.100.2" and out.actions[1].port == 1
        assert r.answer_out(answer, 100) is None  # from a Pod's port: out of that port, as ever
        await r.close()
    asyncio.run(go())


def test_the_engine_admits_another_nodes_pod_in_the_bundle_of_the_policy_that_names_it_and_drops_it_with_it() -> None:
    from policy_agent.engine import PolicyEngine
    from policy_agent.policy.model import (
        Action, AppliedTo, Direction, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, Rule,
    )
    from policy_agent.policy.rules import RuleRegistry
    from policy_agent.policy.tunnel_flows import KNOWN_SOURCE_PRIORITY
    from tests.support.engine_doubles import Info, RecordingChannel

    web = LabelSelector((("app", "web"),))
    drop_from_web = Policy(PolicyKind.ACNP, "drop-from-web", tier="application", priority=1,
                           applied_to=(AppliedTo(pod_selector=web),),
                           rules=(Rule(Direction.INGRESS, Action.DROP,
                                       (Peer(pod_selector=web, namespace_selector=LabelSelector(())),)),))

    tunnel = TunnelPlan("geneve", "198.51.100.1/24", OWN, "npaudit-tun0", 1, "underlay0", "br-phy", True,
                        deny_unknown_sources=True)
    admission = NodeRoutes(FakeUnderlay(tunnel), FakeChannel(), lambda: 3).admission()
    assert admission is not None
    assert NodeRoutes(FakeUnderlay(TunnelPlan("geneve", "198.51.100.1/24", OWN, "t", 1, "u", "b", True)),
                      FakeChannel(), lambda: 3).admission() is None  # off by default

    def admitted(flows: list[messages.FlowSpec]) -> set[str]:
        matches = [dict(f.match) for f in flows if f.priority == KNOWN_SOURCE_PRIORITY and f.table == 25]
        return {m["ipv4_src"] for m in matches if m.get("in_port") == 1 and "ipv4_src" in m}

    async def go() -> None:
        ch = RecordingChannel()
        eng = PolicyEngine(ch, RuleRegistry(), round_=3, meters=lambda: True, admission=admission)
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", (("app", "web"),))],
                        policies=[drop_from_web])
        await eng.pod_added(Info("x", "a", "10.246.1.2", "02:00:0a:f6:01:02", 100))
        remote = Pod("x", "b", (("app", "web"),), ips=("10.246.2.5",), node="node-2")
        await eng.apply(pods=[remote])
        install, delete = ch.commits[-1]
        assert admitted(install) == {"10.246.2.5"} and not admitted(delete)
        assert any(f.table != 0 for f in install)  # with the policy flows that name its address
        mark = len(ch.calls)
        await eng.delete(pods=[remote])
        # Gone with it (in a bundle when policy flows change too, else alone, before anything else).
        gone = [f for kind, flows in ch.calls[mark:] if kind in ("delete", "commit") for f in flows]
        assert admitted(gone) == {"10.246.2.5"}
    asyncio.run(go())


def test_a_cluster_denies_unknown_sources_by_default_and_says_at_start_where_the_window_stays_open(
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = loads(CLUSTER)
    assert cfg.cluster.deny_unknown_sources
    p = plan(cfg.cluster, cfg.node_network, cfg.ovs)
    assert p is not None and p.deny_unknown_sources

    def started(tunnel: TunnelPlan) -> tuple[NodeRoutes, str]:
        caplog.clear()
        r = NodeRoutes(FakeUnderlay(tunnel), FakeChannel(), lambda: 3)

        async def go() -> None:
            await r.start()
            await r.close()
        with caplog.at_level("INFO", logger="policy_agent.cluster.node_routes"):
            asyncio.run(go())
        return r, " ".join(f"{rec.levelname} {rec.getMessage()}" for rec in caplog.records)

    on, said = started(p)
    assert on.denies_unknown and on.unknown_via == "tunnel"
    assert "INFO cluster: new connections from other nodes' Pods (through the tunnel) are taken only" in said
    off, said = started(TunnelPlan("geneve", "198.51.100.1/24", OWN, "t", 1, "u", "b", True, deny_unknown_sources=False))
    assert not off.denies_unknown and "WARNING cluster: deny_unknown_sources is off" in said
    routed, said = started(TunnelPlan("routed", "198.51.100.1/24", OWN, "t", 1, "u", "b", True,
                                      deny_unknown_sources=True))
    assert routed.denies_unknown and routed.unknown_via == "gateway"
    assert "(through the gateway, from the peers' Pod subnets) are taken only" in said
    routed_off, said = started(TunnelPlan("routed", "198.51.100.1/24", OWN, "t", 1, "u", "b", True))
    assert not routed_off.denies_unknown and "WARNING cluster: deny_unknown_sources is off" in said

    def samples(r: NodeRoutes, drops: int | None) -> dict[str, float]:
        return {s.name: s.value for m in NodeRoutesCollector(r, lambda: drops).collect() for s in m.samples}

    assert samples(on, 17)["npaudit_cluster_unknown_source_drops_total"] == 17
    assert samples(on, None)["npaudit_cluster_unknown_source_drops_total"] == 0  # not read yet
    assert "npaudit_cluster_unknown_source_drops_total" not in samples(off, None)
    assert samples(routed, 2)["npaudit_cluster_unknown_source_drops_total"] == 2
    assert "npaudit_cluster_unknown_source_drops_total" not in samples(routed_off, None)

    def vni_drops(r: NodeRoutes, drops: int | None) -> float | None:
        got = {s.name: s.value for m in NodeRoutesCollector(r, lambda: None, lambda: drops).collect() for s in m.samples}
        return got.get("npaudit_cluster_unknown_vni_drops_total")

    # Geneve, with or without the check of sources: drops of unknown VNIs are counted; routed has no tunnel.
    assert vni_drops(on, 5) == 5 and vni_drops(off, 3) == 3 and vni_drops(on, None) == 0
    assert vni_drops(routed, None) is None and vni_drops(routed_off, None) is None
    assert on.unknown_vni_request().cookie != on.unknown_source_request().cookie


def test_routed_with_deny_unknown_sources_each_peer_subnet_gets_a_drop_through_the_gateway_and_loses_it_with_the_peer(
        ) -> None:
    from policy_agent.policy.tunnel_flows import UNKNOWN_SOURCE_PRIORITY, unknown_source_request

    tunnel = TunnelPlan("routed", "198.51.100.1/24", OWN, "t", 1, "u", "b", True, deny_unknown_sources=True,
                        gateway_ofport=2)
    channel, underlay = FakeChannel(), FakeUnderlay(tunnel)
    r = NodeRoutes(underlay, channel, lambda: 3)

    def drops() -> dict[str, int]:
        return {dict(f.match)["ipv4_src"][0]: dict(f.match)["in_port"] for f in channel.flows
                if f.table == 25 and f.priority == UNKNOWN_SOURCE_PRIORITY}

    async def go() -> None:
        r.set_peers("config", [N2, N3])
        await r.sync()
        assert drops() == {"10.246.2.0": 2, "10.246.3.0": 2} and underlay.routes == [(N2.pod_cidr, N2.address),
                                                                                    (N3.pod_cidr, N3.address)]
        assert {f.cookie for f in channel.flows if f.table == 25} == {unknown_source_request(3).cookie}
        r.set_peers("config", [N2])
        await r.sync()
        assert drops() == {"10.246.2.0": 2} and underlay.routes == [(N2.pod_cidr, N2.address)]
    asyncio.run(go())
    admission = r.admission()
    assert admission is not None and dict(admission("10.246.2.5").match)["in_port"] == 2  # the gateway's port


def test_geneve_with_deny_unknown_sources_takes_each_peers_gateway_address_from_the_tunnel_while_it_is_routed(
        ) -> None:
    from policy_agent.policy.tunnel_flows import KNOWN_SOURCE_PRIORITY

    def admitted(channel: FakeChannel) -> set[str]:
        return {dict(f.match)["ipv4_src"] for f in channel.flows if f.table == 25
                and f.priority == KNOWN_SOURCE_PRIORITY and dict(f.match)["in_port"] == 1}

    async def go(deny: bool) -> set[str]:
        tunnel = TunnelPlan("geneve", "198.51.100.1/24", OWN, "t", 1, "u", "b", True, deny_unknown_sources=deny)
        channel = FakeChannel()
        r = NodeRoutes(FakeUnderlay(tunnel), channel, lambda: 3)
        r.set_peers("config", [N2, N3])
        await r.sync()
        both = admitted(channel)
        r.set_peers("config", [N3])
        await r.sync()
        assert admitted(channel) == both - {"10.246.2.1"}  # gone with its peer
        return both

    # The peer node itself (a host process reaching this node's Pods through its gateway) is no Pod.
    assert asyncio.run(go(True)) == {"10.246.2.1", "10.246.3.1"}
    assert asyncio.run(go(False)) == set()


class ResolvingUnderlay(FakeUnderlay):
    """Geneve on the userspace datapath: next hops resolved by the agent; `dead` addresses never answer.
    Records, per call, what was asked and which peer flows the channel held at that moment."""

    def __init__(self, tunnel: TunnelPlan, channel: FakeChannel) -> None:
        super().__init__(tunnel)
        self._userspace_tunnel = True
        self.channel = channel
        self.dead: set[str] = set()
        self.calls: list[tuple[list[str], list[str], set[str]]] = []
        self.during_timeout: list[set[str]] = []
        self.aging = 900

    @property
    def resolves_next_hops(self) -> bool:
        return True

    def resolve_peers(self, add: Sequence[str], drop: Sequence[str] = (),
                      on_set: Callable[[str], None] = lambda address: None) -> dict[str, str]:
        self.calls.append((list(add), list(drop), self.channel.tun_dsts()))
        self._kept.difference_update(drop)
        self._kept.update(add)
        answered = [a for a in add if a not in self.dead]
        for a in answered:
            on_set(a)
        if self.dead & set(add):  # the ARP timeout: what the channel holds before it ends (a thread, as OVS's)
            deadline = time.monotonic() + 5.0
            while not set(answered) <= self.channel.tun_dsts() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.during_timeout.append(self.channel.tun_dsts())
        return {a: "no ARP answer" for a in add if a in self.dead}

    def refresh_peers(self) -> dict[str, str]:
        return self.resolve_peers(sorted(self._kept))

    def neighbour_aging(self) -> int | None:
        return self.aging


def resolving(refresh: float = 300.0) -> tuple[NodeRoutes, FakeChannel, ResolvingUnderlay]:
    tunnel = TunnelPlan("geneve", "198.51.100.1/24", OWN, "npaudit-tun0", 1, "underlay0", "br-phy", True)
    channel = FakeChannel()
    underlay = ResolvingUnderlay(tunnel, channel)
    return NodeRoutes(underlay, channel, lambda: 3, refresh=refresh), channel, underlay


def samples_of(r: NodeRoutes) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, tuple(s.labels.values())): s.value for m in NodeRoutesCollector(r).collect() for s in m.samples}


def test_a_new_peers_next_hop_is_resolved_before_its_route_exists_and_a_gone_one_is_let_go() -> None:
    async def go() -> None:
        r, channel, underlay = resolving()
        r.set_peers("config", [N2])
        await r.start()
        assert underlay.calls == [(["198.51.100.2"], [], set())]  # no route into the tunnel yet
        assert channel.tun_dsts() == {"198.51.100.2"} and r.unresolved == {}
        r.set_peers("config", [N3])
        await r.sync()
        assert underlay.calls[-1] == (["198.51.100.3"], ["198.51.100.2"], {"198.51.100.2"})
        await r.refresh_next_hops()  # the periodic round: every routed peer again
        assert underlay.calls[-1][0] == ["198.51.100.3"]
        await r.close()
    asyncio.run(go())


def test_a_peer_not_answering_is_said_counted_and_retried_until_it_answers(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        r, channel, underlay = resolving()
        underlay.dead = {"198.51.100.2"}
        r.set_peers("config", [N2, N3])
        await r.start()
        assert channel.tun_dsts() == {"198.51.100.2", "198.51.100.3"}  # routed all the same: OVS resolves late
        assert set(r.unresolved) == {"node-2"}
        assert samples_of(r)[("npaudit_cluster_peers", ("unresolved",))] == 1
        # The follow task retries on its own after 1 s, then 2 s..., well before the 300 s refresh, and only
        # the peer that did not answer; still dead: said once, counted once.
        await asyncio.wait_for(_until(lambda: len(underlay.calls) == 2), 5.0)
        assert samples_of(r)[("npaudit_cluster_peer_problems_total", ("unresolved",))] == 1
        underlay.dead = set()
        await asyncio.wait_for(_until(lambda: not r.unresolved), 5.0)
        assert [c[0] for c in underlay.calls] == [["198.51.100.2", "198.51.100.3"], ["198.51.100.2"],
                                                  ["198.51.100.2"]]
        assert samples_of(r)[("npaudit_cluster_peers", ("unresolved",))] == 0
        await r.close()
    with caplog.at_level(logging.INFO, "policy_agent.cluster.node_routes"):
        asyncio.run(go())
    said = [m for m in caplog.messages if "next hop is not resolved" in m]
    assert len(said) == 1 and "peer node-2 at 198.51.100.2" in said[0] and "no ARP answer" in said[0]
    assert any("node-2's underlay next hop is resolved now" in m for m in caplog.messages)


def test_a_peer_not_answering_holds_back_only_its_own_route_while_its_arp_times_out() -> None:
    """Peers added together: the one that answers is routed as its answer comes, not after the other's
    ARP timeout; the silent one is routed when the timeout ends."""
    async def go() -> None:
        r, channel, underlay = resolving()
        underlay.dead = {"198.51.100.2"}
        r.set_peers("config", [N2, N3])
        await r.start()
        assert underlay.during_timeout == [{"198.51.100.3"}]  # N3's route in while N2's ARP was unanswered
        assert channel.tun_dsts() == {"198.51.100.2", "198.51.100.3"} and set(r.unresolved) == {"node-2"}
        await r.close()
    asyncio.run(go())


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.05)


def test_a_refresh_not_shorter_than_ovs_aging_is_warned_of_at_start(caplog: pytest.LogCaptureFixture) -> None:
    async def go(refresh: float) -> None:
        r, _, _ = resolving(refresh)
        r.set_peers("config", [N2])
        await r.start()
        await r.close()
    with caplog.at_level(logging.WARNING, "policy_agent.cluster.node_routes"):
        asyncio.run(go(300.0))
        assert not [m for m in caplog.messages if "tnl/neigh/aging" in m]
        asyncio.run(go(900.0))
    (said,) = [m for m in caplog.messages if "tnl/neigh/aging" in m]
    assert "cluster.underlay_refresh (900s) is not shorter than OVS's tnl/neigh/aging (900s)" in said


def test_routed_mode_resolves_no_next_hop_and_keeps_no_timer() -> None:
    async def go() -> None:
        r, _, underlay, _ = routes("routed")
        r.set_peers("config", [N2])
        await r.start()
        assert not underlay.resolves_next_hops and r.unresolved == {}
        assert samples_of(r)[("npaudit_cluster_peers", ("unresolved",))] == 0
        await r.close()
    asyncio.run(go())
