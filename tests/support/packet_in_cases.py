"""NXT_PACKET_IN2 cases shared by the decoder tests (tests/unit/packetin/test_wire.py, test_layouts.py):
real OVS 3.1 packet-ins recorded from the agent, messages built by hand (hypothesis `packet_in2s`), and
os-ken's reading of a message to compare with."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st
from os_ken.ofproto import ofproto_v1_5 as ofp

from packetin import messages, wire
from packetin.errors import DecodeError
from packetin.model import PacketIn
from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_ICMP
from tests.support.packet_ins import in_port_oxm, nxm_reg_oxm, oxm, packet_in2, prop, xreg3_oxm

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "ovs31_packet_in2_stream.bin"
STREAM = DATA.read_bytes()
RECORDED = wire.Framer().feed(STREAM)

# NXT_PACKET_IN2 property types (OVS include/openflow/nicira-ext.h).
NXPINT_PACKET, NXPINT_FULL_LEN, NXPINT_BUFFER_ID, NXPINT_TABLE_ID = 0, 1, 2, 3
NXPINT_COOKIE, NXPINT_REASON, NXPINT_METADATA, NXPINT_USERDATA = 4, 5, 6, 7
NXPINT_CONTINUATION = 8


u8 = st.integers(0, 0xFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)


# --- building messages by hand ---------------------------------------------------------


def with_length(raw: bytes) -> bytes:
    """`raw` with its OpenFlow length field rewritten to match its size."""
    return raw[:2] + struct.pack("!H", len(raw) & 0xFFFF) + raw[4:]


# Metadata entries the decoder must skip: other registers, the pipeline metadata
# field (also masked), the tunnel id, in_phy_port (a 4-byte port next to in_port),
# and NXM0 entries whose field numbers are 6 and 7 like reg6/reg7 (ip_proto, ip_src).
NOISE_OXMS = st.one_of(
    st.builds(lambda v: oxm(0x0000, 7, struct.pack("!I", v)), u32),
    st.builds(lambda v: oxm(0x0000, 6, struct.pack("!B", v)), u8),
    st.builds(nxm_reg_oxm, st.integers(0, 5), u32),
    st.builds(lambda n, v: oxm(0x8001, n, struct.pack("!Q", v)), st.sampled_from([0, 1, 2, 4, 5, 6, 7]), u64),
    st.builds(lambda v: oxm(0x8000, 2, struct.pack("!Q", v)), u64),
    st.builds(lambda v, m: oxm(0x8000, 2, struct.pack("!Q", v), struct.pack("!Q", m)), u64, u64),
    st.builds(lambda v: oxm(0x8000, 38, struct.pack("!Q", v)), u64),
    st.builds(lambda v: oxm(0x8000, 1, struct.pack("!I", v)), u32),
)

# Property types the decoder ignores. os-ken knows BUFFER_ID and CONTINUATION;
# it crashes on any other type (OFPPropUnknown has no `sub_parser`), so messages
# compared against os-ken only use these two.
OSKEN_KNOWN_EXTRAS = st.one_of(
    st.tuples(st.just(NXPINT_BUFFER_ID), st.binary(min_size=4, max_size=4)),
    st.tuples(st.just(NXPINT_CONTINUATION), st.binary(max_size=40)),
)
ANY_EXTRAS = st.one_of(
    OSKEN_KNOWN_EXTRAS,
    st.tuples(st.integers(9, 0xFFFF), st.binary(max_size=40)),
)


@dataclass
class Spec:
    """What a generated message carries; None means the property/entry is absent."""

    packet: bytes | None = None
    full_len: int | None = None
    table_id: int | None = None
    cookie: int | None = None
    reason: int | None = None
    userdata: bytes | None = None
    metadata: bool = False
    in_port: int | None = None
    regs: tuple[int, int] | None = None  # (reg6, reg7)
    reg_style: str = "xreg"  # "xreg": OF1.5 xreg3; "nxm": OF1.3-style NXM reg6/reg7
    extras: list[tuple[int, bytes]] = field(default_factory=list)

    def expected(self) -> dict:
        packet = self.packet or b""
        reg6, reg7 = self.regs or (0, 0)
        return dict(
            reason=self.reason or 0,
            table_id=self.table_id or 0,
            cookie=self.cookie or 0,
            in_port=self.in_port,
            rule_id=reg6,
            reg7=reg7,
            userdata=self.userdata or b"",
            packet=packet,
            total_len=len(packet) if self.full_len is None else self.full_len,
        )


@st.composite
def packet_in2s(draw, extras=ANY_EXTRAS, ovs_order: bool = False) -> tuple[Spec, bytes]:  # noqa: C901
    """(spec, raw message) with properties and metadata entries in random order.

    With `ovs_order`, properties come in the order OVS sends them (packet,
    full_len, table_id, cookie, reason, metadata, userdata; extras last), the
    layout the decoder's fast path takes.
    """
    # In OVS order, what OVS always sends is always there (full_len only sometimes),
    # and table_id/reason are 1-byte properties (length 5) as OVS declares them.
    maybe = (lambda strategy: strategy) if ovs_order else (lambda strategy: st.none() | strategy)
    s = Spec(
        packet=draw(maybe(st.binary(max_size=160))),
        full_len=draw(st.none() | u32),
        table_id=draw(maybe(u8)),
        cookie=draw(maybe(st.integers(1 << 32, (1 << 64) - 1) | u64)),
        reason=draw(maybe(u8)),
        userdata=draw(st.none() | st.binary(max_size=40)),
        extras=draw(st.lists(extras, max_size=3)),
    )
    props: list[bytes] = []
    if s.packet is not None:
        props.append(prop(NXPINT_PACKET, s.packet))
    if s.full_len is not None:
        props.append(prop(NXPINT_FULL_LEN, struct.pack("!I", s.full_len)))
    if s.table_id is not None:
        props.append(prop(NXPINT_TABLE_ID, struct.pack("!B" if ovs_order else "!B3x", s.table_id)))
    if s.cookie is not None:
        props.append(prop(NXPINT_COOKIE, struct.pack("!4xQ", s.cookie)))
    if s.reason is not None:
        props.append(prop(NXPINT_REASON, struct.pack("!B" if ovs_order else "!B3x", s.reason)))
    userdata = [prop(NXPINT_USERDATA, s.userdata)] if s.userdata is not None else []
    if draw(st.booleans()):
        s.metadata = True
        s.in_port = draw(st.none() | u32)
        s.regs = draw(st.none() | st.tuples(u32, u32))
        s.reg_style = draw(st.sampled_from(["xreg", "nxm"]))
        entries = draw(st.lists(NOISE_OXMS, max_size=4))
        if s.in_port is not None:
            entries.append(in_port_oxm(s.in_port))
        if s.regs is not None:
            if s.reg_style == "xreg":
                entries.append(xreg3_oxm(*s.regs))
            else:
                entries += [nxm_reg_oxm(6, s.regs[0]), nxm_reg_oxm(7, s.regs[1])]
        props.append(prop(NXPINT_METADATA, b"".join(draw(st.permutations(entries)))))
    props += userdata
    extra = [prop(t, body) for t, body in s.extras]
    ordered = props + extra if ovs_order else draw(st.permutations(props + extra))
    return s, packet_in2(ordered, xid=draw(u32))


def fields(pin: PacketIn) -> dict:
    return dict(
        reason=pin.reason, table_id=pin.table_id, cookie=pin.cookie, in_port=pin.in_port,
        rule_id=pin.rule_id, reg7=pin.reg7, userdata=pin.userdata, packet=pin.packet,
        total_len=pin.total_len,
    )


def decode_or_error(raw: bytes) -> PacketIn | None:
    """Decode; None on DecodeError. Any other exception fails the calling test."""
    try:
        pin = wire.decode_packet_in2(raw, 0.0)
    except DecodeError:
        return None
    assert isinstance(pin, PacketIn)
    return pin


# --- os-ken's view of a message ------------------------------------------------------


def osken_fields(raw: bytes) -> dict:
    """The fields decode_packet_in2 returns, as os-ken's full parser sees them.

    Two os-ken bugs are worked around rather than compared:
      * cookie: OVS puts 4 bytes of padding before the 64-bit cookie (the
        property is 16 bytes); os-ken unpacks `!Q` at the start of the body, so
        its `.cookie` is pad + the cookie's upper 32 bits, i.e. cookie >> 32.
        We read the 8 bytes after the pad from os-ken's raw property instead.
      * total_len: without NXPINT_FULL_LEN os-ken sets it to the PACKET
        property's length *including* its 4-byte header, so it is not compared.
    Absent properties are None in os-ken and 0 in PacketIn.
    """
    msg = messages.parse(raw)
    assert type(msg).__name__ == "NXTPacketIn2", msg
    cookie = 0
    for p in msg.properties:
        if p.type == NXPINT_COOKIE:
            cookie = struct.unpack_from("!Q", p.data, 4)[0]
    oxms = {}
    metadata, off = bytes(msg.metadata or b""), 0
    while off < len(metadata):
        num, value, mask, length = ofp.oxm_parse(metadata, off)
        name, user_value = ofp.oxm_to_user(num, value, mask)
        oxms[name] = user_value
        off += length
    if "xreg3" in oxms:
        rule_id, reg7 = oxms["xreg3"] >> 32, oxms["xreg3"] & 0xFFFF_FFFF
    else:
        rule_id, reg7 = oxms.get("reg6", 0), oxms.get("reg7", 0)
    return dict(
        reason=msg.reason or 0, table_id=msg.table_id or 0, cookie=cookie,
        in_port=oxms.get("in_port"), rule_id=rule_id, reg7=reg7,
        userdata=bytes(msg.userdata or b""), packet=bytes(msg.data or b""),
    )


def without_total_len(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "total_len"}


# --- the recording ---------------------------------------------------------------------


def ethertype(pin: PacketIn) -> int:
    return struct.unpack_from("!H", pin.packet, 12)[0]


def is_icmp(pin: PacketIn) -> bool:
    return ethertype(pin) == ETH_TYPE_IPV4 and pin.packet[23] == IPPROTO_ICMP
