"""The flows that carry Pod traffic between nodes over Geneve, as pure functions of the plan and the peers.

  0 CLASSIFIER  in_port=tunnel, ip, tun_id=0 -> 10: another node's Pod traffic (Geneve VNI 0) meets
                conntrack, then the policy tables; IPv4 from the tunnel with any other VNI is
                dropped (above it only the trace marks' flows, traceflow/flows.py, take theirs) by a
                flow with a cookie of its own (`unknown_vni_request` reads its packet count:
                npaudit_cluster_unknown_vni_drops_total), so a mark this version does not know (a
                newer node's) never reaches a Pod; anything else from the tunnel (ARP) is dropped:
                nodes send only IPv4 to each other, and the receiving node sets the Pod's MAC
                itself (table 70).
                Egress rules match this node's Pods by their in_port, so a packet from the tunnel
                meets ingress policy only: its egress was judged on the node it
                left (before the tunnel), its ingress is judged here (after it).
 25 SRC_CLASS   with cluster.deny_unknown_sources (new connections only: replies of connections
                this node's Pods opened pass as established): in_port=tunnel, ip, nw_src=<an
                address the Pod directory holds> -> 26, one flow per address, changed in the same
                bundle as the policy flows that name it (engine: `admission`); any other source
                from the tunnel is dropped, so a Pod whose object has not reached this node yet
                cannot pass a rule its labels would fail. That drop flow has a cookie of its own
                (`unknown_source_request` reads its packet count: a metric and loss records).
 70 FORWARD     ip, nw_dst=<a peer's Pod subnet> -> tun_dst=<the peer's address>, output tunnel
                (one flow per peer, added and removed on its own); in_port=tunnel and no Pod of
                this node (their flows are above) -> drop: never relayed to a third node or out
                of the gateway. The gateway address stays reachable (its flow is above this one).

Routed mode forwards with no flows here: table 70's "outside the Pod subnet -> gateway" (gateway_flows)
already hands the peers' subnets to the node, whose kernel routes them to the peers. With
cluster.deny_unknown_sources, table 25 takes new connections coming in through the gateway from a
peer's Pod subnet only from addresses the Pod directory holds: one drop per routed peer's subnet
(`unknown_peer_flow`, the same cookie as the tunnel's drop) under the same per-address flows, whose
in_port is then the gateway's. Other sources through the gateway (the node, the outside) are not
another node's Pods and pass as before.
"""

from __future__ import annotations

import ipaddress
from typing import AbstractSet as Set
from typing import Any, Callable, Iterable, Mapping

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from packetin import messages
from packetin.protocol_numbers import ETH_TYPE_ARP, ETH_TYPE_IPV4
from policy_agent.ovs import tables

# Table 70: Pods 100 > gateway address 30 > from the tunnel (drop) 25 > the gateway's subnet miss 20
# > peer routes 15 > from the gateway (drop) 10 > outside (gateway) 5. A peer route is above "from the
# gateway", so the node itself (kubelet, a host process) reaches another node's Pods through the tunnel.
FROM_TUNNEL_PRIORITY = 25
PEER_ROUTE_PRIORITY = 15
TUN_DST_FIELD = "tun_ipv4_dst"
TUN_ID_FIELD = "tunnel_id"
POD_VNI = 0  # Pod traffic between nodes; the trace marks are other VNIs (traceflow/report.py)
UNKNOWN_VNI_PRIORITY = 99  # table 0: below Pod traffic from the tunnel (100), above the table's miss


def _cookie(round_: int) -> int:
    return tables.cookie(round_, tables.COOKIE_KIND_TUNNEL)


# The drop of unknown sources: the tunnel's kind with a sub-kind in bits 8..31 (as the generation marker's).
UNKNOWN_SOURCE_KIND = (1 << tables.GENERATION_SHIFT) | tables.COOKIE_KIND_TUNNEL


def _unknown_source_cookie(round_: int) -> int:
    return tables.cookie(round_, UNKNOWN_SOURCE_KIND)


# The drop of IPv4 from the tunnel with a VNI this node does not know: another sub-kind of the tunnel's.
UNKNOWN_VNI_KIND = (2 << tables.GENERATION_SHIFT) | tables.COOKIE_KIND_TUNNEL


