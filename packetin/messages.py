"""OpenFlow 1.5 messages built with os-ken, as pure functions (no switch attached).

Desired state is described by frozen specs (FlowSpec, and MeterSpec
from meters.ovs) that the channel keeps and replays after a reconnect; the
functions here turn specs into os-ken message objects and serialise them.
Flow mods (flow_add, flow_delete_strict) are FlowMods, written by
packetin.flow_encoder, or by os-ken for a shape the encoder does not cover.
Nothing here does I/O.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from meters.ovs import MeterSpec  # the spec lives with the meters; its encoding lives here
from meters.stats import MeterReading
from packetin.errors import DecodeError
from packetin.flow_encoder import Unsupported, encode_flow_mod
from packetin.flow_spec import (  # noqa: F401  (the specs the builders take; importers name them here too)
    NXAC2PT_METER_ID, Action, Conjunction, Controller, Ct, FlowSpec, GotoTable, Output, Resubmit, SetField)

NXPIF_NXT_PACKET_IN2 = 2
OFPM_ALL = 0xFFFFFFFF


class _Codec:
    """Stands in for an os-ken Datapath: serialisation only needs the modules."""

    ofproto = ofp
    ofproto_parser = parser


CODEC = _Codec()


# --- message builders --------------------------------------------------------------


def serialize(msg: Any, xid: int) -> bytes:
    if type(msg) is FlowMod:
        return msg.encode(xid)
    msg.xid = xid
    msg.serialize()
    return bytes(msg.buf)


def hello() -> Any:
    return parser.OFPHello(CODEC, elements=[parser.OFPHelloElemVersionBitmap([ofp.OFP_VERSION])])


def features_request() -> Any:
    return parser.OFPFeaturesRequest(CODEC)


def echo_request(data: bytes = b"") -> Any:
    return parser.OFPEchoRequest(CODEC, data=data)


def echo_reply(data: bytes) -> Any:
    return parser.OFPEchoReply(CODEC, data=data)


def barrier() -> Any:
    return parser.OFPBarrierRequest(CODEC)


def set_config(miss_send_len: int = 0xFFFF) -> Any:
    # A client of the bridge's .mgmt socket gets no packet-ins until this is
    # sent with a non-zero miss_send_len (DESIGN.md §9).
    return parser.OFPSetConfig(CODEC, ofp.OFPC_FRAG_NORMAL, miss_send_len)


def set_packet_in_format_nxt2() -> Any:
    return parser.NXTSetPacketInFormatMsg(CODEC, NXPIF_NXT_PACKET_IN2)


def meter_features_request() -> Any:
    return parser.OFPMeterFeaturesStatsRequest(CODEC, 0)


def meter_stats_request() -> Any:
    return parser.OFPMeterStatsRequest(CODEC, 0, ofp.OFPM_ALL)


def flow_desc_request(table_id: int) -> Any:
    """Every flow of one table (OFPMP_FLOW_DESC, OpenFlow 1.5's flow stats)."""
    return parser.OFPFlowDescStatsRequest(CODEC, table_id=table_id)


def parse_flow_cookies(parts: Iterable[bytes]) -> list[tuple[int, int, int]]:
    """(table, priority, cookie) of every flow in the OFPMP_FLOW_DESC reply `parts`."""
    flows = []
    for raw in parts:
        if len(raw) < 16 or int.from_bytes(raw[2:4], "big") != len(raw):
            raise DecodeError(f"flow stats reply of {len(raw)} bytes: not one whole message")
        try:
            flows += [(f.table_id, f.priority, f.cookie) for f in parse(raw).body]
        except (AttributeError, TypeError, ValueError, struct.error) as exc:
            raise DecodeError(f"flow stats reply of {len(raw)} bytes: {exc}") from exc
    return flows


def parse_meter_stats(parts: Iterable[bytes]) -> list[MeterReading]:
    """Every meter of the OFPMP_METER reply `parts` (os-ken's 1.5 parser reads OVS's layout here)."""
    readings = []
    for raw in parts:
        if len(raw) < 16 or int.from_bytes(raw[2:4], "big") != len(raw):
            raise DecodeError(f"meter stats reply of {len(raw)} bytes: not one whole message")
        try:
            stats = parse(raw).body
            readings += [MeterReading(m.meter_id, sum(b.packet_band_count for b in m.band_stats),
                                      sum(b.byte_band_count for b in m.band_stats),
                                      m.duration_sec + m.duration_nsec / 1e9) for m in stats]
        except (AttributeError, TypeError, ValueError, struct.error) as exc:
            raise DecodeError(f"meter stats reply of {len(raw)} bytes: {exc}") from exc
    return readings


def _instructions(actions: Iterable[Action], goto: GotoTable | None) -> list[Any]:
    out: list[Any] = []
    acts = [a.to_ofp() for a in actions]
    if acts:
        out.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, acts))
    if goto is not None:
        out.append(parser.OFPInstructionGotoTable(goto.table))
    return out


def _flow_mod(spec: FlowSpec, command: int, **extra: Any) -> Any:
    return parser.OFPFlowMod(CODEC, table_id=spec.table, command=command, priority=spec.priority,
                             buffer_id=ofp.OFP_NO_BUFFER, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                             match=parser.OFPMatch(**dict(spec.match)), **extra)


