"""The OVS pipeline on br-int: table numbers, cookies, and the fixed flows (meter ids: meters.ovs).

 0 CLASSIFIER   known Pod port -> 10 (per Pod, installed last by the CNI path);
                ARP by target IP -> that Pod's port; anything else dropped
10 CONNTRACK    ip -> ct(zone, table=20)
20 CT_STATE     +trk+inv drop; +trk+est / +trk+rel -> 70; +trk+new -> 25
25 SRC_CLASS    in_port of a Pod -> its class into reg4 (per Pod, with its policy); -> 26
26 DST_CLASS    ip,nw_dst=Pod IP -> its class into reg5 (per Pod, with its policy); -> 30
30/31/32        egress: Antrea tiers / K8s NetworkPolicy / baseline tier
40/41/42        ingress: Antrea tiers / K8s NetworkPolicy / baseline tier
60 COMMIT       ct(commit, zone) -> 70: only new connections that passed both directions
70 FORWARD      ip,nw_dst=Pod IP -> eth_dst, output Pod port; else drop
200 GENERATION  one marker flow, reached by no packet (no flow goes to it): its cookie says which
                generation of the applied store the policy flows realise; it changes in the same
                atomic bundle as they do (policy_agent/sources/apply_intent.py reads it at start)

With a node gateway (node_network.pod_cidr; policy/gateway_flows.py): table 0 takes any IPv4 from
the gateway port and answers ARP for the gateway address through it; table 40 sends new
connections from the gateway address (the node itself) past ingress policy; table 70 sends
the gateway address and everything outside the Pod subnet to the gateway port.

Between nodes (cluster.node_address; policy/tunnel_flows.py): with Geneve, table 0 takes IPv4
with VNI 0 from the tunnel port (-> 10, then ingress policy: egress policy applies to this node's
Pods by their in_port only, so it was judged on the sending node) and drops, counted, any other
VNI that is no trace mark; table 70 sends each other node's Pod
subnet into the tunnel with that node's address as tun_dst and never relays tunnel traffic to
anything but a Pod of this node (or its gateway address); with cluster.deny_unknown_sources,
table 25 takes new connections from the tunnel only from addresses the Pod directory holds.
Table 0 also hands another node's trace packet and trace report (Geneve VNI marks,
traceflow/report.py) from the tunnel to the agent and nowhere else (traceflow/flows.py).
Routed: no forwarding flows of its own (table 70's "outside the subnet -> gateway" carries the
peers' subnets; the kernel routes them); with cluster.deny_unknown_sources, table 25 drops new
connections through the gateway from a peer's Pod subnet unless the Pod directory holds the source.

Only new connections reach the policy tables, so Allow is logged once per
connection while Drop is logged per packet (DESIGN.md §3), and a connection
established before a policy change outlives it (as in Antrea); every new one,
including a closed connection's reused 5-tuple, meets the new policy (the engine
purges OVS's megaflows after each change: policy_agent/ovs/megaflows.py).
"""

from __future__ import annotations

import ipaddress

from packetin import messages
from packetin.protocol_numbers import ETH_TYPE_ARP, ETH_TYPE_IPV4

T_CLASSIFIER = 0
T_CONNTRACK = 10
T_CT_STATE = 20
T_SRC_CLASS = 25
T_DST_CLASS = 26
T_EGRESS = 30
T_EGRESS_K8S = 31
T_EGRESS_BASELINE = 32
T_INGRESS = 40
T_INGRESS_K8S = 41
T_INGRESS_BASELINE = 42
T_COMMIT = 60
T_FORWARD = 70
T_GENERATION = 200

CT_ZONE = 0xF00  # the agent's conntrack zone

# Cookie: agent round (upper 32 bits) | table-independent kind (lower bits).
# Flows of a previous agent run are deleted by their round after a restart.
COOKIE_ROUND_SHIFT = 32
COOKIE_KIND_FIXED = 1
COOKIE_KIND_POD = 2
COOKIE_KIND_POLICY = 3
COOKIE_KIND_TRACEFLOW = 4  # a running trace's flows (policy_agent/traceflow/flows.py)
COOKIE_KIND_GATEWAY = 5  # the node gateway's flows (policy_agent/policy/gateway_flows.py)
COOKIE_KIND_GENERATION = 6  # the generation marker; its generation sits in bits 8..31
COOKIE_KIND_TUNNEL = 7  # traffic between nodes: the tunnel port and each peer's route (policy/tunnel_flows.py)
ROUND_MASK = 0xFFFFFFFF << COOKIE_ROUND_SHIFT
GENERATION_SHIFT = 8
GENERATION_MASK = 0xFFFFFF  # the marker keeps a generation modulo 2**24: compared only for equality

# ct_state bits (OVS): new 0x01, est 0x02, rel 0x04, rpl 0x08, inv 0x10, trk 0x20.
CS_NEW, CS_EST, CS_REL, CS_INV, CS_TRK = 0x01, 0x02, 0x04, 0x10, 0x20

