"""The other nodes of the cluster, from Node objects and config, merged into one set for the node routes.

`peers_from_nodes` is pure: Node objects -> PeerNodes and the problems of the ones it cannot use.
`KnownNodes` is a PeerSink: it keeps each source's set, merges them, refuses a node whose Pod subnet
overlaps this node's or an already accepted node's (the node seen first keeps its routes, the later
one is refused: a new bad Node never disturbs a working one), hands the merged set on, and counts.
Every problem is logged once per node and change of it, never per watch event.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from policy_agent.cluster.nodes import PeerNode, PeerSink
from policy_agent.cni.subnet import node_pod_cidr

log = logging.getLogger(__name__)

# Reasons, the values of npaudit_cluster_node_problems_total{reason}.
NO_POD_CIDR = "node_without_pod_cidr"
BAD_POD_CIDR = "node_pod_cidr_invalid"
NO_ADDRESS = "node_without_address"
OVERLAP = "node_pod_cidr_overlaps"
POD_OUTSIDE = "pod_ip_outside_node_subnets"
REASONS = (NO_POD_CIDR, BAD_POD_CIDR, NO_ADDRESS, OVERLAP, POD_OUTSIDE)

PodKey = tuple[str, str]


@dataclass(frozen=True, order=True)
class NodeProblem:
    """Why a node (or a Pod, `node` then "namespace/name") is left out or looks wrong."""

    node: str
    reason: str
    detail: str


def node_address(node: Mapping[str, Any]) -> str | None:
    """The node's underlay IPv4 from status.addresses: the first InternalIP, else the first ExternalIP."""
    status = s if isinstance(s := node.get("status"), dict) else {}
    addresses = a if isinstance(a := status.get("addresses"), list) else []
    for kind in ("InternalIP", "ExternalIP"):
        for entry in addresses:
            if isinstance(entry, dict) and entry.get("type") == kind:
                try:
                    ip = ipaddress.ip_address(str(entry.get("address")))
                except ValueError:
                    continue
                if ip.version == 4:
                    return str(ip)
    return None


def _name(node: Mapping[str, Any]) -> str:
    meta = m if isinstance(m := node.get("metadata"), dict) else {}
    return str(meta.get("name") or "")


def peers_from_nodes(nodes: Iterable[Mapping[str, Any]], self_name: str
                     ) -> tuple[list[PeerNode], list[NodeProblem]]:
    """Every Node other than `self_name` that has an IPv4 podCIDR and address, sorted by name; the
    problems of those that do not. Overlaps are not judged here (KnownNodes does, with history)."""
    peers: list[PeerNode] = []
    problems: list[NodeProblem] = []
    for node in nodes:
        name = _name(node)
        if not name or name == self_name:
            continue
        try:
            cidr = node_pod_cidr(node)
        except ValueError as exc:
            problems.append(NodeProblem(name, BAD_POD_CIDR, str(exc)))
            continue
        if cidr is None:
            problems.append(NodeProblem(name, NO_POD_CIDR, "no spec.podCIDR: its Pods are not routed to "
                                        "until it has one"))
            continue
        address = node_address(node)
        if address is None:
            problems.append(NodeProblem(name, NO_ADDRESS, f"no IPv4 InternalIP or ExternalIP in status.addresses: "
                                        f"its Pod subnet {cidr} is not routed to until it has one"))
            continue
        peers.append(PeerNode(name, cidr, address))
    return sorted(peers), sorted(problems)


def accept(candidates: Sequence[PeerNode], own_cidr: str, first: Sequence[str]
           ) -> tuple[list[PeerNode], list[NodeProblem]]:
    """The candidates whose Pod subnets overlap neither `own_cidr` nor an accepted one. Names in
    `first` (those accepted before, in order) are judged first, so a later node is the one refused."""
    order = {name: i for i, name in enumerate(first)}
    ranked = sorted(candidates, key=lambda p: (order.get(p.name, len(order)), p.name))
    own = ipaddress.IPv4Network(own_cidr) if own_cidr else None
    taken: list[tuple[ipaddress.IPv4Network, str]] = []
    out: list[PeerNode] = []
    problems: list[NodeProblem] = []
    for peer in ranked:
        net = ipaddress.IPv4Network(peer.pod_cidr)
        if own is not None and net.overlaps(own):
            problems.append(NodeProblem(peer.name, OVERLAP, f"Pod subnet {net} overlaps this node's {own}: "
                                        "not routed"))
            continue
        clash = next((other for other_net, other in taken if net.overlaps(other_net)), None)
        if clash is not None:
            problems.append(NodeProblem(peer.name, OVERLAP, f"Pod subnet {net} overlaps node {clash}'s: not "
                                        f"routed ({clash} keeps its routes)"))
            continue
        taken.append((net, peer.name))
        out.append(peer)
    return sorted(out), problems


