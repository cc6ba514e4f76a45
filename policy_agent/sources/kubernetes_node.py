"""This node's Node object, listed and watched: its spec.podCIDR(s) is the node's Pod subnet (cni/subnet.py)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Protocol

from policy_agent.sources.kubernetes_watch import Absent, Clock, Event, Item, ListCall, ResourceWatcher, Snapshot, Wait


class NodeSink(Protocol):
    """What takes this node's Node object (cni/subnet.py's NodeSubnet; agent.py wires it)."""

    def from_node(self, name: str, node: Mapping[str, Any]) -> None: ...

    def node_missing(self, name: str) -> None: ...


class NodeFeed:
    """One watch of the Node named `node_name` (field selector metadata.name), feeding `subnet`."""

    def __init__(self, list_node: Callable[..., object], node_name: str, subnet: NodeSink,
                 on_failure: Callable[[], None], *, backoff_max: float, page_size: int, clock: Clock,
                 wait: Wait, rand: Callable[[], float]) -> None:
        self.node_name = node_name
        self.subnet = subnet
        self.queue: asyncio.Queue[Item] = asyncio.Queue(16)
        call = ListCall("nodes", list_node, kwargs={"field_selector": f"metadata.name={node_name}"})
        self.watcher = ResourceWatcher(call, self.queue, on_failure, backoff_max=backoff_max,
                                       page_size=page_size, clock=clock, wait=wait, rand=rand)
        self.listed = asyncio.Event()

    async def consume(self) -> None:
        """Apply every list and event of the Node to the subnet; `listed` once the first list is in."""
        while True:
            item = await self.queue.get()
            if isinstance(item, Snapshot):
                mine = [n for n in item.items if _name(n) == self.node_name]
                if mine:
                    self.subnet.from_node(self.node_name, mine[0])
                else:
                    self.subnet.node_missing(self.node_name)
                self.listed.set()
            elif isinstance(item, Event) and item.type in ("ADDED", "MODIFIED") and _name(item.obj) == self.node_name:
                self.subnet.from_node(self.node_name, item.obj)
            elif isinstance(item, Absent):  # a built-in kind is always served; never kept waiting on it
                self.listed.set()


def _name(doc: dict[str, Any]) -> str:
    meta = m if isinstance(m := doc.get("metadata"), dict) else {}
    return str(meta.get("name") or "")
