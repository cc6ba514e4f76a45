"""This node's Pod subnet: the range the CNI's IPAM hands out, from config (standalone) or the Node object.

The shipped conflist names no range: when a network configuration's `ipam` gives no
`ranges` (nor a `subnet`), the agent fills host-local's range from here, so no two
nodes share a constant. A Node without a podCIDR, or an address outside the subnet,
is one log line and a count (`problems`), never a traceback.

The subnet is taken once: from config, else from the first podCIDR the Node shows. Kubernetes
does not let a Node's podCIDR change; a Node deleted and made again with another one is refused
(logged, counted) until the agent restarts, since the node gateway and every Pod's address are
in the first one.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import threading
from typing import Any, Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

NO_POD_CIDR = "node_without_pod_cidr"
BAD_POD_CIDR = "node_pod_cidr_invalid"
OUTSIDE = "pod_ip_outside_node_subnet"


def node_pod_cidr(node: Mapping[str, Any]) -> str | None:
    """The first IPv4 subnet of a Node's spec.podCIDRs (else spec.podCIDR); None when it has none.
    ValueError when what it names is no IPv4 subnet."""
    spec = s if isinstance(s := node.get("spec"), dict) else {}
    cidrs = spec.get("podCIDRs")
    named = [c for c in cidrs if isinstance(c, str)] if isinstance(cidrs, list) else []
    if not named and isinstance(spec.get("podCIDR"), str) and spec["podCIDR"]:
        named = [spec["podCIDR"]]
    if not named:
        return None
    for cidr in named:
        try:
            net = ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise ValueError(f"podCIDR {cidr!r} is not a subnet: {exc}") from exc
        if net.version == 4:
            if net.prefixlen > 30:
                raise ValueError(f"podCIDR {cidr} leaves no room for a gateway and Pods")
            return str(net)
    raise ValueError(f"no IPv4 subnet among podCIDRs {named} (npaudit runs IPv4 Pods only)")


class NodeSubnet:
    """The current Pod subnet and gateway of this node (None until known); thread-safe reads."""

    def __init__(self, cidr: str = "", gateway: str = "") -> None:
        self._lock = threading.Lock()
        self._net: ipaddress.IPv4Network | None = None
        self._gateway = ""
        self.source = ""
        self.problems: dict[str, int] = {NO_POD_CIDR: 0, BAD_POD_CIDR: 0, OUTSIDE: 0}
        # From config: the gateway port holds its address, so a Node saying otherwise is reported, not taken.
        self.pinned = bool(cidr)
        self._listeners: list[Callable[[str], None]] = []
        if cidr:
            self.set(cidr, gateway, source="config node_network.pod_cidr")

    @property
    def cidr(self) -> str:
        return str(self._net) if self._net is not None else ""

    @property
    def gateway(self) -> str:
        return self._gateway

    def set(self, cidr: str, gateway: str = "", *, source: str) -> None:
        net = ipaddress.IPv4Network(cidr)
        gw = gateway or str(next(net.hosts()))
        with self._lock:
            changed = net != self._net
            self._net, self._gateway, self.source = net, gw, source
        if changed:
            log.info("node Pod subnet %s (gateway %s) from %s", net, gw, source)
            for listener in list(self._listeners):
                listener(str(net))

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener(cidr)` when the subnet is set or changes (on the thread that sets it)."""
        self._listeners.append(listener)

    def from_node(self, name: str, node: Mapping[str, Any]) -> None:
        """Take the subnet of this node's Node object; a bad one is logged and counted, the last one kept."""
        try:
            cidr = node_pod_cidr(node)
        except ValueError as exc:
            self.count(BAD_POD_CIDR, "Node %s: %s; Pods keep the subnet %s", name, exc, self.cidr or "(none yet)")
            return
        if cidr is None:
            self.count(NO_POD_CIDR, "Node %s has no spec.podCIDR: new Pods get no address until it has one "
                       "(the cluster's node IPAM, e.g. kube-controller-manager --allocate-node-cidrs, assigns it)",
                       name)
            return
        if self.pinned and cidr != self.cidr:
            if self.source.startswith("config"):
                self.count(BAD_POD_CIDR, "Node %s has podCIDR %s but node_network.pod_cidr is %s: Pods keep %s "
                           "(the node gateway holds its address); make the two agree", name, cidr, self.cidr,
                           self.cidr)
            else:
                self.count(BAD_POD_CIDR, "Node %s podCIDR changed from %s to %s: refused, Pods and the node gateway "
                           "keep %s; restart the agent to take %s", name, self.cidr, cidr, self.cidr, cidr)
            return
        self.set(cidr, source=f"Node {name} spec.podCIDR")
        self.pinned = True

    def node_missing(self, name: str) -> None:
        self.count(NO_POD_CIDR, "Node %s not found in the Kubernetes API (is NODE_NAME the node's name?): "
                   "new Pods get no address until it appears", name)

    def count(self, reason: str, fmt: str, *args: object) -> None:
        self.problems[reason] += 1
        log.error(fmt, *args)

    def check_address(self, who: str, ip: str) -> None:
        """An address handed to a Pod of this node that is outside its subnet: logged and counted."""
        net = self._net
        try:
            inside = net is None or ipaddress.IPv4Address(ip) in net
        except ValueError:
            inside = False
        if not inside:
            self.count(OUTSIDE, "Pod %s got address %s outside this node's Pod subnet %s "
                       "(does the network configuration name its own ipam ranges?)", who, ip, net)

    def ipam(self, ipam: Mapping[str, Any]) -> dict[str, Any]:
        """host-local's `ipam` with this node's range when it names none (ranges/subnet given: kept)."""
        out = copy.deepcopy(dict(ipam))
        if out.get("ranges") or out.get("subnet"):
            return out
        with self._lock:
            net, gw = self._net, self._gateway
        if net is None:
            raise LookupError("this node has no Pod subnet yet (no node_network.pod_cidr, or the Node "
                              "object has no spec.podCIDR)")
        out["ranges"] = [[{"subnet": str(net), "gateway": gw}]]
        return out


class SubnetCollector:
    """npaudit_node_subnet_problems_total{reason} and npaudit_node_subnet_known."""

    def __init__(self, subnet: NodeSubnet) -> None:
        self._subnet = subnet

    def collect(self) -> Iterator[Metric]:
        problems = CounterMetricFamily("npaudit_node_subnet_problems", "Bad Pod-subnet input: a Node without "
                                       "or with a bad podCIDR, a Pod address outside the node subnet",
                                       labels=["reason"])
        for reason, n in sorted(self._subnet.problems.items()):
            problems.add_metric([reason], n)
        yield problems
        yield GaugeMetricFamily("npaudit_node_subnet_known", "1 when this node's Pod subnet is known",
                                value=1 if self._subnet.cidr else 0)
