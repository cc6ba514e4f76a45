"""The flows of one running trace, as a pure function of its tag (installed at its start, removed at its end).

Each observation point gets a flow at TRACE_PRIORITY (above every policy and fixed flow) that
matches the trace's packet exactly and the point's "seen" bit (reg3) clear:

  controller(reason=action, category TRACEFLOW, phase ARRIVAL), set the seen bit,
  reg6 := 0, reg7 := 0, resubmit(,same table)

so the copy at a point carries the decision (reg6 rule id, reg7 disposition) of the point the
packet met before it, or reg6 = 0 when no rule of that table matched. Table 20 (the first point)
adds controller(phase AFTER) behind its resubmit: OVS runs it once the whole nested pipeline
has returned, so it carries the last table's decision (the rule that dropped the packet) and
marks the end of the trace. Verified on OVS 3.1 (netdev): copies arrive in pipeline order, the
AFTER copy last.

Table 10 sets the trace bit before ct(table=20): a traced packet recirculates with metadata no
real packet has, so it never meets a datapath flow cached for real traffic. Table 60 goes to 70
without ct(commit): a trace never creates conntrack state. Table 70 copies and stops: a trace
packet is never delivered. To a Pod of another node (Geneve), table 70 copies and sends the packet
into the tunnel to that node with tun_id = TRACE_VNI (report.py); `tunnel_flows` are the fixed flows
of table 0 that take such a packet (and a node's report coming back) to the agent, never further.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from meters.ovs import METER_TRACEFLOW
from packetin import messages
from packetin.model import Category, Userdata
from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_ICMP, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP
from packetin.registers import (
    REG_DISPOSITION_FIELD, REG_RULE_ID_FIELD, REG_TRACEFLOW_FIELD, TRACEFLOW_ACTIVE_BIT, TRACEFLOW_SEEN_SHIFT,
)
from policy_agent.ovs import tables
from policy_agent.traceflow.report import REPORT_VNI, TRACE_VNI
from policy_agent.traceflow.tags import TraceTag

TRACE_PRIORITY = 65000  # above every rule (policy.priorities.TOP) and fixed flow
TUNNEL_MARK_PRIORITY = 110  # table 0: above the tunnel port's flows (policy/tunnel_flows.py)
TUN_DST_FIELD, TUN_ID_FIELD = "tun_ipv4_dst", "tunnel_id"
# Observation points that resubmit to their own table, in pipeline order (index = seen bit).
RESUBMIT_POINTS = (tables.T_CT_STATE, tables.T_EGRESS, tables.T_EGRESS_K8S, tables.T_EGRESS_BASELINE,
                   tables.T_INGRESS, tables.T_INGRESS_K8S, tables.T_INGRESS_BASELINE)
_PORT_FIELDS = {IPPROTO_TCP: ("tcp_src", "tcp_dst"), IPPROTO_UDP: ("udp_src", "udp_dst"),
                IPPROTO_SCTP: ("sctp_src", "sctp_dst")}
ICMP_ECHO_REQUEST = 8
# Copies one trace can cause: an arrival at each resubmit point and at table 70, and the AFTER copy.
MAX_COPIES = len(RESUBMIT_POINTS) + 2


class Phase(enum.IntEnum):
    ARRIVAL = 0  # the packet reached the table (carries the previous point's decision)
    AFTER = 1  # the pipeline returned (carries the last decision; the trace is over)
    FROM_TUNNEL = 2  # another node's trace packet arrived from the tunnel (this node traces it)
    REPORT = 3  # another node's report of its part of one of this node's traces


_MARK = struct.Struct("!BBH")  # tag, phase, reserved: userdata bytes 3..6 of a traceflow copy


@dataclass(frozen=True)
class TraceMark:
    """What a traceflow copy's userdata says: which trace (its tag) and which phase."""

    tag: int
    phase: Phase

    def userdata(self) -> bytes:
        rule_slot = int.from_bytes(_MARK.pack(self.tag, self.phase, 0), "big")
        return Userdata(category=Category.TRACEFLOW, rule_id=rule_slot).encode()

    @classmethod
    def decode(cls, userdata: bytes) -> "TraceMark | None":
        ud = Userdata.decode(userdata)
        if ud is None or ud.category != Category.TRACEFLOW:
            return None
        tag, phase, _ = _MARK.unpack(ud.rule_id.to_bytes(4, "big"))
        if phase not in Phase._value2member_map_:
            return None
        return cls(tag, Phase(phase))


