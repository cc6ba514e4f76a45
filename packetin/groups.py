"""Packet-ins of one read that a coarse audit record cannot tell apart, handed over as one group.

In overload (auditlog/overload.py: the audit pipeline aggregates without ports) the reader
need not build a PacketIn per NXT_PACKET_IN2. `group_key` masks the raw message as one
integer (a layout per message length, walked once): two messages with the same key decode
(wire.decode_packet_in2) to the same packet-in in every field but the frame (reason, table,
cookie, in_port, reg6, reg7, userdata, total_len), and their frames are untagged Ethernet +
IPv4 (as packetin.frames walks them), not fragments,
of the same length, with the same header length, protocol, source and destination.
Only the first message of a group is decoded; the others stay raw bytes, counted, and
decoded only by a consumer that needs each one (`PacketInGroup.packet_ins`).
A message without a key (anything else) is decoded on its own.
"""

from __future__ import annotations

import itertools
from typing import Callable, NamedTuple

from packetin import frames, wire
from packetin.errors import DecodeError
from packetin.model import PacketIn
from packetin.protocol_numbers import ETH_TYPE_IPV4
from packetin.registers import REG_DISPOSITION, REG_RULE_ID, XREG_RULE_AND_DISPOSITION

_EXP = wire.PACKET_IN2_EXPERIMENTER
# Where the frame starts in a message whose first property is the packet (OVS always sends it first).
FRAME_OFFSET = 20
_IP = FRAME_OFFSET + 14  # the IPv4 header of an untagged frame
_METADATA = 6
_MAX_LAYOUTS = 64


_FF4 = b"\xff" * 4


def _layout(msg: bytes) -> tuple[int, int, int, int] | None:
    """The layout of `msg`, or None when it has no group key: (header mask, the bytes of `msg`
    under it, keep mask) as big-endian integers over the whole message. The header mask covers
    what makes the message one we group (an NXT_PACKET_IN2 whose first property is an untagged
    Ethernet + IPv4 frame, IP header whole, not a fragment), its length, and every property and
    OXM header after the packet, walked as wire.decode_packet_in2 walks them. The keep mask
    covers those too, the IPv4 protocol and addresses, and every byte the decoder reads after
    the packet: all but the values of metadata OXMs other than in_port, reg6 and reg7
    (conntrack fields, the other registers), which change from packet to packet. Last, a
    serial number: keys of two layouts never meet."""
    n = len(msg)
    if n < _IP + 20 or msg[1] != wire.OFPT_EXPERIMENTER or msg[16] or msg[17] or msg[8:16] != _EXP:
        return None
    plen = (msg[18] << 8) | msg[19]
    if ((msg[2] << 8) | msg[3]) != n or 16 + plen > n or frames.l3_offset(msg, FRAME_OFFSET) != _IP \
            or frames.eth_type(msg, _IP) != ETH_TYPE_IPV4:
        return None  # not an untagged Ethernet II + IPv4 frame
    ihl = frames.ipv4_header_len(msg, _IP)
    if not ihl or 16 + plen < _IP + ihl or frames.ipv4_fragment_offset(msg, _IP) \
            or frames.ipv4_more_fragments(msg, _IP):
        return None  # no IPv4 header, not whole in the packet property, or a fragment
    head, keep = bytearray(n), bytearray(n)
    for start, end in ((1, 4), (8, 20), (_IP - 2, _IP + 1), (_IP + 7, _IP + 8)):
        head[start:end] = b"\xff" * (end - start)
    head[_IP + 6] = 0x3F  # the fragment flags and offset's high bits
    keep[:] = head
    keep[_IP + 9] = 0xFF  # protocol
    keep[_IP + 12:_IP + 20] = b"\xff" * 8  # addresses
    off = 16 + ((plen + 7) & ~7)
    while off < n:
        if n - off < 4:
            return None
        length = (msg[off + 2] << 8) | msg[off + 3]
        pend = off + length
        if length < 4 or pend > n:
            return None
        head[off:off + 4] = keep[off:off + 4] = _FF4
        if (msg[off] << 8) | msg[off + 1] == _METADATA:
            o = off + 4
            while o < pend:
                if pend - o < 4 or o + 4 + msg[o + 3] > pend:
                    return None
                head[o:o + 4] = keep[o:o + 4] = _FF4
                vlen = msg[o + 3]
                oclass, field = (msg[o] << 8) | msg[o + 1], msg[o + 2] >> 1
                if (oclass == wire._OXM_OF_BASIC and field == wire._OFB_IN_PORT) or (
                        oclass == wire._OXM_OF_PKT_REGS and field == XREG_RULE_AND_DISPOSITION) or (
                        oclass == wire._OXM_NXM1 and field in (REG_RULE_ID, REG_DISPOSITION)):
                    keep[o + 4:o + 4 + vlen] = b"\xff" * vlen
                o += 4 + vlen
        else:
            keep[off:pend] = b"\xff" * length
        off += (length + 7) & ~7
    h = int.from_bytes(head, "big")
    return h, int.from_bytes(msg, "big") & h, int.from_bytes(keep, "big"), next(_serial)


