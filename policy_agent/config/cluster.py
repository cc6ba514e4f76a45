"""The `cluster:` config section: how this node reaches the Pods of the other nodes.

Empty (no node_address) = one node: Pods reach other Pods of this node and, through the gateway,
the node and the outside. With node_address set, Pod traffic to another node's Pod subnet crosses
the underlay: Geneve (an OVS tunnel port whose remote address is chosen per flow, Antrea's
default) or routed (no encapsulation: the node routes it to the peer's address). The other
nodes come from `peers` standalone, from their Node objects in Kubernetes mode.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from policy_agent.config.checks import bounded, checked, interface_name, one_of

TUNNEL_OFPORT = 1  # Antrea's tunnel port number; the gateway takes 2, Pods 100 and up
GENEVE_OVERHEAD = 50  # outer IPv4 20 + UDP 8 + Geneve 8 + inner Ethernet 14


def _interface_address(v: str) -> str | None:
    if v == "":
        return None
    try:
        ipaddress.IPv4Interface(v)
    except ValueError:
        return f'must be an IPv4 address with its prefix length, e.g. 198.51.100.11/24 (or "" for one node), got {v!r}'
    return None if "/" in v else f"must give the prefix length too, e.g. {v}/24, got {v!r}"


def _optional_interface(v: str) -> str | None:
    return None if v == "" else interface_name(v)


@dataclass(frozen=True)
class PeerConfig:
    """Another node, standalone: its name, Pod subnet and underlay address."""

    name: str = ""
    pod_cidr: str = ""
    address: str = ""


@dataclass(frozen=True)
class ClusterConfig:
    # geneve: an OVS tunnel port (remote address per flow) carries Pod traffic between nodes.
    # routed: no encapsulation; the node routes a peer's Pod subnet to the peer's address, so the
    # underlay must carry Pod addresses (one L2 segment, or routes in the fabric).
    encapsulation: str = field(default="geneve", metadata=checked(one_of("geneve", "routed")))
    # This node's underlay address with its prefix (198.51.100.11/24); "" = one node, no tunnel.
    node_address: str = field(default="", metadata=checked(_interface_address))
    # The interface in the switch's namespace that reaches the other nodes. geneve on the
    # userspace (netdev) datapath, embedded or external, puts it on an OVS bridge of its own
    # (underlay_bridge, which holds node_address: that datapath sends tunnel packets through it);
    # the kernel datapath and routed keep it in the kernel with node_address.
    # "" with an external OVS: the host's own interfaces and routes carry the tunnel.
    underlay_interface: str = field(default="", metadata=checked(_optional_interface))
    underlay_bridge: str = field(default="br-phy", metadata=checked(interface_name))
    tunnel_port: str = field(default="npaudit-tun0", metadata=checked(interface_name))
    tunnel_ofport: int = field(default=TUNNEL_OFPORT, metadata=checked(bounded(1, 0xFEFF)))
    # The underlay's MTU; a Pod's interface gets it less the encapsulation's overhead.
    underlay_mtu: int = field(default=1500, metadata=checked(bounded(576, 65535)))
    # The other nodes, standalone (Kubernetes mode adds those of the Node objects).
    peers: tuple[PeerConfig, ...] = ()
    # Take a new connection from another node's Pod (Geneve: from the tunnel; routed: through the
    # gateway from a peer's Pod subnet) only when its source address is a Pod this node knows (its
    # Pod object: watched, or applied standalone); drop the rest before any rule, counted
    # (npaudit_cluster_unknown_source_drops_total, and an "unknown_source" loss record per window).
    # So a Pod that starts on another node before its object reaches this one cannot pass a rule its
    # labels would fail; the price: its first connections to this node's Pods are refused until its
    # object arrives (the Pod watch's delay; SYNs are retried). Off: that window is open, and the
    # agent says so at start.
    deny_unknown_sources: bool = True
    # Geneve on the userspace (netdev) datapath: each peer's underlay next hop is resolved (ARP) and set
    # in OVS's tunnel neighbour cache when the peer is added, so no Pod packet is the one OVS drops while
    # it resolves; and again every this many seconds, within OVS's tnl/neigh/aging (900 s by default; an
    # entry unused that long lapses), and after an OVS restart. A peer that does not answer is retried
    # every 10 s (npaudit_cluster_peers{state="unresolved"}).
    underlay_refresh: float = field(default=300.0, metadata=checked(bounded(1.0, 3600.0)))

    @property
    def enabled(self) -> bool:
        return bool(self.node_address)

    @property
    def pod_mtu(self) -> int:
        """The MTU of a Pod's interface: the underlay's, less the tunnel's headers."""
        return self.underlay_mtu - (GENEVE_OVERHEAD if self.enabled and self.encapsulation == "geneve" else 0)

    def problems(self, pod_cidr: str) -> list[str]:
        """What the fields get wrong together, and with this node's Pod subnet `pod_cidr` ("" = none yet)."""
        out: list[str] = []
        if self.enabled and not pod_cidr:
            out.append("cluster.node_address: needs node_network.pod_cidr (Pods reach other nodes through the gateway)")
        if self.peers and not self.enabled:
            out.append("cluster.peers: needs cluster.node_address (this node's underlay address)")
        own = ipaddress.IPv4Network(pod_cidr) if pod_cidr else None
        names: set[str] = set()
        nets: list[tuple[str, ipaddress.IPv4Network]] = [("this node", own)] if own is not None else []
        for i, peer in enumerate(self.peers):
            where = f"cluster.peers[{i}]"
            if not peer.name or peer.name in names:
                out.append(f"{where}.name: must be given and unique, got {peer.name!r}")
            names.add(peer.name)
            try:
                ipaddress.IPv4Address(peer.address)
            except ValueError:
                out.append(f"{where}.address: must be an IPv4 address, got {peer.address!r}")
            try:
                net = ipaddress.IPv4Network(peer.pod_cidr)
            except ValueError:
                out.append(f"{where}.pod_cidr: must be an IPv4 subnet in CIDR notation, got {peer.pod_cidr!r}")
                continue
            out += [f"{where}.pod_cidr: {net} overlaps the Pod subnet of {other} ({got})"
                    for other, got in nets if net.overlaps(got)]
            nets.append((peer.name, net))
        return out