def _unknown_vni_cookie(round_: int) -> int:
    return tables.cookie(round_, UNKNOWN_VNI_KIND)


KNOWN_SOURCE_PRIORITY = 50  # table 25: below the Pods' class flows (100, by in_port of a Pod: never the tunnel)
UNKNOWN_SOURCE_PRIORITY = 40


def tunnel_port_flows(round_: int, tunnel_ofport: int, deny_unknown: bool = False) -> list[messages.FlowSpec]:
    """The flows of the tunnel port itself, whatever the peers: Pod traffic is IPv4 with VNI 0, any
    other VNI is dropped and counted. `deny_unknown`: IPv4 from the tunnel opening a connection is
    dropped unless `known_source_flow` admits its source."""
    c, ip = _cookie(round_), {"eth_type": ETH_TYPE_IPV4}
    deny = [messages.FlowSpec.make(tables.T_SRC_CLASS, UNKNOWN_SOURCE_PRIORITY, {**ip, "in_port": tunnel_ofport},
                                   cookie=_unknown_source_cookie(round_))] if deny_unknown else []
    return deny + [
        messages.FlowSpec.make(tables.T_CLASSIFIER, 100, {**ip, "in_port": tunnel_ofport, TUN_ID_FIELD: POD_VNI},
                               goto=tables.T_CONNTRACK, cookie=c),
        messages.FlowSpec.make(tables.T_CLASSIFIER, UNKNOWN_VNI_PRIORITY, {**ip, "in_port": tunnel_ofport},
                               cookie=_unknown_vni_cookie(round_)),
        # Above the Pods' ARP flows (100), which match the target address from any port.
        messages.FlowSpec.make(tables.T_CLASSIFIER, 101, {"eth_type": ETH_TYPE_ARP, "in_port": tunnel_ofport},
                               cookie=c),
        messages.FlowSpec.make(tables.T_FORWARD, FROM_TUNNEL_PRIORITY, {**ip, "in_port": tunnel_ofport}, cookie=c),
    ]


def unknown_source_request(round_: int) -> Any:
    """The statistics of this round's drops of unknown sources (routed: one per peer) and of nothing else
    (OFPMP_FLOW_DESC by their whole cookie): their packets are what the node refused from sources it
    does not know."""
    return parser.OFPFlowDescStatsRequest(messages.CODEC, table_id=tables.T_SRC_CLASS,
                                          cookie=_unknown_source_cookie(round_), cookie_mask=(1 << 64) - 1)


def unknown_vni_request(round_: int) -> Any:
    """The statistics of this round's drop of IPv4 from the tunnel with a VNI that is neither Pod
    traffic's nor a trace mark's (OFPMP_FLOW_DESC by its whole cookie)."""
    return parser.OFPFlowDescStatsRequest(messages.CODEC, table_id=tables.T_CLASSIFIER,
                                          cookie=_unknown_vni_cookie(round_), cookie_mask=(1 << 64) - 1)


def unknown_peer_flow(round_: int, gateway_ofport: int, pod_cidr: str) -> messages.FlowSpec:
    """Routed: new connections through the gateway from the peer subnet `pod_cidr` are dropped unless
    `known_source_flow` (with the gateway's port) admits their source."""
    net = ipaddress.IPv4Network(pod_cidr)
    return messages.FlowSpec.make(tables.T_SRC_CLASS, UNKNOWN_SOURCE_PRIORITY,
                                  {"eth_type": ETH_TYPE_IPV4, "in_port": gateway_ofport,
                                   "ipv4_src": (str(net.network_address), str(net.netmask))},
                                  cookie=_unknown_source_cookie(round_))


def known_source_flow(round_: int, in_port: int, ip: str) -> messages.FlowSpec:
    """For an address the Pod directory holds (another node's Pod): its packets from `in_port` (the
    tunnel; routed, the gateway) are taken."""
    return messages.FlowSpec.make(tables.T_SRC_CLASS, KNOWN_SOURCE_PRIORITY,
                                  {"eth_type": ETH_TYPE_IPV4, "in_port": in_port, "ipv4_src": ip},
                                  goto=tables.T_DST_CLASS, cookie=_cookie(round_))


