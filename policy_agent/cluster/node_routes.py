"""Node routes: the other nodes this node sends Pod traffic to, kept as their sources say (a PeerSink).

Each source (the config's `cluster.peers`, the Node objects of Kubernetes) hands over its whole
current set with `set_peers(source, peers)`. The routes are the union, each peer checked on its
own (`choose`): a peer whose Pod subnet overlaps this node's or a routed peer's, or whose fields
are malformed, is refused with a log line and a metric, and the others are unaffected; a peer
already routed keeps its place against a newcomer that overlaps it. The work (flows for Geneve,
kernel routes for routed mode, masquerade exclusions) runs in one task, so a change touches only
the peers it adds, removes or moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from packetin import messages
from packetin.frames import l3_offset
from packetin.tasks import cancel_and_wait, forget, within
from policy_agent.cluster.nodes import PeerNode
from policy_agent.config.cluster import ClusterConfig
from policy_agent.errors import one_line
from policy_agent.ovs.tunnel import NodeUnderlay
from policy_agent.policy.tunnel_flows import (answer_through_tunnel, known_source_flow, peer_flows, tunnel_port_flows,
                                              unknown_peer_flow, unknown_source_request, unknown_vni_request)

log = logging.getLogger(__name__)

# A peer whose next hop did not resolve (a node still starting) is tried again after 1 s, then 2, 4, 8, 10...
FIRST_RETRY, RETRY = 1.0, 10.0


class FlowTarget(Protocol):
    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...


@dataclass(frozen=True)
class Refusal:
    peer: PeerNode
    reason: str  # overlap | invalid
    detail: str


def config_peers(cluster: ClusterConfig) -> list[PeerNode]:
    """The peers the config names (the source "config")."""
    return [PeerNode(p.name, p.pod_cidr, p.address) for p in cluster.peers]


def _problem(peer: PeerNode) -> str | None:
    try:
        ipaddress.IPv4Network(peer.pod_cidr)
    except ValueError:
        return f"Pod subnet {peer.pod_cidr!r} is no IPv4 subnet"
    try:
        ipaddress.IPv4Address(peer.address)
    except ValueError:
        return f"address {peer.address!r} is no IPv4 address"
    return None if peer.name else "no name"


def choose(own_cidr: str, routed: Sequence[PeerNode], offered: Sequence[PeerNode]
           ) -> tuple[list[PeerNode], list[Refusal]]:
    """The peers to route among `offered` (every source's, duplicates allowed), and those refused.
    `routed` (what is routed now) goes first, so a newcomer never displaces a routed peer."""
    own = ipaddress.IPv4Network(own_cidr) if own_cidr else None
    unique = sorted(set(offered))
    kept = set(routed)
    order = [p for p in unique if p in kept] + [p for p in unique if p not in kept]
    chosen: list[PeerNode] = []
    nets: list[tuple[str, ipaddress.IPv4Network]] = []
    refused: list[Refusal] = []
    for peer in order:
        bad = _problem(peer)
        if bad is not None:
            refused.append(Refusal(peer, "invalid", bad))
            continue
        net = ipaddress.IPv4Network(peer.pod_cidr)
        clash = [name for name, other in ([("this node", own)] if own is not None else []) + nets
                 if net.overlaps(other)]
        clash += [p.name for p in chosen if p.name == peer.name]
        if clash:
            refused.append(Refusal(peer, "overlap", f"Pod subnet {net} or name overlaps {', '.join(clash)}"))
            continue
        chosen.append(peer)
        nets.append((peer.name, net))
    return sorted(chosen), refused


class NodeRoutes:
    """The PeerSink of the datapath: flows (Geneve) or kernel routes (routed) to every accepted peer.

    `set_peers` may be called from any thread, before or after `start`; the work happens in
    the task `start` makes on the agent's loop. `masquerade(cidrs)` (the gateway's) is told every
    routed peer's subnet, so Pod traffic to another node's Pods keeps its source address."""

    def __init__(self, underlay: NodeUnderlay, channel: FlowTarget, round_: Callable[[], int],
                 masquerade: Callable[[Sequence[str]], None] | None = None, refresh: float = 300.0) -> None:
        self.underlay = underlay
        self._channel = channel
        self._round = round_
        self._masquerade = masquerade
        self._by_source: dict[str, tuple[PeerNode, ...]] = {}
        self.routed: list[PeerNode] = []
        self.refused: list[Refusal] = []
        self.unreachable: dict[str, str] = {}  # peer name -> why
        self.unresolved: dict[str, str] = {}  # peer name -> why its underlay next hop is not resolved (routed to)
        self._refresh = refresh  # seconds between resolutions of every peer's next hop (a failed one: 10 s)
        self._aging_said = False
        self._retry = FIRST_RETRY
        self._refreshed = 0.0  # the event loop's time of the last refresh of every peer (start: sync's)
        self.problems: Counter[str] = Counter()  # reason -> times a peer was refused or found unreachable
        self._flows: dict[PeerNode, list[messages.FlowSpec]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def set_peers(self, source: str, peers: Sequence[PeerNode]) -> None:
        """Replace what `source` said before with `peers`."""
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:  # another thread (a watch), or before start
            here = None
        if loop is None or here is loop:
            self._set(source, tuple(peers))
        else:
            loop.call_soon_threadsafe(self._set, source, tuple(peers))

    def _set(self, source: str, peers: tuple[PeerNode, ...]) -> None:
        self._by_source[source] = peers
        self._wake.set()

    def peer_for(self, ip: str) -> PeerNode | None:
        """The routed peer whose Pod subnet holds `ip` (where an answer to that address goes)."""
        addr = ipaddress.IPv4Address(ip)
        return next((p for p in self.routed if addr in ipaddress.IPv4Network(p.pod_cidr)), None)

    @property
    def denies_unknown(self) -> bool:
        """Whether new connections from other nodes' Pods are taken only from sources the Pod directory holds."""
        return self.underlay.plan.deny_unknown_sources

    @property
    def unknown_via(self) -> str:
        """Where other nodes' Pod traffic comes in: the tunnel (Geneve) or the gateway (routed)."""
        return "tunnel" if self.underlay.plan.geneve else "gateway"

    def admission(self) -> Callable[[str], messages.FlowSpec] | None:
        """For the policy engine: per address of another node's Pod, the flow taking its packets
        from the tunnel or, routed, the gateway (None: every source is taken, deny_unknown_sources off)."""
        if not self.denies_unknown:
            return None
        plan = self.underlay.plan
        ofport = plan.tunnel_ofport if plan.geneve else plan.gateway_ofport
        return lambda ip: known_source_flow(self._round(), ofport, ip)

    def unknown_source_request(self) -> Any:
        """The flow statistics request of this round's drop of unknown sources (only when `denies_unknown`)."""
        return unknown_source_request(self._round())

    def unknown_vni_request(self) -> Any:
        """The flow statistics request of this round's drop of unknown VNIs from the tunnel (Geneve only)."""
        return unknown_vni_request(self._round())

    def say_window(self) -> None:
        """At start, loudly: whether a Pod of another node can pass a rule its labels would fail before
        its object reaches this node (the window deny_unknown_sources closes, in Geneve mode only)."""
        plan = self.underlay.plan
        if self.denies_unknown:
            log.info("cluster: new connections from other nodes' Pods (%s) are taken only from Pods this node "
                     "knows (deny_unknown_sources); the others are dropped and counted "
                     "(npaudit_cluster_unknown_source_drops_total, loss records reason unknown_source)",
                     "through the tunnel" if plan.geneve else "through the gateway, from the peers' Pod subnets")
        else:
            log.warning("cluster: deny_unknown_sources is off: a Pod that starts on another node can reach this "
                        "node's Pods before its object arrives here, past rules its labels would fail, until it does")

    def answer_out(self, answer: bytes, in_port: int) -> Any | None:
        """The packet-out taking a Reject's `answer` back into the tunnel it came from, to the node of
        the Pod it answers; None when it came in elsewhere (then out of its in_port is right)."""
        plan = self.underlay.plan
        if not plan.geneve or in_port != plan.tunnel_ofport:
            return None
        l3 = l3_offset(answer)
        peer = self.peer_for(str(ipaddress.IPv4Address(answer[l3 + 16:l3 + 20]))) if l3 >= 0 else None
        if peer is None:
            return None
        return answer_through_tunnel(answer, peer.address, plan.tunnel_ofport)

    def _peer_flows(self, p: PeerNode) -> list[messages.FlowSpec]:
        plan, round_ = self.underlay.plan, self._round()
        if not plan.geneve:
            return [unknown_peer_flow(round_, plan.gateway_ofport, p.pod_cidr)]
        net = ipaddress.IPv4Network(p.pod_cidr)
        gateway = str(next(iter(net.hosts()), net.network_address))  # a Node's gateway: its subnet's first host
        return peer_flows(round_, plan.tunnel_ofport, p.pod_cidr, p.address) + (
            [known_source_flow(round_, plan.tunnel_ofport, gateway)] if plan.deny_unknown_sources else [])

    async def start(self) -> None:
        """The tunnel port's flows, then the peers known so far; later changes follow in a task."""
        self._loop = asyncio.get_running_loop()
        self._refreshed = self._loop.time()
        self.say_window()
        if self.underlay.plan.geneve:
            plan = self.underlay.plan
            await self._channel.install_flows(tunnel_port_flows(self._round(), plan.tunnel_ofport,
                                                                plan.deny_unknown_sources))
        await self.sync()
        await self._check_aging()
        self._task = asyncio.create_task(self._follow(), name="node-routes")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _follow(self) -> None:
        while True:
            if self.underlay.resolves_next_hops:  # the next hops resolved again before OVS's aging lapses them
                loop = asyncio.get_running_loop()
                due = self._refreshed + self._refresh - loop.time()
                try:
                    await within(self._wake.wait(), max(0.0, min(due, self._retry) if self.unresolved
                                                                  else due))
                except asyncio.TimeoutError:
                    try:  # every peer when the refresh is due, else only those that did not answer
                        await (self.refresh_next_hops() if loop.time() >= self._refreshed + self._refresh
                               else self.retry_unresolved())
                    except Exception as exc:  # the next round retries
                        log.warning("node routes: %s", one_line(exc), exc_info=log.isEnabledFor(logging.DEBUG))
                    continue
            else:
                await self._wake.wait()
            try:
                await self.sync()
            except Exception as exc:  # one failed sync must not end the routes: the next change retries
                log.warning("node routes: %s", one_line(exc), exc_info=log.isEnabledFor(logging.DEBUG))

    async def refresh_next_hops(self) -> None:
        """Every routed peer's underlay next hop resolved and set in OVS again (its aging starts over)."""
        self._refreshed = asyncio.get_running_loop().time()
        failed = await asyncio.to_thread(self.underlay.refresh_peers)
        self._resolved(self.routed, failed)
        await self._check_aging()

    async def retry_unresolved(self) -> None:
        """The peers whose next hop did not answer, tried again (the wait before the next try doubles)."""
        peers = [p for p in self.routed if p.name in self.unresolved]
        failed = await asyncio.to_thread(self.underlay.resolve_peers, [p.address for p in peers])
        self._retry = min(self._retry * 2, RETRY)
        self._resolved(peers, failed)

    async def _check_aging(self) -> None:
        """Once: a warning when OVS's tunnel neighbour aging lapses an entry before the agent sets it again."""
        aging = await asyncio.to_thread(self.underlay.neighbour_aging)
        if aging is not None and aging <= self._refresh and not self._aging_said:
            self._aging_said = True
            log.warning("cluster: cluster.underlay_refresh (%gs) is not shorter than OVS's tnl/neigh/aging (%ds): "
                        "an idle peer's next hop lapses before it is set again, and the first packet after that "
                        "is lost", self._refresh, aging)

    def _resolved(self, peers: Sequence[PeerNode], failed: Mapping[str, str]) -> None:
        """Note which of `peers` (just resolved) have an unresolved next hop; said once per peer and change.
        An unreachable peer is reported as that alone."""
        for p in peers:
            why = failed.get(p.address)
            if why is None or p.name in self.unreachable:
                if self.unresolved.pop(p.name, None) is not None:
                    log.info("cluster: peer %s's underlay next hop is resolved now", p.name)
                continue
            if p.name not in self.unresolved:
                self.problems["unresolved"] += 1
                log.warning("cluster: peer %s at %s: its underlay next hop is not resolved (%s): the first packet "
                            "towards it would be lost while OVS resolves it; retried from %gs to every %gs",
                            p.name, p.address, why, FIRST_RETRY, min(self._refresh, RETRY))
            self.unresolved[p.name] = why
        if not self.unresolved:
            self._retry = FIRST_RETRY

    async def _resolve_then_install(self, new: Sequence[PeerNode], drop: Sequence[str],
                                    flows: Mapping[PeerNode, list[messages.FlowSpec]]) -> Mapping[str, str]:
        """Geneve on the userspace datapath: each new peer's next hop known to OVS before its route exists,
        so no Pod packet is the one OVS drops while it resolves (ovs/tunnel_neighbours.py). A peer's flows go
        in as soon as its next hop is set; a peer that does not answer ARP holds back only its own, for the
        ARP timeout, and goes in after it (OVS resolves it late). {address: why not resolved}."""
        loop = asyncio.get_running_loop()
        set_now: asyncio.Queue[str] = asyncio.Queue()

        def on_set(address: str) -> None:  # in the resolving thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for it
                loop.call_soon_threadsafe(set_now.put_nowait, address)

        resolving = asyncio.ensure_future(asyncio.to_thread(self.underlay.resolve_peers, [p.address for p in new],
                                                            drop, on_set))
        waiting = dict(flows)
        answer: asyncio.Future[str] | None = None
        try:
            while waiting and not resolving.done():
                answer = asyncio.ensure_future(set_now.get())
                await asyncio.wait({answer, resolving}, return_when=asyncio.FIRST_COMPLETED)
                if not answer.done():
                    answer.cancel()
                    break
                await self._install({p: waiting.pop(p) for p in list(waiting) if p.address == answer.result()})
            failed = await resolving
        except BaseException:
            if answer is not None:
                answer.cancel()
            forget(resolving)  # the thread runs on to its end
            raise
        await self._install(waiting)
        return failed

    async def _install(self, flows: Mapping[PeerNode, list[messages.FlowSpec]]) -> None:
        if flows:
            await self._channel.install_flows([f for fl in flows.values() for f in fl])
            self._flows.update(flows)

    async def sync(self) -> None:
        """Make the datapath route exactly the chosen peers."""
        self._wake.clear()
        offered = [p for peers in self._by_source.values() for p in peers]
        chosen, refused = choose(self.underlay.plan.pod_cidr, self.routed, offered)
        for r in refused:
            if r not in self.refused:
                self.problems[r.reason] += 1
                log.warning("cluster: peer %s (Pod subnet %s, address %s) refused: %s", r.peer.name or "?",
                            r.peer.pod_cidr, r.peer.address, r.detail)
        self.refused = refused
        gone = [p for p in self.routed if p not in chosen]
        new = [p for p in chosen if p not in self.routed]
        plan = self.underlay.plan
        # Geneve: each peer's route into the tunnel and, with deny_unknown_sources, its gateway address taken
        # from the tunnel (the peer node itself reaching this node's Pods: no Pod object names it). Routed,
        # with deny_unknown_sources: the drop of its subnet's unknown sources through the gateway, in before
        # its kernel route (the peer node itself comes from its underlay address, outside that subnet).
        flows = {p: self._peer_flows(p) for p in new if plan.geneve or plan.deny_unknown_sources}
        # A peer that moved (same subnet, new address) is overwritten in place, never deleted after.
        rewritten = {f.key for fl in flows.values() for f in fl}
        stale = [f for p in gone for f in self._flows.pop(p, []) if f.key not in rewritten]
        kept = {p.address for p in chosen}
        failed = await self._resolve_then_install(new, [p.address for p in gone if p.address not in kept], flows)
        if not plan.geneve:
            await asyncio.to_thread(self.underlay.set_routes, [(p.pod_cidr, p.address) for p in chosen])
        if stale:
            await self._channel.delete_flows(stale)
        self.routed = chosen
        if (new or gone) and self._masquerade is not None:
            await asyncio.to_thread(self._masquerade, [p.pod_cidr for p in chosen])
        for p in gone:  # before the new ones: a peer that moved keeps its name
            self.unreachable.pop(p.name, None)
            self.unresolved.pop(p.name, None)
        for p in new:
            why = await asyncio.to_thread(self.underlay.unreachable, p.address)
            if why is not None:
                self.problems["unreachable"] += 1
                self.unreachable[p.name] = why
                log.warning("cluster: peer %s at %s is unreachable from this node (%s): its Pods (%s) "
                            "cannot be reached until it is", p.name, p.address, why, p.pod_cidr)
        self._resolved(new, failed)
        if new or gone:
            log.info("cluster: routing %d peer(s)%s%s", len(chosen),
                     "; added " + ", ".join(f"{p.name} {p.pod_cidr} via {p.address}" for p in new) if new else "",
                     "; removed " + ", ".join(p.name for p in gone) if gone else "")


