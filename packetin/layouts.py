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

`fast_decoder(decoder)` gives the reader the same decoding with the per-message work in C
(packetin/_layout_fast.c: the layouts `decoder` learns, read without a Python call; every other
message goes to `decoder`): ~0.13 µs a packet-in against ~0.89 warm (best of 5, the agent's
capture). NPAUDIT_PURE_PYTHON=1, or a module that was not built, gives `decoder` itself.
"""

from __future__ import annotations

import logging
import os
import struct
from operator import itemgetter
from typing import Any, Callable, cast

from packetin.model import Flags, PacketIn
from packetin.registers import USERDATA_LENGTH, USERDATA_VERSION
from packetin.wire import OFPT_EXPERIMENTER, PACKET_IN2_EXPERIMENTER, Slot, decode_packet_in2

try:
    from packetin._layout_fast import LayoutDecoder
    from packetin._layout_fast import common_category as _c_common_category
    from packetin._layout_fast import logged_run_end as _c_logged_run_end
except ImportError:  # not built (no compiler at install time): fast_decoder says so
    LayoutDecoder = None  # type: ignore[assignment,misc]
    _c_logged_run_end = None  # type: ignore[assignment]
    _c_common_category = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
# Set (to anything but "" or "0") to run the per-packet work in pure Python (auditlog/record_fast.py's switch
# too): to measure what the C parts save, and for the tests of the path a machine without a compiler takes.
PURE_PYTHON_ENV = "NPAUDIT_PURE_PYTHON"


def pure_python() -> bool:
    """Whether NPAUDIT_PURE_PYTHON asks for the per-packet work in pure Python (read when a part is built)."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")

# PacketIn's fields when the walk did not read them (the walk's own defaults); total_len
# defaults to the packet's length, which a layout fixes.
_DEFAULTS: dict[int, Any] = {0: 0, 1: 0, 2: 0, 3: None, 4: 0, 5: 0, 6: b""}
_PACKET, _TOTAL_LEN, _RECEIVED_AT = 7, 8, 9
MAX_LAYOUTS = 64  # lengths remembered; a full set starts over

_new_packet_in: Callable[..., PacketIn] = tuple.__new__
# packetin/_layout_fast.c's field kinds, and the byte size of each integer code a walk's slot has.
_F_UINT, _F_BYTES, _F_CONST, _F_PACKET, _F_RECEIVED_AT = range(5)
_SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8}


class Layout:
    """How to read a message of one learned layout (see the module's docstring)."""

    __slots__ = ("unpack", "headers", "expected", "pick", "consts", "packet_start", "packet_end", "c_spec")

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
        learned = self.unpack(msg)
        self.expected = self.headers(learned)
        # The same layout for packetin/_layout_fast.c: the steering headers with their learned values, and
        # per PacketIn field (F_UINT, offset, size), (F_BYTES, offset, size), (F_CONST, value), (F_PACKET,)
        # or (F_RECEIVED_AT,).
        headers = [(items[i][0], _SIZES[items[i][1]], learned[i]) for i in header_index]
        fields: list[tuple] = []
        for o in order:
            if o == -2:
                fields.append((_F_PACKET,))
            elif o == -1:
                fields.append((_F_RECEIVED_AT,))
            elif o >= n:
                fields.append((_F_CONST, consts[o - n]))
            else:
                off, code, _ = items[o]
                fields.append((_F_UINT, off, _SIZES[code]) if code in _SIZES else (_F_BYTES, off, int(code[:-1])))
        self.c_spec = (len(msg), headers, fields, self.packet_start, self.packet_end)


class PacketIn2Decoder:
    """decode_packet_in2 with learned layouts: call it as the function (same values, same errors)."""

    __slots__ = ("_layouts", "learned", "walked", "_c")

    def __init__(self) -> None:
        self._layouts: dict[int, Layout] = {}
        self.learned = 0  # layouts learned (a message walked whose length had none or another)
        self.walked = 0  # messages decoded by the walk
        self._c: Any = None  # a _layout_fast.LayoutDecoder told every layout learned (fast_decoder)

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
            if self._c is not None:
                self._c.clear()
        self._layouts[len(msg)] = learned
        if self._c is not None:
            self._c.learn(*learned.c_spec)
        self.learned += 1
        return pin