def admission_change(admitted: Mapping[str, messages.FlowSpec], known: Set[str],
                     make: Callable[[str], messages.FlowSpec]
                     ) -> tuple[list[messages.FlowSpec], list[messages.FlowSpec], dict[str, messages.FlowSpec]]:
    """From the flows `admitted` (address -> its known_source_flow) to one per address of `known`:
    (flows to add, flows to delete, the map after); each flow is made once per address."""
    if known == admitted.keys():
        return [], [], dict(admitted)
    after = {ip: admitted.get(ip) or make(ip) for ip in known}
    return ([after[ip] for ip in sorted(known - admitted.keys())],
            [admitted[ip] for ip in sorted(admitted.keys() - known)], after)


def _remote_ip(ep: Any) -> str | None:
    return ep.ip if ep is not None and ep.ofport == 0 else None


def admission_update(admitted: dict[str, messages.FlowSpec], base: Mapping[Any, Any], after: Mapping[Any, Any],
                     touched: Iterable[Any], make: Callable[[str], messages.FlowSpec]
                     ) -> tuple[list[messages.FlowSpec], list[messages.FlowSpec], dict[str, messages.FlowSpec]]:
    """As `admission_change`, from the endpoints (Pod key -> endpoint; another node's Pod has no port,
    ofport 0) `base`, whose remote addresses `admitted` holds, to `after`, which differs from it only
    in the Pods `touched`: what it costs is what those Pods cost, not every known Pod (`admitted` itself
    comes back when nothing changes; it is never changed)."""
    gone: set[str] = set()
    came: set[str] = set()
    for key in touched:
        old, new = _remote_ip(base.get(key)), _remote_ip(after.get(key))
        if old != new:
            if old is not None:
                gone.add(old)
            if new is not None:
                came.add(new)
    add = sorted(ip for ip in came if ip not in admitted)
    drop = sorted(ip for ip in gone - came if ip in admitted)
    if not add and not drop:
        return [], [], admitted
    out = dict(admitted)
    for ip in drop:
        del out[ip]
    for ip in add:
        out[ip] = make(ip)
    return [out[ip] for ip in add], [admitted[ip] for ip in drop], out


def admission_next(admitted: dict[str, messages.FlowSpec], admitted_of: Mapping[Any, Any] | None,
                   base: Mapping[Any, Any] | None, after: Mapping[Any, Any], touched: Iterable[Any],
                   make: Callable[[str], messages.FlowSpec]
                   ) -> tuple[list[messages.FlowSpec], list[messages.FlowSpec], dict[str, messages.FlowSpec]]:
    """The admission change to the endpoints `after` (the next state's), `admitted` being of the endpoints
    `admitted_of`: from the Pods `touched` alone when `after` was updated from those (`base`), else from
    all of its Pods."""
    if base is not None and base is admitted_of:
        return admission_update(admitted, base, after, touched, make)
    return admission_change(admitted, {ip for ep in after.values() if (ip := _remote_ip(ep)) is not None}, make)


def peer_flows(round_: int, tunnel_ofport: int, pod_cidr: str, address: str) -> list[messages.FlowSpec]:
    """The route to one peer's Pods: its subnet `pod_cidr` into the tunnel, addressed to the peer at `address`."""
    net = ipaddress.IPv4Network(pod_cidr)
    match = {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": (str(net.network_address), str(net.netmask))}
    actions: list[messages.Action] = [messages.SetField(TUN_DST_FIELD, str(ipaddress.IPv4Address(address))),
               messages.Output(tunnel_ofport)]
    return [messages.FlowSpec.make(tables.T_FORWARD, PEER_ROUTE_PRIORITY, match, actions, cookie=_cookie(round_))]


def answer_through_tunnel(answer: bytes, peer_address: str, tunnel_ofport: int) -> Any:
    """A packet-out sending `answer` (a Reject's RST or ICMP) into the tunnel to the node at
    `peer_address`: a tunnel port with remote_ip=flow sends nothing without tun_dst."""
    return parser.OFPPacketOut(messages.CODEC, buffer_id=ofp.OFP_NO_BUFFER,
                               match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                               actions=[parser.OFPActionSetField(**{TUN_DST_FIELD: peer_address}),
                                        parser.OFPActionOutput(tunnel_ofport)], data=answer)