def packet_match(tag: TraceTag, live: bool = False) -> dict[str, object]:
    """The trace packet exactly: tag, addresses, protocol, ports (ICMP: echo request). Live: the
    filter on real packets (no tag; the source port only when given)."""
    match: dict[str, object] = {"eth_type": ETH_TYPE_IPV4, "ipv4_src": tag.src, "ipv4_dst": tag.dst,
                                "ip_proto": tag.proto}
    if not live:
        match["ip_dscp"] = tag.dscp
    fields = _PORT_FIELDS.get(tag.proto)
    if fields is not None:
        if tag.sport is not None:
            match[fields[0]] = tag.sport
        if tag.dport is not None:
            match[fields[1]] = tag.dport
    elif tag.proto == IPPROTO_ICMP:
        match["icmpv4_type"] = ICMP_ECHO_REQUEST
    return match


def _seen(point: int) -> int:
    return 1 << (TRACEFLOW_SEEN_SHIFT + point)


def trace_flows(round_: int, tag: TraceTag, *, meters: bool = True, live: bool = False,
                tunnel: tuple[int, str] | None = None) -> list[messages.FlowSpec]:
    """Every flow of the trace marked by `tag` (install before the packet-out, delete after).
    `tunnel` (tunnel port, node address): the destination is a Pod of that node; table 70 sends the
    packet there, marked, after its copy.

    Live (`npaudit trace --live`): the next real packet matching the filter is observed and still
    forwarded as ever: table 60 commits it and copies it (the last decision rides along), and
    table 70 has no trace flow."""
    cookie = tables.cookie(round_, tables.COOKIE_KIND_TRACEFLOW)
    match = packet_match(tag, live)
    meter = METER_TRACEFLOW if meters else None

    def copy(phase: Phase) -> messages.Controller:
        return messages.Controller(reason=1, userdata=TraceMark(tag.dscp, phase).userdata(), meter_id=meter)

    def flow(table: int, actions: list[messages.Action], extra: dict[str, object] | None = None,
             goto: int | None = None) -> messages.FlowSpec:
        return messages.FlowSpec.make(table, TRACE_PRIORITY, {**match, **(extra or {})}, actions, goto=goto,
                                      cookie=cookie)

    flows = [flow(tables.T_CONNTRACK, [
        messages.SetField(REG_TRACEFLOW_FIELD, (TRACEFLOW_ACTIVE_BIT, TRACEFLOW_ACTIVE_BIT)),
        messages.Ct(table=tables.T_CT_STATE, zone=tables.CT_ZONE)])]
    for point, table in enumerate(RESUBMIT_POINTS):
        bit = _seen(point)
        actions: list[messages.Action] = [
            copy(Phase.ARRIVAL), messages.SetField(REG_TRACEFLOW_FIELD, (bit, bit)),
            messages.SetField(REG_RULE_ID_FIELD, 0), messages.SetField(REG_DISPOSITION_FIELD, 0),
            messages.Resubmit(table)]
        if table == tables.T_CT_STATE:
            actions.append(copy(Phase.AFTER))
        flows.append(flow(table, actions, {REG_TRACEFLOW_FIELD: (0, bit)}))
    if live:
        flows.append(flow(tables.T_COMMIT, [messages.Ct(commit=True, zone=tables.CT_ZONE), copy(Phase.ARRIVAL)],
                          goto=tables.T_FORWARD))
        return flows
    flows.append(flow(tables.T_COMMIT, [], goto=tables.T_FORWARD))
    onward: list[messages.Action] = [] if tunnel is None else [
        messages.SetField(TUN_DST_FIELD, tunnel[1]), messages.SetField(TUN_ID_FIELD, TRACE_VNI),
        messages.Output(tunnel[0])]
    flows.append(flow(tables.T_FORWARD, [copy(Phase.ARRIVAL), *onward]))
    return flows


def tunnel_flows(round_: int, tunnel_ofport: int, *, meters: bool = True) -> list[messages.FlowSpec]:
    """Table 0 of a Geneve node: another node's trace packet (TRACE_VNI) and a report (REPORT_VNI) from
    the tunnel go to the agent and nowhere else; above the tunnel port's own flows (100, 101)."""
    cookie = tables.cookie(round_, tables.COOKIE_KIND_TUNNEL)
    meter = METER_TRACEFLOW if meters else None
    return [messages.FlowSpec.make(
        tables.T_CLASSIFIER, TUNNEL_MARK_PRIORITY,
        {"in_port": tunnel_ofport, "eth_type": ETH_TYPE_IPV4, TUN_ID_FIELD: vni},
        [messages.Controller(reason=1, userdata=TraceMark(0, phase).userdata(), meter_id=meter)], cookie=cookie)
        for vni, phase in ((TRACE_VNI, Phase.FROM_TUNNEL), (REPORT_VNI, Phase.REPORT))]
