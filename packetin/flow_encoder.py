"""OFPT_FLOW_MOD (OpenFlow 1.5) encoder for the flow shapes the agent produces, byte-identical to os-ken.

os-ken builds an object tree per flow_mod and walks it to serialise; this packs
the same bytes with struct from a FlowSpec (bench/flow_encoder.py has the ratio).
tests/unit/packetin/test_flow_encoder.py checks both agree on every flow the compiler and
the fixed tables emit and on generated specs. Pure: spec in, bytes out. A field,
value or action outside the covered shapes raises Unsupported, and the caller
(messages.FlowMod) lets os-ken encode that flow instead.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Callable

from packetin.errors import PacketInError
from packetin.flow_spec import NXAC2PT_METER_ID, Conjunction, Controller, Ct, FlowSpec, Output, Resubmit, SetField

OFP_VERSION = 6
OFPT_FLOW_MOD = 14
OFPFC_ADD = 0
OFPFC_DELETE_STRICT = 4
_NO_BUFFER = _ANY = 0xFFFFFFFF  # buffer_id, out_port, out_group
_OFPMT_OXM = 1
_OFPIT_GOTO_TABLE = 1
_OFPIT_APPLY_ACTIONS = 4
_OFPAT_OUTPUT = 0
_OFPAT_SET_FIELD = 25
_OFPAT_EXPERIMENTER = 0xFFFF
_OFPCML_MAX = 0xFFE5  # os-ken's default max_len for output
_NX_EXPERIMENTER_ID = 0x00002320
_NXAST_RESUBMIT_TABLE = 14
_NXAST_CONJUNCTION = 34
_NXAST_CT = 35
_NXAST_CONTROLLER2 = 37
_NXAC2PT_MAX_LEN = 0
_NXAC2PT_REASON = 2
_NXAC2PT_USERDATA = 3

# Header, flow_mod body and the match's type+length: everything before the OXM fields.
# version, type, length, xid | cookie, cookie_mask, table, command, idle, hard, priority,
# buffer_id, out_port, out_group, flags, importance | match type, match length
_HEAD = struct.Struct("!BBHIQQBBHHHIIIHHHH")
_OUTPUT = struct.Struct("!HHIH6x")
_TLV_HEADER = struct.Struct("!HH")
_RESUBMIT = struct.Struct("!HHIHHB3x")
_CONJUNCTION = struct.Struct("!HHIHBBI")
_CT = struct.Struct("!HHIHH4xHB3xH")  # flags, zone_src (none), zone_imm, recirc_table, alg
_GOTO = struct.Struct("!HHB3x")
_APPLY_ACTIONS = struct.Struct("!HH4x")
_PADS = tuple(bytes(n) for n in range(8))
_U32 = struct.Struct("!I")
_CONTROLLER = struct.Struct("!HHIH6xHHH2xHHB3x")  # NX header, pad, max_len and reason properties
_METER_PROP = struct.Struct("!HHI")


class Unsupported(PacketInError):
    """A flow this encoder does not cover; os-ken encodes it instead."""


# --- match fields ----------------------------------------------------------------------

_INT, _IPV4, _IPV6, _MAC = range(4)
_OF_BASIC = 0x8000  # OXM class of the OpenFlow basic fields
_NXM_1 = 0x0001  # OXM class of the Nicira extensions (registers, conntrack, conj_id)

# name -> (OXM class, field number, value size, kind), as os-ken names and sizes them.
_FIELD_TABLE: dict[str, tuple[int, int, int, int]] = {
    "in_port": (_OF_BASIC, 0, 4, _INT),
    "metadata": (_OF_BASIC, 2, 8, _INT),
    "eth_dst": (_OF_BASIC, 3, 6, _MAC),
    "eth_src": (_OF_BASIC, 4, 6, _MAC),
    "eth_type": (_OF_BASIC, 5, 2, _INT),
    "vlan_vid": (_OF_BASIC, 6, 2, _INT),
    "ip_dscp": (_OF_BASIC, 8, 1, _INT),
    "ip_proto": (_OF_BASIC, 10, 1, _INT),
    "ipv4_src": (_OF_BASIC, 11, 4, _IPV4),
    "ipv4_dst": (_OF_BASIC, 12, 4, _IPV4),
    "tcp_src": (_OF_BASIC, 13, 2, _INT),
    "tcp_dst": (_OF_BASIC, 14, 2, _INT),
    "udp_src": (_OF_BASIC, 15, 2, _INT),
    "udp_dst": (_OF_BASIC, 16, 2, _INT),
    "sctp_src": (_OF_BASIC, 17, 2, _INT),
    "sctp_dst": (_OF_BASIC, 18, 2, _INT),
    "icmpv4_type": (_OF_BASIC, 19, 1, _INT),
    "icmpv4_code": (_OF_BASIC, 20, 1, _INT),
    "arp_op": (_OF_BASIC, 21, 2, _INT),
    "arp_spa": (_OF_BASIC, 22, 4, _IPV4),
    "arp_tpa": (_OF_BASIC, 23, 4, _IPV4),
    "arp_sha": (_OF_BASIC, 24, 6, _MAC),
    "arp_tha": (_OF_BASIC, 25, 6, _MAC),
    "ipv6_src": (_OF_BASIC, 26, 16, _IPV6),
    "ipv6_dst": (_OF_BASIC, 27, 16, _IPV6),
    "icmpv6_type": (_OF_BASIC, 29, 1, _INT),
    "icmpv6_code": (_OF_BASIC, 30, 1, _INT),
    "tcp_flags": (_OF_BASIC, 42, 2, _INT),
    "pkt_mark": (_NXM_1, 33, 4, _INT),
    "conj_id": (_NXM_1, 37, 4, _INT),
    "ct_state": (_NXM_1, 105, 4, _INT),
    "ct_zone": (_NXM_1, 106, 2, _INT),
    "ct_mark": (_NXM_1, 107, 4, _INT),
    **{f"reg{n}": (_NXM_1, n, 4, _INT) for n in range(16)},
}


_HEX = frozenset("0123456789abcdefABCDEF")
_INT_FORMAT = {1: "B", 2: "H", 4: "I", 8: "Q"}


class _Field:
    """How one field is written: its sort key and its OXM TLV, masked TLV and set_field action."""

    __slots__ = ("key", "tlv", "masked", "set_field")

    def __init__(self, key: int, tlv: Callable[[Any], bytes], masked: Callable[[Any, Any], bytes],
                 set_field: Callable[[Any], bytes]) -> None:
        self.key = key  # os-ken orders a match by OXM type (class << 7 | field)
        self.tlv = tlv
        self.masked = masked
        self.set_field = set_field


def _int_field(oxm_type: int, size: int) -> _Field:
    """An integer field; values wrap to its size as os-ken's IntDescr wraps them."""
    full = (1 << (8 * size)) - 1
    header = (oxm_type << 9) | size
    masked_header = (oxm_type << 9) | 0x100 | (2 * size)
    fmt = _INT_FORMAT[size]
    set_len = (8 + size + 7) & ~7  # OFPAT_SET_FIELD header + OXM, padded to 8
    plain = struct.Struct(f"!I{fmt}").pack
    pair = struct.Struct(f"!I{fmt}{fmt}").pack
    action = struct.Struct(f"!HHI{fmt}{set_len - 8 - size}x").pack

    def tlv(value: Any) -> bytes:
        if type(value) is not int:
            raise Unsupported(f"integer field given {type(value).__name__}")
        return plain(header, value & full)

    def masked(value: Any, mask: Any) -> bytes:
        if type(value) is not int or type(mask) is not int:
            raise Unsupported(f"integer field given {type(value).__name__}/{type(mask).__name__}")
        # OFPMatch stores value & mask, so that is what os-ken puts on the wire.
        return pair(masked_header, value & mask & full, mask & full)

    def set_field(value: Any) -> bytes:
        if type(value) is not int:
            raise Unsupported(f"integer field given {type(value).__name__}")
        return action(_OFPAT_SET_FIELD, set_len, header, value & full)

    return _Field(oxm_type, tlv, masked, set_field)


