"""Packets each logged rule's flows matched in OVS: one OFPMP_FLOW_DESC request over the policy flows, per window.

A flow belongs to the logged rule its controller action's userdata names (category
policy, flag LOG; DESIGN.md §3), so the count needs no knowledge of the compiler's
layout (conjunctions, tiers, isolation). Pure apart from the one request the
caller sends; nothing here runs per packet-in.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, Iterator, NamedTuple

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from packetin import messages
from packetin.errors import DecodeError
from packetin.model import Category, Flags, Userdata
from policy_agent.ovs.tables import COOKIE_KIND_POLICY, COOKIE_ROUND_SHIFT

_KIND_MASK = (1 << COOKIE_ROUND_SHIFT) - 1  # any round's policy flows: a restart's old ones are counted too
_LOG = int(Flags.LOG)


class FlowCount(NamedTuple):
    """One flow's packet count, keyed by what identifies the flow in OVS (a re-added flow restarts at 0)."""

    key: tuple[Any, ...]
    rule_id: int
    packets: int


def policy_flows_request() -> Any:
    """Every policy flow of every table, with its statistics (OpenFlow 1.5 flow descriptions)."""
    return parser.OFPFlowDescStatsRequest(messages.CODEC, table_id=ofp.OFPTT_ALL,
                                          cookie=COOKIE_KIND_POLICY, cookie_mask=_KIND_MASK)


_U16 = struct.Struct("!H")
_HEAD = struct.Struct("!HH")  # type, length: of instructions, actions, properties, match, stats
_NX_VENDOR, _NXAST_CONTROLLER2, _NXAC2PT_USERDATA = 0x2320, 37, 3
_OXS_PACKET_COUNT = (0x8002, 4)  # OXS class OFPXSC_OPENFLOW_BASIC, field packet_count
_APPLY_OR_WRITE = (ofp.OFPIT_WRITE_ACTIONS, ofp.OFPIT_APPLY_ACTIONS)


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _userdatas(raw: bytes, start: int, end: int) -> Iterator[bytes]:
    """The userdata of every NXAST_CONTROLLER2 among the actions in raw[start:end]."""
    while start + 4 <= end:
        kind, length = _HEAD.unpack_from(raw, start)
        if length < 8:
            raise DecodeError(f"action of length {length}")
        if kind == ofp.OFPAT_EXPERIMENTER and length >= 16 and int.from_bytes(raw[start + 4:start + 8], "big") == \
                _NX_VENDOR and _U16.unpack_from(raw, start + 8)[0] == _NXAST_CONTROLLER2:
            prop, stop = start + 16, start + length
            while prop + 4 <= stop:
                ptype, plen = _HEAD.unpack_from(raw, prop)
                if plen < 4:
                    raise DecodeError(f"controller2 property of length {plen}")
                if ptype == _NXAC2PT_USERDATA:
                    yield raw[prop + 4:prop + plen]
                prop += _pad8(plen)
        start += length


def _logged_rule(raw: bytes, start: int, end: int) -> int | None:
    """The rule id of the flow's copy to the agent (instructions in raw[start:end]), when the rule logs."""
    while start + 4 <= end:
        kind, length = _HEAD.unpack_from(raw, start)
        if length < 8:
            raise DecodeError(f"instruction of length {length}")
        if kind in _APPLY_OR_WRITE:
            for data in _userdatas(raw, start + 8, start + length):
                ud = Userdata.decode(data)
                if ud is not None and ud.category == Category.POLICY and ud.flags & _LOG:
                    return ud.rule_id
        start += length
    return None


def _packet_count(raw: bytes, start: int, end: int) -> int:
    """packet_count among the OXS fields in raw[start:end]."""
    while start + 4 <= end:
        oxs_class, field, length = struct.unpack_from("!HBB", raw, start)
        if (oxs_class, field >> 1) == _OXS_PACKET_COUNT and length == 8:
            return int.from_bytes(raw[start + 4:start + 12], "big")
        start += 4 + length
    return 0