def fast_decoder(decoder: PacketIn2Decoder) -> Callable[[bytes, float], PacketIn]:
    """`decoder` with the messages of its learned layouts read in C (packetin._layout_fast.LayoutDecoder, which
    hands every other message to `decoder`, and `decoder` tells it each layout it learns) where the module is
    built and NPAUDIT_PURE_PYTHON is not set; else `decoder` itself, with a warning in the log where the module
    is missing. The same PacketIn (or DecodeError) either way."""
    if pure_python():
        return decoder
    if LayoutDecoder is None:
        log.warning("packetin._layout_fast is not built (was there no C compiler when npaudit was installed?): "
                    "packet-ins are decoded in pure Python, about a µs more CPU each; `make setup` builds it")
        return decoder
    c = LayoutDecoder(PacketIn, decoder)
    decoder._c = c
    for layout in decoder._layouts.values():
        c.learn(*layout.c_spec)
    return cast("Callable[[bytes, float], PacketIn]", c.decode)


def run_decoder(decode: Callable[[bytes, float], PacketIn]
                ) -> Callable[[list[bytes], int, float, list[PacketIn]], int] | None:
    """decode_run(msgs, start, received_at, out) for `decode` (fast_decoder's) when it is the C decoder, else None:
    the packet-ins of learned layouts from msgs[start] on are read as `decode` reads them and appended to `out`,
    up to the first message that is anything else (another message, or one to walk or learn: the caller hands it
    on as before); that message's index. A read's packet-ins in one call (packetin/reader.py)."""
    c = getattr(decode, "__self__", None)
    if LayoutDecoder is None or not isinstance(c, LayoutDecoder):
        return None
    run = c.decode_run

    def decode_run(msgs: list[bytes], start: int, received_at: float, out: list[PacketIn]) -> int:
        return run(msgs, start, received_at, out, OFPT_EXPERIMENTER, PACKET_IN2_EXPERIMENTER)
    return decode_run


_LOG, _REJECT = int(Flags.LOG), int(Flags.REJECT)
_USERDATA_INDEX = PacketIn._fields.index("userdata")


def _py_logged_run_end(items: list[Any], start: int, end: int) -> int:
    for i in range(start, end):
        pin = items[i]
        if type(pin) is not PacketIn or type(pin.userdata) is not bytes:
            return i
        flags = pin.flags
        if flags is not None and (not flags & _LOG or flags & _REJECT):
            return i
    return end


def logged_run_end() -> Callable[[list[Any], int, int], int]:
    """run_end(items, start, end): the first index in [start, end) whose item is not a plain logged packet-in,
    else `end`. A plain logged packet-in is a PacketIn whose userdata is not ours (the reason code routed it:
    logged), or is ours with LOG set and REJECT clear. In C (packetin/_layout_fast.c) where built and
    NPAUDIT_PURE_PYTHON is not set (asked now); the same index either way."""
    c = _c_logged_run_end
    if c is None or pure_python():
        return _py_logged_run_end

    def run_end(items: list[Any], start: int, end: int) -> int:
        return c(items, start, end, PacketIn, _USERDATA_INDEX, USERDATA_VERSION, USERDATA_LENGTH, _LOG, _REJECT)
    return run_end


def common_category() -> Callable[[list[Any]], int | None] | None:
    """category_of(items): the category every item of the list has, when each is a packet-in whose userdata is
    ours (PacketIn.category: its byte 1) and all agree; else None, and the caller sorts them one by one (an empty
    list, a packet-in the reason code routes, mixed categories). In C (packetin/_layout_fast.c) where built and
    NPAUDIT_PURE_PYTHON is not set (asked now); else None: no such shortcut."""
    c = _c_common_category
    if c is None or pure_python():
        return None

    def category_of(items: list[Any]) -> int | None:
        return c(items, PacketIn, _USERDATA_INDEX, USERDATA_VERSION, USERDATA_LENGTH)
    return category_of