def _ip(family: int) -> Callable[[Any], bytes]:
    def parse(value: Any) -> bytes:
        if type(value) is not str:
            raise Unsupported(f"address field given {type(value).__name__}")
        try:
            # netaddr (os-ken's parser) reads a plain address with inet_pton too; what
            # else it accepts (a prefix length, an integer) is os-ken's to encode.
            return socket.inet_pton(family, value)
        except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
            raise Unsupported(f"address {value!r}") from exc
    return parse


def _mac(value: Any) -> bytes:
    if type(value) is not str or len(value) != 17 or value[2::3] != ":::::" \
            or not _HEX.issuperset(value.replace(":", "")):
        raise Unsupported(f"MAC address {value!r} not in aa:bb:cc:dd:ee:ff form")
    return bytes.fromhex(value.replace(":", ""))


def _bytes_field(oxm_type: int, size: int, parse: Callable[[Any], bytes]) -> _Field:
    """An address field: its text is parsed to `size` bytes."""
    header = _U32.pack((oxm_type << 9) | size)
    masked_header = _U32.pack((oxm_type << 9) | 0x100 | (2 * size))
    set_len = (8 + size + 7) & ~7
    set_head = _TLV_HEADER.pack(_OFPAT_SET_FIELD, set_len) + header
    set_pad = bytes(set_len - 8 - size)

    def tlv(value: Any) -> bytes:
        return header + parse(value)

    def masked(value: Any, mask: Any) -> bytes:
        m = parse(mask)
        v = (int.from_bytes(parse(value), "big") & int.from_bytes(m, "big")).to_bytes(size, "big")
        return masked_header + v + m

    def set_field(value: Any) -> bytes:
        return set_head + parse(value) + set_pad

    return _Field(oxm_type, tlv, masked, set_field)