_serial = itertools.count()
_layouts: dict[int, list[tuple[int, int, int, int]]] = {}  # message length -> layouts seen with it, newest last


def group_key(msg: bytes) -> tuple[int, int] | None:
    """The group key of an NXT_PACKET_IN2 (see the module docstring), or None when it has none.

    Two messages with the same key have the same length, packet property length, IPv4 header
    length, protocol and addresses, and after the packet the same bytes wherever the decoder
    looks: every property and OXM header (so it walks both the same way) and every value it
    reads. Per message this is a few integer operations; a layout not seen before is walked.
    """
    value = int.from_bytes(msg, "big")
    layouts = _layouts.get(len(msg))
    if layouts is not None:
        for head, expected, keep, serial in layouts:
            if value & head == expected:
                return serial, value & keep
    layout = _layout(msg)
    if layout is None:
        return None
    if layouts is None:
        if len(_layouts) >= _MAX_LAYOUTS:
            _layouts.clear()
        layouts = _layouts[len(msg)] = []
    elif len(layouts) >= 4:
        del layouts[0]
    layouts.append(layout)
    return layout[3], value & layout[2]


class PacketInGroup(NamedTuple):
    """`size` packet-ins read together with the same group key: `sample` is the first one
    decoded, `raws` every message (the sample's first). The frame of raws[i] is
    raws[i][FRAME_OFFSET:FRAME_OFFSET + len(sample.packet)]."""

    sample: PacketIn
    raws: list[bytes]

    @property
    def size(self) -> int:  # not `count`: that is tuple.count, a method
        return len(self.raws)

    @property
    def category(self) -> int | None:
        return self.sample.category

    def packet_ins(self) -> list[PacketIn]:
        """Every packet-in of the group, decoded (for a consumer that handles them one by one)."""
        decode, at = wire.decode_packet_in2, self.sample.received_at
        return [self.sample, *(decode(raw, at) for raw in self.raws[1:])]

    def head(self, n: int) -> "PacketInGroup":
        """The first `n` packet-ins of the group (n >= 1)."""
        return self if n >= len(self.raws) else PacketInGroup(self.sample, self.raws[:n])

    def pick(self, indexes: list[int]) -> "PacketInGroup | None":
        """The packet-ins at `indexes` (ascending) as a group, None for none."""
        if not indexes:
            return None
        raws = self.raws
        first = raws[indexes[0]]
        sample = self.sample if indexes[0] == 0 else wire.decode_packet_in2(first, self.sample.received_at)
        return PacketInGroup(sample, [raws[i] for i in indexes])


def split_read(msgs: list[bytes], received_at: float, on_malformed: Callable[[int, DecodeError], None]
               ) -> tuple[list[PacketInGroup], list[bytes]]:
    """Group the packet-ins of one read: (groups in order of their first message, the messages
    without a group key, in order). A group whose sample does not decode is malformed as a
    whole (every message of it would fail the same way): `on_malformed(count, error)`."""
    groups: dict[tuple[int, int], list[bytes]] = {}
    rest: list[bytes] = []
    for raw in msgs:
        key = group_key(raw)
        if key is None:
            rest.append(raw)
            continue
        members = groups.get(key)
        if members is None:
            groups[key] = [raw]
        else:
            members.append(raw)
    out: list[PacketInGroup] = []
    decode = wire.decode_packet_in2
    for raws in groups.values():
        try:
            out.append(PacketInGroup(decode(raws[0], received_at), raws))
        except DecodeError as exc:
            on_malformed(len(raws), exc)
    return out, rest
