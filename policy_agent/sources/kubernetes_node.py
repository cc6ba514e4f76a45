"""Every Node object, listed and watched: this node's spec.podCIDR(s) is its Pod subnet (cni/subnet.py),
the others are the cluster's peer nodes (cluster/peer_nodes.py: Pod subnet and underlay address)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from policy_agent.cluster.nodes import PeerNode
from policy_agent.cluster.peer_nodes import NodeProblem, peers_from_nodes
from policy_agent.sources.kubernetes_watch import Absent, Clock, Event, Item, ListCall, ResourceWatcher, Snapshot, Wait

SOURCE = "kubernetes"  # the PeerSink source name of the Node objects' peers


class NodeSink(Protocol):
    """What takes this node's Node object (cni/subnet.py's NodeSubnet; agent.py wires it)."""

    def from_node(self, name: str, node: Mapping[str, Any]) -> None: ...

    def node_missing(self, name: str) -> None: ...


class PeersSink(Protocol):
    """What takes the other nodes and every Pod's addresses (cluster/peer_nodes.py's KnownNodes)."""

    def set_peers(self, source: str, peers: Sequence[PeerNode], problems: Sequence[NodeProblem] = ()) -> None: ...

    def pods_changed(self, pods: Iterable[tuple[tuple[str, str], tuple[str, ...]]],
                     gone: Iterable[tuple[str, str]] = ()) -> None: ...


def node_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """What of a Node is read: its name, Pod subnet and addresses (not its conditions, which change often)."""
    meta = m if isinstance(m := doc.get("metadata"), dict) else {}
    spec = s if isinstance(s := doc.get("spec"), dict) else {}
    status = st if isinstance(st := doc.get("status"), dict) else {}
    out: dict[str, Any] = {"metadata": {k: meta[k] for k in ("name", "resourceVersion") if k in meta}}
    out["spec"] = {k: spec[k] for k in ("podCIDR", "podCIDRs") if k in spec}
    out["status"] = {"addresses": status["addresses"]} if "addresses" in status else {}
    return out


def _same(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Equal but for resourceVersion (which every status heartbeat bumps)."""
    return a is not None and (a.get("spec"), a.get("status")) == (b.get("spec"), b.get("status"))


class NodeFeed:
    """One watch of all Nodes: the one named `node_name` feeds `subnet`, the others `peers` (when given).
    Each is handed on only when what is read of it changed, so a problem is logged once per change."""

    def __init__(self, list_node: Callable[..., object], node_name: str, subnet: NodeSink,
                 on_failure: Callable[[], None], *, backoff_max: float, page_size: int, clock: Clock,
                 wait: Wait, rand: Callable[[], float], peers: PeersSink | None = None) -> None:
        self.node_name = node_name
        self.subnet = subnet
        self.peers = peers
        self.queue: asyncio.Queue[Item] = asyncio.Queue(64)
        call = ListCall("nodes", list_node, trim=node_fields)
        self.watcher = ResourceWatcher(call, self.queue, on_failure, backoff_max=backoff_max,
                                       page_size=page_size, clock=clock, wait=wait, rand=rand)
        self.listed = asyncio.Event()
        self._own: dict[str, Any] | None = None
        self._others: dict[str, dict[str, Any]] = {}  # name -> node_fields of every other Node

    async def consume(self) -> None:
        """Apply every list and event; `listed` once the first list is in."""
        while True:
            item = await self.queue.get()
            if isinstance(item, Snapshot):
                mine = [n for n in item.items if _name(n) == self.node_name]
                if mine:
                    self._mine(mine[0])
                else:
                    self._own = None
                    self.subnet.node_missing(self.node_name)
                others = {_name(n): n for n in item.items if _name(n) not in ("", self.node_name)}
                if others.keys() != self._others.keys() or any(
                        not _same(self._others.get(k), v) for k, v in others.items()) or not self.listed.is_set():
                    self._others = others
                    self._hand_peers()
                self.listed.set()
            elif isinstance(item, Event) and item.type in ("ADDED", "MODIFIED", "DELETED"):
                name = _name(item.obj)
                if name == self.node_name:
                    if item.type != "DELETED":  # a deleted Node keeps its subnet: its Pods hold addresses in it
                        self._mine(item.obj)
                elif name:
                    if item.type == "DELETED":
                        if self._others.pop(name, None) is not None:
                            self._hand_peers()
                    elif not _same(self._others.get(name), item.obj):
                        self._others[name] = item.obj
                        self._hand_peers()
            elif isinstance(item, Absent):  # a built-in kind is always served; never kept waiting on it
                self.listed.set()

    def _mine(self, node: dict[str, Any]) -> None:
        if _same(self._own, node):
            return
        self._own = node
        self.subnet.from_node(self.node_name, node)

    def _hand_peers(self) -> None:
        if self.peers is not None:
            peers, problems = peers_from_nodes(self._others.values(), self.node_name)
            self.peers.set_peers(SOURCE, peers, problems)


def _name(doc: dict[str, Any]) -> str:
    meta = m if isinstance(m := doc.get("metadata"), dict) else {}
    return str(meta.get("name") or "")