def _field(oxm_class: int, field: int, size: int, kind: int) -> _Field:
    oxm_type = (oxm_class << 7) | field
    if kind == _INT:
        return _int_field(oxm_type, size)
    parse = {_IPV4: _ip(socket.AF_INET), _IPV6: _ip(socket.AF_INET6), _MAC: _mac}[kind]
    return _bytes_field(oxm_type, size, parse)


_FIELDS = {name: _field(*spec) for name, spec in _FIELD_TABLE.items()}


def encode_match_fields(match: tuple[tuple[str, Any], ...]) -> bytes:
    """The OXM fields of a match, in os-ken's order (by OXM type), without the match header.

    A (value, mask) pair is written masked, with value & mask as OFPMatch stores it.
    """
    fields: dict[int, bytes] = {}
    fields_get = _FIELDS.get
    for item in match:
        try:
            name, value = item
            f = fields_get(name)
        except (TypeError, ValueError) as exc:
            raise Unsupported(f"match item {item!r}") from exc
        if f is None:
            raise Unsupported(f"match field {name!r}")
        if type(value) is tuple:
            if len(value) != 2:
                raise Unsupported(f"match field {name!r}: {len(value)}-tuple")
            fields[f.key] = f.masked(value[0], value[1])
        else:
            fields[f.key] = f.tlv(value)
    if len(fields) != len(match):
        # Named twice: OFPMatch(**dict(...)) keeps the last one; os-ken's to do.
        raise Unsupported(f"a match field given twice in {match!r}")
    return b"".join([fields[key] for key in sorted(fields)])


# --- actions ---------------------------------------------------------------------------


def _output(action: Output) -> bytes:
    return _OUTPUT.pack(_OFPAT_OUTPUT, 16, action.port, _OFPCML_MAX)


def _set_field(action: SetField) -> bytes:
    f = _FIELDS.get(action.name) if type(action.name) is str else None
    if f is None:
        raise Unsupported(f"set_field {action.name!r}")
    if type(action.value) is tuple:
        raise Unsupported(f"set_field {action.name!r} with a mask")
    return f.set_field(action.value)


def _resubmit(action: Resubmit) -> bytes:
    return _RESUBMIT.pack(_OFPAT_EXPERIMENTER, 16, _NX_EXPERIMENTER_ID, _NXAST_RESUBMIT_TABLE,
                          action.in_port, action.table)


