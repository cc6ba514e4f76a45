"""The `node_network:` config section: this node's Pod subnet and its gateway port on the bridge."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from policy_agent.config.checks import bounded, checked, interface_name

# Antrea's antrea-gw0 takes OpenFlow port 2 (1 is its tunnel); ours does too. Pod ports come
# from 100 up (policy_agent/cni/ofports.py), so the two never meet.
GATEWAY_OFPORT = 2


def _pod_cidr(v: str) -> str | None:
    if v == "":
        return None
    try:
        net = ipaddress.IPv4Network(v)
    except ValueError:
        return f'must be an IPv4 subnet in CIDR notation with no host bits set (or "" for none), got {v!r}'
    if net.prefixlen > 30:
        return f"must leave room for a gateway and Pods (a prefix of /30 or shorter), got /{net.prefixlen}"
    return None


def _ipv4(v: str) -> str | None:
    if v == "":
        return None
    try:
        ipaddress.IPv4Address(v)
    except ValueError:
        return f'must be an IPv4 address (or "" for the first host address of pod_cidr), got {v!r}'
    return None


@dataclass(frozen=True)
class NodeNetworkConfig:
    # This node's Pod subnet (CIDR), the range its CNI IPAM hands out. "" = none: no gateway
    # port, and Pods reach only the other Pods of this node. When set, the agent puts a
    # gateway port on the bridge holding the subnet's gateway address (the Pods' default
    # route): the node (kubelet probes, Services, DNS) and destinations outside the subnet
    # are reached through it.
    pod_cidr: str = field(default="", metadata=checked(_pod_cidr))
    # The gateway address, inside pod_cidr; "" = its first host address (10.244.0.1 for
    # 10.244.0.0/24). Must match the CNI conflist's IPAM "gateway".
    gateway: str = field(default="", metadata=checked(_ipv4))
    # The gateway port: an OVS internal port, so an interface of this name appears in the
    # switch's network namespace (the embedded OVS's ovs.netns, else the host's).
    gateway_port: str = field(default="npaudit-gw0", metadata=checked(interface_name))
    # The OpenFlow port number the agent asks for it (OVS allows 1..65279).
    gateway_ofport: int = field(default=GATEWAY_OFPORT, metadata=checked(bounded(1, 0xFEFF)))
    # SNAT (iptables MASQUERADE, in the switch's namespace only) of Pod traffic leaving the
    # gateway for addresses outside pod_cidr, to the node's address on the way out.
    masquerade: bool = True

    @property
    def gateway_ip(self) -> str:
        """The gateway address ("" without a Pod subnet)."""
        if not self.pod_cidr:
            return ""
        return self.gateway or str(next(ipaddress.IPv4Network(self.pod_cidr).hosts()))

    def problems(self) -> list[str]:
        """What the fields get wrong together (each was checked alone at load)."""
        if not self.pod_cidr:
            return ["node_network.gateway: needs node_network.pod_cidr"] if self.gateway else []
        net = ipaddress.IPv4Network(self.pod_cidr)
        if self.gateway:
            ip = ipaddress.IPv4Address(self.gateway)
            if ip not in net or ip in (net.network_address, net.broadcast_address):
                return [f"node_network.gateway: {ip} is not a host address of node_network.pod_cidr {net}"]
        return []