class FlowMod:
    """An OFPT_FLOW_MOD (ADD or DELETE_STRICT) of `spec`, encoded when serialised.

    packetin.flow_encoder writes the bytes (os-ken's, without its object tree);
    a spec it does not cover goes through os-ken's OFPFlowMod (to_ofp). It has
    what serialize() and os-ken's wrappers (OFPBundleAddMsg) use of a message:
    xid, set_xid, serialize and buf.
    """

    __slots__ = ("spec", "command", "xid", "buf")
    version = ofp.OFP_VERSION
    msg_type = cls_msg_type = ofp.OFPT_FLOW_MOD

    def __init__(self, spec: FlowSpec, command: int) -> None:
        self.spec = spec
        self.command = command
        self.xid: int | None = None
        self.buf: bytearray | None = None

    @property
    def msg_len(self) -> int | None:
        return None if self.buf is None else len(self.buf)

    def set_xid(self, xid: int) -> None:
        self.xid = xid

    def to_ofp(self) -> Any:
        """The same message as an os-ken OFPFlowMod."""
        if self.command == ofp.OFPFC_ADD:
            return _flow_mod(self.spec, self.command, cookie=self.spec.cookie,
                             instructions=_instructions(self.spec.actions, self.spec.goto))
        return _flow_mod(self.spec, self.command)

    def encode(self, xid: int) -> bytes:
        """The message's bytes with `xid`."""
        self.xid = xid
        try:
            return encode_flow_mod(self.spec, self.command, xid)
        except Unsupported:
            return serialize(self.to_ofp(), xid)

    def serialize(self) -> None:
        self.buf = bytearray(self.encode(self.xid or 0))

    def __repr__(self) -> str:
        return f"FlowMod(command={self.command}, {self.spec.describe()})"


def flow_add(spec: FlowSpec) -> FlowMod:
    return FlowMod(spec, ofp.OFPFC_ADD)


def flow_delete_strict(spec: FlowSpec) -> FlowMod:
    return FlowMod(spec, ofp.OFPFC_DELETE_STRICT)


def flow_delete_cookie(cookie: int, mask: int) -> Any:
    """Delete, in every table, the flows whose cookie matches `cookie` under `mask`."""
    return parser.OFPFlowMod(CODEC, cookie=cookie, cookie_mask=mask, table_id=ofp.OFPTT_ALL,
                             command=ofp.OFPFC_DELETE, buffer_id=ofp.OFP_NO_BUFFER,
                             out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch())


def meter_mod(spec: MeterSpec, command: int) -> Any:
    flags = ofp.OFPMF_PKTPS | (ofp.OFPMF_BURST if spec.burst else 0) | (ofp.OFPMF_STATS if spec.stats else 0)
    bands = [parser.OFPMeterBandDrop(rate=spec.rate_pps, burst_size=spec.burst)]
    return parser.OFPMeterMod(CODEC, command=command, flags=flags, meter_id=spec.meter_id, bands=bands)


def meter_delete(meter_id: int) -> Any:
    return parser.OFPMeterMod(CODEC, command=ofp.OFPMC_DELETE, flags=0, meter_id=meter_id, bands=[])


def packet_out(data: bytes, out_port: int) -> Any:
    """Send `data` out of `out_port`, from the controller (bypasses the pipeline)."""
    return parser.OFPPacketOut(CODEC, buffer_id=ofp.OFP_NO_BUFFER,
                               match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                               actions=[parser.OFPActionOutput(out_port)], data=data)


def packet_out_to_pipeline(data: bytes, in_port: int) -> Any:
    """Inject `data` as if it had arrived on `in_port`: it meets the flow tables from table 0."""
    return parser.OFPPacketOut(CODEC, buffer_id=ofp.OFP_NO_BUFFER, match=parser.OFPMatch(in_port=in_port),
                               actions=[parser.OFPActionOutput(ofp.OFPP_TABLE)], data=data)


_MULTIPART_HEADER = struct.Struct("!HH4x")  # type, flags, pad (after the OpenFlow header)
_METER_FEATURES = struct.Struct("!IIIBB")  # max_meter, band_types, capabilities, max_bands, max_color


def multipart_more(raw: bytes) -> bool:
    """True when a multipart reply says more parts follow (OFPMPF_REPLY_MORE)."""
    _, flags = _MULTIPART_HEADER.unpack_from(raw, 8)
    return bool(flags & ofp.OFPMPF_REPLY_MORE)


def parse_meter_features(raw: bytes) -> tuple[int, int, int]:
    """(max_meter, band_types, max_bands) from an OFPMP_METER_FEATURES reply.

    OVS answers with the OpenFlow 1.3 body layout (16 bytes) even on 1.5,
    which os-ken's 1.5 parser rejects; the first fields agree in both layouts.
    """
    if len(raw) < 16 + _METER_FEATURES.size:
        raise ValueError(f"meter features reply too short ({len(raw)} bytes)")
    max_meter, band_types, _caps, max_bands, _color = _METER_FEATURES.unpack_from(raw, 16)
    return max_meter, band_types, max_bands


def parse(raw: bytes) -> Any:
    """Parse any message with os-ken (slow path: everything but packet-ins)."""
    from os_ken.ofproto import ofproto_parser

    version, msg_type, msg_len, xid = struct.unpack_from("!BBHI", raw, 0)
    return ofproto_parser.msg(CODEC, version, msg_type, msg_len, xid, bytearray(raw))