def _flow_descs(parts: Iterable[bytes]) -> Iterator[tuple[tuple[Any, ...], bytes, int, int, int]]:
    """Per flow of the OFPMP_FLOW_DESC reply `parts`: (its key, the reply, where its instructions start
    and end, its packet count). Read with struct: os-ken's parser fails on OVS's controller2 meter_id
    property."""
    for raw in parts:
        if len(raw) < 16 or int.from_bytes(raw[2:4], "big") != len(raw):
            raise DecodeError(f"flow stats reply of {len(raw)} bytes: not one whole message")
        try:
            off = 16  # OpenFlow header, multipart type, flags, pad
            while off + 24 <= len(raw):
                length = _U16.unpack_from(raw, off)[0]
                if length < 32 or off + length > len(raw):
                    raise DecodeError(f"flow description of length {length} at {off}")
                table_id, priority = raw[off + 4], _U16.unpack_from(raw, off + 6)[0]
                # Without its round: a restart's flow ADDed again in the new round replaces the old one in OVS
                # with its counts (or from 0, seen as a reset), so it is the same flow to the totals.
                cookie = int.from_bytes(raw[off + 16:off + 24], "big") & _KIND_MASK
                match_len = _HEAD.unpack_from(raw, off + 24)[1]
                stats = off + 24 + _pad8(match_len)
                stats_len = _HEAD.unpack_from(raw, stats)[1]
                key = (table_id, priority, cookie, raw[off + 24:off + 24 + match_len])
                yield key, raw, stats + _pad8(stats_len), off + length, _packet_count(raw, stats + 4,
                                                                                   stats + stats_len)
                off += length
        except struct.error as exc:
            raise DecodeError(f"flow stats reply of {len(raw)} bytes: {exc}") from exc


def parse_logged_flows(parts: Iterable[bytes]) -> list[FlowCount]:
    """The packet counts of the flows that copy to the agent for a logged rule, from the OFPMP_FLOW_DESC
    reply `parts`."""
    flows = []
    for key, raw, start, end, packets in _flow_descs(parts):
        rule_id = _logged_rule(raw, start, end)
        if rule_id is not None:
            flows.append(FlowCount(key, rule_id, packets))
    return flows


def parse_flow_packets(parts: Iterable[bytes], counter: int = 0) -> list[FlowCount]:
    """The packet count of every flow of the OFPMP_FLOW_DESC reply `parts`, each under `counter` (for a
    request that asks for the flows of one purpose, e.g. by their cookie)."""
    return [FlowCount(key, counter, packets) for key, _raw, _start, _end, packets in _flow_descs(parts)]


class RuleFlowTotals:
    """Packets each logged rule's flows matched since the agent first looked, across flows deleted and re-added.

    The first reading is the baseline (what its flows counted before is not this run's to
    state) unless `baseline` is False (flows this run made, e.g. asked for by this round's cookie:
    all they counted is this run's); a flow that appears later counts from 0, as OVS made it; a
    flow's count that went down means OVS made it again (a vswitchd restart): it counts on from 0.
    A flow gone from a reading keeps what it counted.
    """

    def __init__(self, baseline: bool = True) -> None:
        self._raw: dict[tuple[Any, ...], int] = {}
        self.totals: dict[int, int] = {}
        self.read = False
        self._baseline = baseline

    def update(self, flows: Iterable[FlowCount]) -> None:
        first = not self.read and self._baseline
        raw, totals = self._raw, self.totals
        for flow in flows:
            before = raw.get(flow.key)
            if before is None:
                grew = 0 if first else flow.packets
            else:
                grew = flow.packets - before if flow.packets >= before else flow.packets
            if grew or flow.rule_id not in totals:
                totals[flow.rule_id] = totals.get(flow.rule_id, 0) + grew
            raw[flow.key] = flow.packets
        self.read = True