class NodeRoutesCollector:
    """npaudit_cluster_peers{state}, npaudit_cluster_peer_problems_total{reason} and, with deny_unknown_sources,
    npaudit_cluster_unknown_source_drops_total (`unknown_drops`: None until first read) and, with Geneve,
    npaudit_cluster_unknown_vni_drops_total (`vni_drops`: the same)."""

    def __init__(self, routes: NodeRoutes, unknown_drops: Callable[[], int | None] = lambda: None,
                 vni_drops: Callable[[], int | None] = lambda: None) -> None:
        self._routes = routes
        self._unknown_drops = unknown_drops
        self._vni_drops = vni_drops

    def collect(self) -> Iterator[Metric]:
        r = self._routes
        peers = GaugeMetricFamily("npaudit_cluster_peers", "Other nodes by state: routed (Pod traffic goes to "
                                  "them), refused (overlapping or malformed), unreachable (routed, no underlay "
                                  "route to the address), unresolved (routed, Geneve on the userspace datapath: "
                                  "the underlay next hop did not answer ARP, so OVS drops the first packet towards "
                                  "it while it resolves)", labels=["state"])
        peers.add_metric(["routed"], len(r.routed))
        peers.add_metric(["refused"], len(r.refused))
        peers.add_metric(["unreachable"], len(r.unreachable))
        peers.add_metric(["unresolved"], len(r.unresolved))
        yield peers
        problems = CounterMetricFamily("npaudit_cluster_peer_problems", "Peers refused or found unreachable or "
                                       "unresolved, by reason (overlap, invalid, unreachable, unresolved)",
                                       labels=["reason"])
        for reason in ("overlap", "invalid", "unreachable", "unresolved"):
            problems.add_metric([reason], r.problems.get(reason, 0))
        yield problems
        if r.denies_unknown:
            yield CounterMetricFamily("npaudit_cluster_unknown_source_drops", "Packets from the tunnel dropped "
                                      "before any rule because no Pod this node knows holds their source address "
                                      "(cluster.deny_unknown_sources: a Pod of another node whose object has not "
                                      "arrived here yet)", value=self._unknown_drops() or 0)
        if r.underlay.plan.geneve:
            yield CounterMetricFamily("npaudit_cluster_unknown_vni_drops", "IPv4 packets from the tunnel dropped "
                                      "before any rule because their Geneve VNI was neither Pod traffic's (0) nor "
                                      "a trace mark this node knows (a node of a newer version, or something else "
                                      "sending Geneve here)", value=self._vni_drops() or 0)
