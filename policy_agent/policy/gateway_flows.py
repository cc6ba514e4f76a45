"""The node gateway's flows, as a pure function of its plan (installed once per agent round).

  0 CLASSIFIER  in_port=gateway, ip -> 10 (the node and what it routes: any source address);
                arp, arp_tpa=gateway address -> output gateway (the Pods' ARP for their router)
 40 INGRESS     in_port=gateway, ip, nw_src=gateway address -> 60: the node itself (kubelet
                probes) reaches its Pods whatever ingress policy says, as in Antrea. Above every
                rule's priority (policy.priorities.TOP), below traceflow's.
 70 FORWARD     nw_dst=gateway address -> output gateway; nw_dst in the Pod subnet and no Pod
                (the Pods' flows are above) -> drop; from the gateway -> drop (never back out);
                any other address -> output gateway (the node routes it, masqueraded).

Egress policy applies as to any destination: an ipBlock matches an outside address, and
the judged packet is dropped, rejected or forwarded before table 70 sends it out. Traffic
entering through the gateway from any other address (routed from outside) meets ingress
policy like traffic from a Pod.
"""

from __future__ import annotations

import ipaddress

from packetin import messages
from packetin.protocol_numbers import ETH_TYPE_ARP, ETH_TYPE_IPV4
from policy_agent.ovs import tables
from policy_agent.ovs.gateway import GatewayPlan
from policy_agent.policy.priorities import TOP

NODE_BYPASS_PRIORITY = TOP + 2000  # above every rule, below traceflow.flows.TRACE_PRIORITY
_TO_GATEWAY, _SUBNET_MISS, _FROM_GATEWAY, _OUTSIDE = 30, 20, 10, 5


def gateway_flows(round_: int, gw: GatewayPlan) -> list[messages.FlowSpec]:
    """Every flow the gateway `gw` needs on top of tables.fixed_flows."""
    c = tables.cookie(round_, tables.COOKIE_KIND_GATEWAY)
    ip = {"eth_type": ETH_TYPE_IPV4}
    net = ipaddress.IPv4Network(gw.subnet)
    to_gateway = [messages.SetField("eth_dst", gw.mac), messages.Output(gw.ofport)]

    def flow(table: int, prio: int, match: dict, actions: list | None = None, goto: int | None = None
             ) -> messages.FlowSpec:
        return messages.FlowSpec.make(table, prio, match, actions or [], goto=goto, cookie=c)

    return [
        flow(tables.T_CLASSIFIER, 100, {**ip, "in_port": gw.ofport}, goto=tables.T_CONNTRACK),
        flow(tables.T_CLASSIFIER, 100, {"eth_type": ETH_TYPE_ARP, "arp_tpa": gw.ip}, [messages.Output(gw.ofport)]),
        flow(tables.T_INGRESS, NODE_BYPASS_PRIORITY, {**ip, "in_port": gw.ofport, "ipv4_src": gw.ip},
             goto=tables.T_COMMIT),
        flow(tables.T_FORWARD, _TO_GATEWAY, {**ip, "ipv4_dst": gw.ip}, to_gateway),
        flow(tables.T_FORWARD, _SUBNET_MISS, {**ip, "ipv4_dst": (str(net.network_address), str(net.netmask))}),
        flow(tables.T_FORWARD, _FROM_GATEWAY, {**ip, "in_port": gw.ofport}),
        flow(tables.T_FORWARD, _OUTSIDE, ip, to_gateway),
    ]
