"""NXT_PACKET_IN2 decoding by learned layout: one struct unpack per packet-in instead of a property walk.

OVS sends the packet-ins of one flow with the same properties, in the same order, of the same
sizes: only the values differ. The first message of a length is decoded by packetin/wire.py's
walk, which also says where it looked (its slots): the bytes that steered it (the length field,
every property and OXM header) and where each PacketIn field was read. The next message of that
length is read with one precompiled struct; if its steering bytes are those of the learned
message, the walk would have taken the same path and read the same offsets, so the values read
are the walk's. Anything else (another layout of the same length, a corrupted header) is walked
again, which raises DecodeError where the walk does, and the layout is learned anew.
tests/unit/packetin/test_layouts.py checks the two agree on recorded, generated and damaged bytes.
"""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import Any, Callable

from packetin.model import PacketIn
from packetin.wire import Slot, decode_packet_in2

# PacketIn's fields when the walk did not read them (the walk's own defaults); total_len
# defaults to the packet's length, which a layout fixes.
_DEFAULTS: dict[int, Any] = {0: 0, 1: 0, 2: 0, 3: None, 4: 0, 5: 0, 6: b""}
_PACKET, _TOTAL_LEN, _RECEIVED_AT = 7, 8, 9
MAX_LAYOUTS = 64  # lengths remembered; a full set starts over

_new_packet_in: Callable[..., PacketIn] = tuple.__new__


class Layout:
    """How to read a message of one learned layout (see the module's docstring)."""

    __slots__ = ("unpack", "headers", "expected", "pick", "consts", "packet_start", "packet_end")

    def __init__(self, msg: bytes, slots: list[Slot]) -> None:
        """ValueError when the slots cannot be laid out as one struct (overlapping: never from the walk)."""
        values: dict[int, tuple[int, str]] = {}
        items: list[tuple[int, str, int]] = []  # (offset, code, field or -1 for a steering header)
        self.packet_start = self.packet_end = 0
        for slot in slots:
            if slot[0] == "h":
                items.append((slot[1], slot[2], -1))
            elif slot[0] == "v":
                values[slot[3]] = (slot[1], slot[2])  # a field read twice: the walk keeps the last
            else:
                self.packet_start, self.packet_end = slot[1], slot[2]
        items += [(off, code, f) for f, (off, code) in values.items()]
        items.sort()
        fmt, pos = ["!"], 0
        index: dict[int, int] = {}
        header_index: list[int] = []
        for i, (off, code, f) in enumerate(items):
            if off < pos:
                raise ValueError(f"slots overlap at offset {off}")
            if off > pos:
                fmt.append(f"{off - pos}x")
            fmt.append(code)
            pos = off + struct.calcsize("!" + code)
            if f < 0:
                header_index.append(i)
            else:
                index[f] = i
        unpacker = struct.Struct("".join(fmt))
        if unpacker.size > len(msg):
            raise ValueError("slots run past the message")
        self.unpack = unpacker.unpack_from
        n = len(items)
        consts: list[Any] = []
        order: list[int] = []
        for f in range(_RECEIVED_AT + 1):
            if f in index:
                order.append(index[f])
            elif f == _PACKET:
                order.append(-2)
            elif f == _RECEIVED_AT:
                order.append(-1)
            else:
                order.append(n + len(consts))
                consts.append(self.packet_end - self.packet_start if f == _TOTAL_LEN else _DEFAULTS[f])
        # The packet and received_at come last in what `pick` reads: (*unpacked, *consts, packet, received_at).
        self.consts = tuple(consts)
        tail = n + len(consts)
        self.pick = itemgetter(*(tail + 2 + o if o < 0 else o for o in order))
        # itemgetter of one index gives the item, not a tuple: name a lone header twice.
        self.headers = itemgetter(*(header_index if len(header_index) > 1 else header_index * 2))
        self.expected = self.headers(self.unpack(msg))


class PacketIn2Decoder:
    """decode_packet_in2 with learned layouts: call it as the function (same values, same errors)."""

    __slots__ = ("_layouts", "learned", "walked")

    def __init__(self) -> None:
        self._layouts: dict[int, Layout] = {}
        self.learned = 0  # layouts learned (a message walked whose length had none or another)
        self.walked = 0  # messages decoded by the walk

    def __call__(self, msg: bytes, received_at: float) -> PacketIn:
        layout = self._layouts.get(len(msg))
        if layout is not None:
            t = layout.unpack(msg)
            if layout.headers(t) == layout.expected:
                return _new_packet_in(PacketIn, layout.pick(
                    t + layout.consts + (msg[layout.packet_start:layout.packet_end], received_at)))
        slots: list[Slot] = []
        pin = decode_packet_in2(msg, received_at, slots)  # DecodeError here: nothing learned
        self.walked += 1
        try:
            learned = Layout(msg, slots)
        except (ValueError, struct.error):
            return pin
        if len(self._layouts) >= MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[len(msg)] = learned
        self.learned += 1
        return pin