class KnownNodes:
    """A PeerSink that merges its sources (a name given by several: the first source to give it wins),
    judges overlaps and hands the merged set to `downstream` (the node routes) when it changes.

    `own_cidr` reads this node's Pod subnet ("" while unknown). Not thread-safe: call it from one
    thread (the event loop)."""

    def __init__(self, own_cidr: Callable[[], str] = lambda: "", downstream: PeerSink | None = None) -> None:
        self._own_cidr = own_cidr
        self.downstream = downstream
        self._sources: dict[str, list[PeerNode]] = {}
        self._source_problems: dict[str, list[NodeProblem]] = {}
        self._order: list[str] = []  # names accepted, oldest first
        self.peers: list[PeerNode] = []  # the merged, accepted set, by name
        self._reported: set[NodeProblem] = set()  # problems standing now (each logged once)
        self.problems: dict[str, int] = {reason: 0 for reason in REASONS}
        # Pods' addresses, to find those outside every node's Pod subnet (kept: a Node may arrive later).
        self._pods: dict[PodKey, tuple[str, ...]] = {}
        self._pod_reported: dict[PodKey, tuple[str, ...]] = {}
        self._subnets_known = False
        self._nets: list[ipaddress.IPv4Network] = []  # the node subnets the Pods were last checked against

    # --- PeerSink --------------------------------------------------------------------

    def set_peers(self, source: str, peers: Sequence[PeerNode], problems: Sequence[NodeProblem] = ()) -> None:
        """Replace what `source` gave (and the problems it found in its input), then merge."""
        self._sources[source] = list(peers)
        self._source_problems[source] = list(problems)
        self.refresh()

    def refresh(self) -> None:
        """Merge again (also when this node's own subnet became known or changed)."""
        merged: dict[str, PeerNode] = {}
        for peers in self._sources.values():
            for peer in peers:
                merged.setdefault(peer.name, peer)
        accepted, overlaps = accept(list(merged.values()), self._own_cidr(), self._order)
        names = {p.name for p in accepted}
        self._order = [n for n in self._order if n in names] + sorted(names - set(self._order))
        problems = [p for ps in self._source_problems.values() for p in ps] + overlaps
        self._report(problems)
        changed = accepted != self.peers
        self.peers = accepted
        # Judged only once a source told what nodes there are (this node's subnet alone is not all of them).
        self._subnets_known = bool(self._sources)
        nets = self._subnets()
        if nets != self._nets:  # a Node's unrelated change (its conditions) does not walk every Pod
            self._nets = nets
            self._check_all_pods()
        if changed:
            log.info("cluster: %d other nodes routed: %s", len(accepted),
                     ", ".join(f"{p.name} {p.pod_cidr} via {p.address}" for p in accepted) or "none")
            if self.downstream is not None:
                self.downstream.set_peers("merged", accepted)

    def _report(self, problems: Iterable[NodeProblem]) -> None:
        now = set(problems)
        for p in sorted(now - self._reported):
            self.problems[p.reason] += 1
            log.error("cluster: node %s: %s", p.node, p.detail)
        for p in sorted(self._reported - now):
            if not any(q.node == p.node for q in now):
                log.info("cluster: node %s: no longer a problem (%s)", p.node, p.reason)
        self._reported = now

    # --- Pod addresses ---------------------------------------------------------------

    def pods_changed(self, pods: Iterable[tuple[PodKey, tuple[str, ...]]], gone: Iterable[PodKey] = ()) -> None:
        """Pods' current addresses (an empty tuple: none) and the Pods deleted."""
        for key in gone:
            self._pods.pop(key, None)
            self._pod_reported.pop(key, None)
        checked = []
        for key, ips in pods:
            if ips:
                self._pods[key] = ips
            else:
                self._pods.pop(key, None)
                self._pod_reported.pop(key, None)
            checked.append(key)
        for key in checked:
            self._check_pod(key)

    def _subnets(self) -> list[ipaddress.IPv4Network]:
        own = self._own_cidr()
        nets = [ipaddress.IPv4Network(own)] if own else []
        nets += [ipaddress.IPv4Network(p.pod_cidr) for peers in self._sources.values() for p in peers]
        return nets

    def _check_all_pods(self) -> None:
        if not self._subnets_known:
            return
        for key in list(self._pods):
            self._check_pod(key, self._nets)

    def _check_pod(self, key: PodKey, nets: list[ipaddress.IPv4Network] | None = None) -> None:
        """A Pod address outside every known node subnet: logged and counted once per Pod and change
        (the Pod is still named by its address: the directory does not need its node)."""
        ips = self._pods.get(key)
        if ips is None or not self._subnets_known:
            return
        nets = self._nets if nets is None else nets
        outside = tuple(ip for ip in ips if not any(ipaddress.IPv4Address(ip) in n for n in nets))
        if not outside:
            self._pod_reported.pop(key, None)
            return
        if self._pod_reported.get(key) == outside:
            return
        self._pod_reported[key] = outside
        self.problems[POD_OUTSIDE] += 1
        log.error("cluster: Pod %s/%s has address %s outside every node's Pod subnet (%s): named by its "
                  "address, its traffic is not routed between nodes", key[0], key[1], ", ".join(outside),
                  ", ".join(str(n) for n in nets))

    # --- status and metrics ----------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """For `npaudit status`: the nodes routed to, and what is wrong now."""
        return {"count": len(self.peers),
                "nodes": [{"name": p.name, "pod_cidr": p.pod_cidr, "address": p.address} for p in self.peers],
                "problems": [{"node": p.node, "reason": p.reason, "detail": p.detail}
                             for p in sorted(self._reported)],
                "pods_outside": len(self._pod_reported)}


class KnownNodesCollector:
    """npaudit_cluster_nodes and npaudit_cluster_node_problems_total{reason}."""

    def __init__(self, nodes: KnownNodes) -> None:
        self._nodes = nodes

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("npaudit_cluster_nodes", "Other nodes whose Pod subnet this node routes to",
                                value=len(self._nodes.peers))
        problems = CounterMetricFamily("npaudit_cluster_node_problems", "Bad cluster input, once per node (or Pod) "
                                       "and change: a Node without or with a bad podCIDR or without an address, "
                                       "overlapping Pod subnets, a Pod address outside every node's subnet",
                                       labels=["reason"])
        for reason, n in sorted(self._nodes.problems.items()):
            problems.add_metric([reason], n)
        yield problems
