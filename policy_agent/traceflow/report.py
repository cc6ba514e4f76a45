"""Traceflow between nodes, on the wire (pure): the Geneve VNIs that mark a trace packet and a report, the
destination node's report frame, and the re-tagging of a received trace packet.

A trace to a Pod of another node leaves the source node's table 70 into the Geneve tunnel with
tun_id = TRACE_VNI (real Pod traffic carries VNI 0); its tag stays in the inner IPv4 DSCP, which the
tunnel carries untouched. The destination node's table 0 sends a packet with that VNI to its agent
and nowhere else (never delivered), and the agent traces it through its own pipeline and sends its
part back through the tunnel with tun_id = REPORT_VNI, in a report frame:

  Ethernet / IPv4 (destination node -> source node, UDP checksum 0) / UDP to REPORT_PORT /
  "NPTR" version tag len(identity) identity zlib(JSON {"node", "observations", "outcome"})

`identity` is that of the trace packet as it left the source node (tags.identity), so the source
takes the report only for the trace it runs, with the same tag and 5-tuple. A report is data from
another node: `decode_report` checks every field and never raises.
"""

from __future__ import annotations

import ipaddress
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from packetin.frames import eth_type, ipv4_header_len, l3_offset
from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_UDP

TRACE_VNI = 0x7FFFFE  # a trace packet crossing to its destination's node
REPORT_VNI = 0x7FFFFD  # that node's report, back to the trace's node
REPORT_PORT = 6636  # the inner UDP port of a report (no socket listens: the report never leaves OVS)
MAGIC = b"NPTR"
VERSION = 1
# The report must fit one Geneve packet on a 1500-byte underlay: 1450 bytes of inner frame, less
# Ethernet, IPv4, UDP and our header. A larger report is cut down (`encode_report`).
MAX_BODY = 1300
_MAX_JSON = 64 * 1024  # what a compressed body may expand to
_HEADER = struct.Struct("!4sBBB")  # magic, version, tag, identity length
_MAC_SRC, _MAC_DST = bytes.fromhex("020000000002"), bytes.fromhex("020000000001")


@dataclass(frozen=True)
class Report:
    """A destination node's part of a trace: which trace (tag, identity) and what the node saw."""

    tag: int
    identity: bytes
    node: str
    observations: list[dict[str, Any]]
    outcome: dict[str, Any]


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _body(node: str, observations: list[dict[str, Any]], outcome: dict[str, Any]) -> bytes:
    """The compressed JSON, cut down until it fits MAX_BODY: rule details of the observations go
    first, then the observations themselves (the outcome, which names the deciding rule, stays)."""
    attempts = (observations,
                [{k: v for k, v in o.items() if k != "rule"} for o in observations],
                [{"table": None, "name": "report", "action": "cut",
                  "detail": f"{len(observations)} observations left out: too large for one tunnel packet"}])
    body = b""
    for obs in attempts:
        body = zlib.compress(json.dumps({"node": node, "observations": obs, "outcome": outcome},
                                        separators=(",", ":")).encode(), 9)
        if len(body) <= MAX_BODY:
            return body
    return zlib.compress(json.dumps({"node": node, "observations": [],
                                     "outcome": {"result": outcome.get("result"),
                                                 "detail": "report too large for one tunnel packet"}}).encode(), 9)


def encode_report(tag: int, identity: bytes, node: str, observations: list[dict[str, Any]],
                  outcome: dict[str, Any], src: str, dst: str) -> bytes:
    """The report frame, from the node at `src` to the trace's node at `dst` (underlay addresses)."""
    payload = _HEADER.pack(MAGIC, VERSION, tag & 0x3F, len(identity)) + identity + _body(node, observations, outcome)
    udp = struct.pack("!HHHH", REPORT_PORT, REPORT_PORT, 8 + len(payload), 0) + payload
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, IPPROTO_UDP, 0,
                               ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed))
    ip[10:12] = _checksum(bytes(ip)).to_bytes(2, "big")
    return _MAC_DST + _MAC_SRC + ETH_TYPE_IPV4.to_bytes(2, "big") + bytes(ip) + udp


def _json_value(value: Any, depth: int = 0) -> bool:
    """Plain JSON data (strings, numbers, booleans, null, and lists and objects of those), not too deep."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if depth > 4:
        return False
    if isinstance(value, list):
        return all(_json_value(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_value(v, depth + 1) for k, v in value.items())
    return False


def decode_report(frame: bytes) -> Report | None:
    """The report in `frame`, or None for anything else (a truncated, forged or foreign frame)."""
    l3 = l3_offset(frame)
    if l3 < 0 or eth_type(frame, l3) != ETH_TYPE_IPV4:
        return None
    ihl = ipv4_header_len(frame, l3)
    if not ihl or frame[l3 + 9] != IPPROTO_UDP:
        return None
    payload = frame[l3 + ihl + 8:]
    if len(payload) < _HEADER.size:
        return None
    magic, version, tag, id_len = _HEADER.unpack_from(payload)
    if magic != MAGIC or version != VERSION or len(payload) < _HEADER.size + id_len:
        return None
    identity = payload[_HEADER.size:_HEADER.size + id_len]
    try:
        inflater = zlib.decompressobj()
        text = inflater.decompress(payload[_HEADER.size + id_len:], _MAX_JSON)
        if inflater.unconsumed_tail:
            return None
        body = json.loads(text)
    except (zlib.error, ValueError):
        return None
    if not isinstance(body, dict) or not _json_value(body):
        return None
    node, observations, outcome = body.get("node"), body.get("observations"), body.get("outcome")
    if not isinstance(node, str) or not isinstance(observations, list) or not isinstance(outcome, dict):
        return None
    if not all(isinstance(o, dict) for o in observations) or not isinstance(outcome.get("result"), str):
        return None
    return Report(tag, identity, node, observations, outcome)


def retag(frame: bytes, dscp: int) -> bytes:
    """`frame` (Ethernet/IPv4) with its DSCP set to `dscp` (ECN kept) and the IPv4 checksum redone: the
    destination node traces a received packet under a tag of its own, never one its own traces hold."""
    l3 = l3_offset(frame)
    ihl = ipv4_header_len(frame, l3) if l3 >= 0 and eth_type(frame, l3) == ETH_TYPE_IPV4 else 0
    if not ihl or len(frame) < l3 + ihl:
        raise ValueError("a trace packet is Ethernet/IPv4")
    header = bytearray(frame[l3:l3 + ihl])
    header[1] = (dscp << 2) | (header[1] & 0x3)
    header[10:12] = b"\0\0"
    header[10:12] = _checksum(bytes(header)).to_bytes(2, "big")
    return frame[:l3] + bytes(header) + frame[l3 + ihl:]


def report_out(frame: bytes, address: str, tunnel_ofport: int) -> Any:
    """The packet-out sending the report `frame` into the tunnel to the node at `address`, marked REPORT_VNI."""
    from os_ken.ofproto import ofproto_v1_5 as ofp
    from os_ken.ofproto import ofproto_v1_5_parser as parser

    from packetin.messages import CODEC

    return parser.OFPPacketOut(CODEC, buffer_id=ofp.OFP_NO_BUFFER, match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                               actions=[parser.OFPActionSetField(tun_ipv4_dst=address),
                                        parser.OFPActionSetField(tunnel_id=REPORT_VNI),
                                        parser.OFPActionOutput(tunnel_ofport)], data=frame)