def _conjunction(action: Conjunction) -> bytes:
    return _CONJUNCTION.pack(_OFPAT_EXPERIMENTER, 16, _NX_EXPERIMENTER_ID, _NXAST_CONJUNCTION,
                             action.clause, action.n_clauses, action.conj_id)


def _ct(action: Ct) -> bytes:
    return _CT.pack(_OFPAT_EXPERIMENTER, 24, _NX_EXPERIMENTER_ID, _NXAST_CT, 1 if action.commit else 0,
                    action.zone, 0xFF if action.table is None else action.table, 0)


def _controller(action: Controller) -> bytes:
    """NXAST_CONTROLLER2 laid out as messages._NXActionController2Metered serialises it."""
    userdata = action.userdata
    if not isinstance(userdata, (bytes, bytearray)):
        raise Unsupported(f"controller userdata of type {type(userdata).__name__}")
    tail = b""
    if userdata:
        length = 4 + len(userdata)
        tail = _TLV_HEADER.pack(_NXAC2PT_USERDATA, length) + userdata + _PADS[-length % 8]
    if action.meter_id is not None:
        tail += _METER_PROP.pack(NXAC2PT_METER_ID, 8, action.meter_id)
    # 16 bytes of action header (with 6 of padding) + max_len and reason properties, 8 each.
    return _CONTROLLER.pack(_OFPAT_EXPERIMENTER, 32 + len(tail), _NX_EXPERIMENTER_ID, _NXAST_CONTROLLER2,
                            _NXAC2PT_MAX_LEN, 8, action.max_len, _NXAC2PT_REASON, 8, action.reason) + tail


_ACTIONS: dict[type, Callable[[Any], bytes]] = {
    Output: _output, SetField: _set_field, Resubmit: _resubmit, Conjunction: _conjunction, Ct: _ct,
    Controller: _controller,
}


# --- the message -----------------------------------------------------------------------


def encode_flow_mod(spec: FlowSpec, command: int, xid: int) -> bytes:
    """OFPT_FLOW_MOD for `spec`: ADD carries the cookie and instructions, DELETE_STRICT neither.

    The same bytes as messages.serialize() of os-ken's OFPFlowMod; Unsupported
    for a spec outside the covered fields, values and actions, or a number too
    wide for its slot (os-ken then raises its own error).
    """
    try:
        fields = encode_match_fields(spec.match)
        match_len = 4 + len(fields)
        pad = _PADS[-match_len % 8]
        if command == OFPFC_ADD:
            instructions = b""
            if spec.actions:
                acts = []
                for action in spec.actions:
                    encode = _ACTIONS.get(type(action))
                    if encode is None:
                        raise Unsupported(f"action {type(action).__name__}")
                    acts.append(encode(action))
                body = b"".join(acts)
                instructions = _APPLY_ACTIONS.pack(_OFPIT_APPLY_ACTIONS, 8 + len(body)) + body
            if spec.goto is not None:
                instructions += _GOTO.pack(_OFPIT_GOTO_TABLE, 8, spec.goto.table)
            return _HEAD.pack(OFP_VERSION, OFPT_FLOW_MOD, 52 + len(fields) + len(pad) + len(instructions), xid,
                              spec.cookie, 0, spec.table, command, 0, 0, spec.priority, _NO_BUFFER, _ANY, _ANY, 0, 0,
                              _OFPMT_OXM, match_len) + fields + pad + instructions
        if command == OFPFC_DELETE_STRICT:
            return _HEAD.pack(OFP_VERSION, OFPT_FLOW_MOD, 52 + len(fields) + len(pad), xid,
                              0, 0, spec.table, command, 0, 0, spec.priority, _NO_BUFFER, _ANY, _ANY, 0, 0,
                              _OFPMT_OXM, match_len) + fields + pad
    except struct.error as exc:
        raise Unsupported(f"{spec.describe()}: {exc}") from exc
    raise Unsupported(f"flow_mod command {command}")