_NEXT = {T_EGRESS: T_EGRESS_K8S, T_EGRESS_K8S: T_EGRESS_BASELINE, T_EGRESS_BASELINE: T_INGRESS,
         T_INGRESS: T_INGRESS_K8S, T_INGRESS_K8S: T_INGRESS_BASELINE, T_INGRESS_BASELINE: T_COMMIT}


def cookie(round_: int, kind: int) -> int:
    return (round_ << COOKIE_ROUND_SHIFT) | kind


def next_table(table: int) -> int:
    """Where a packet goes when `table` has no opinion."""
    return _NEXT[table]


def fixed_flows(round_: int) -> list[messages.FlowSpec]:
    """Flows that do not depend on Pods or policy."""
    c = cookie(round_, COOKIE_KIND_FIXED)
    ip = {"eth_type": ETH_TYPE_IPV4}

    def flow(table: int, prio: int, match: dict, actions: list | None = None, goto: int | None = None
             ) -> messages.FlowSpec:
        return messages.FlowSpec.make(table, prio, match, actions or [], goto=goto, cookie=c)

    flows = [
        flow(T_CLASSIFIER, 0, {}),  # unknown ports and protocols: drop
        flow(T_CONNTRACK, 0, {}),
        flow(T_CONNTRACK, 100, ip, [messages.Ct(table=T_CT_STATE, zone=CT_ZONE)]),
        flow(T_CT_STATE, 0, {}),
        flow(T_CT_STATE, 200, {**ip, "ct_state": (CS_TRK | CS_INV, CS_TRK | CS_INV)}),
        flow(T_CT_STATE, 190, {**ip, "ct_state": (CS_TRK | CS_EST, CS_TRK | CS_EST)}, goto=T_FORWARD),
        flow(T_CT_STATE, 190, {**ip, "ct_state": (CS_TRK | CS_REL, CS_TRK | CS_REL)}, goto=T_FORWARD),
        flow(T_CT_STATE, 180, {**ip, "ct_state": (CS_TRK | CS_NEW, CS_TRK | CS_NEW)}, goto=T_SRC_CLASS),
        flow(T_SRC_CLASS, 0, {}, goto=T_DST_CLASS),  # not a Pod's port / address: class 0
        flow(T_DST_CLASS, 0, {}, goto=T_EGRESS),
        flow(T_COMMIT, 0, {**ip}, [messages.Ct(commit=True, zone=CT_ZONE)], goto=T_FORWARD),
        flow(T_FORWARD, 0, {}),
    ]
    # Policy tables: no opinion -> the next layer.
    for table in (T_EGRESS, T_EGRESS_K8S, T_EGRESS_BASELINE, T_INGRESS, T_INGRESS_K8S, T_INGRESS_BASELINE):
        flows.append(flow(table, 0, {}, goto=next_table(table)))
    return flows


def generation_marker(round_: int, generation: int) -> messages.FlowSpec:
    """The flow telling which applied-store generation the switch's policy flows realise. Its match
    never changes (an ADD replaces it, cookie included), so the generation rides in the cookie,
    below the round: the start-up cleanup of a previous round's flows sees it like any other."""
    c = cookie(round_, ((generation & GENERATION_MASK) << GENERATION_SHIFT) | COOKIE_KIND_GENERATION)
    return messages.FlowSpec.make(T_GENERATION, 0, {}, cookie=c)


def marker_generation(flow_cookie: int) -> int | None:
    """The generation a marker flow's cookie carries (modulo 2**24); None if it is no marker's cookie."""
    low = flow_cookie & ~ROUND_MASK
    if low & ((1 << GENERATION_SHIFT) - 1) != COOKIE_KIND_GENERATION:
        return None
    return (low >> GENERATION_SHIFT) & GENERATION_MASK


def pod_flows(round_: int, *, ip: str, mac: str, ofport: int) -> list[messages.FlowSpec]:
    """A Pod's forwarding and classification: installed only after its policy flows."""
    c = cookie(round_, COOKIE_KIND_POD)
    return [
        messages.FlowSpec.make(T_FORWARD, 100, {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": ip},
                        [messages.SetField("eth_dst", mac), messages.Output(ofport)], cookie=c),
        messages.FlowSpec.make(T_CLASSIFIER, 100, {"eth_type": ETH_TYPE_ARP, "arp_tpa": ip}, [messages.Output(ofport)],
                        cookie=c),
        # Only the Pod's own source address is accepted from its port (no spoofing past policy).
        messages.FlowSpec.make(T_CLASSIFIER, 100, {"in_port": ofport, "eth_type": ETH_TYPE_IPV4, "ipv4_src": ip},
                        goto=T_CONNTRACK, cookie=c),
    ]


def mac_for_ip(ip: str) -> str:
    """The MAC of an interface the agent addresses (a Pod's, the gateway's): 02:00 + the IPv4 bytes,
    locally administered, unique while the addresses are, readable in dumps."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ipaddress.IPv4Address(ip).packed)
