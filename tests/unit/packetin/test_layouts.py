"""packetin.layouts: decoding by learned layout gives what the walk (packetin/wire.py) gives, or its DecodeError.

Every case decodes a message once to learn its layout, then decodes a second message of the same
length through the learned layout: the same message, one of the same layout with other values, one
of another layout, or a damaged copy (corrupted, truncated with a consistent length field). The
walk's answer on the second message is the reference; os-ken agrees with the walk (test_wire.py)
and, on the recording, with the layout path directly (checked here too). Every test runs twice: the
decoder called directly, and through its C reader (fast_decoder), which reads the learned layouts itself.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packetin import wire
from packetin.errors import DecodeError
from packetin import layouts
from packetin.layouts import MAX_LAYOUTS, PacketIn2Decoder, fast_decoder
from tests.support.packet_ins import in_port_oxm, oxm, packet_in2, prop, xreg3_oxm
from tests.support.packet_in_cases import (OSKEN_KNOWN_EXTRAS, RECORDED, fields, osken_fields, packet_in2s,
                                           with_length, without_total_len)

# 50 packet-ins as OVS 3.1 sent them to the agent for its logged UDP Drop (bench/agent_cpu.py's flood:
# a new destination port per packet), read off the bridge's .mgmt socket: the agent's real metadata.
AGENT_CAPTURE = wire.Framer().feed(
    (Path(__file__).resolve().parents[1] / "data" / "agent_udp_drop_packet_in2_stream.bin").read_bytes())

u8 = st.integers(0, 0xFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)


MODE = ["python"]


@pytest.fixture(autouse=True, scope="module", params=["python", "c"])
def mode(request: pytest.FixtureRequest) -> Any:
    MODE[0] = request.param
    yield request.param
    MODE[0] = "python"


class Decoding:
    """A PacketIn2Decoder called directly (MODE "python") or through its C reader (fast_decoder, MODE "c")."""

    def __init__(self) -> None:
        self.py = PacketIn2Decoder()
        self.call: Any = self.py
        if MODE[0] == "c":
            self.call = fast_decoder(self.py)
            assert self.call is not self.py, "packetin._layout_fast is not built: `make setup` compiles it"

    def __call__(self, raw: bytes, at: float) -> Any:
        return self.call(raw, at)

    @property
    def walked(self) -> int:
        return self.py.walked

    @property
    def learned(self) -> int:
        return self.py.learned

    def read_in_c(self) -> int | None:
        """Messages the C reader read itself, None when called directly."""
        return None if self.call is self.py else self.call.__self__.counts()["fast"]


def walk(raw: bytes, at: float = 1.5):
    """The walk's answer: the PacketIn, or DecodeError (the class, as a value)."""
    try:
        return wire.decode_packet_in2(raw, at)
    except DecodeError:
        return DecodeError


def by_layout(decoder: Decoding, raw: bytes, at: float = 1.5):
    try:
        return decoder(raw, at)
    except DecodeError:
        return DecodeError
    # anything else escapes and fails the test


def learned(raw: bytes) -> Decoding:
    decoder = Decoding()
    decoder(raw, 0.0)
    assert decoder.learned == 1
    return decoder


def ovs_like(packet: bytes, in_port: int, rule_id: int, reg7: int, cookie: int, table: int,
             userdata: bytes, full_len: int | None = None) -> bytes:
    """An NXT_PACKET_IN2 laid out as OVS sends our packet-ins."""
    props = [prop(0, packet)]
    if full_len is not None:
        props.append(prop(1, struct.pack("!I", full_len)))
    props += [prop(3, struct.pack("!B", table)), prop(4, struct.pack("!4xQ", cookie)), prop(5, struct.pack("!B", 1)),
              prop(6, in_port_oxm(in_port) + xreg3_oxm(rule_id, reg7) + oxm(0x8000, 2, struct.pack("!Q", 7))),
              prop(7, userdata)]
    return packet_in2(props, xid=7)


OVS_VALUES = st.tuples(st.binary(min_size=60, max_size=60), u32, u32, u32, u64, u8, st.binary(min_size=7, max_size=7))


@pytest.mark.parametrize("raw", RECORDED)
def test_recorded_messages_decode_alike_and_agree_with_os_ken_through_the_layout(raw):
    decoder = learned(raw)
    pin = decoder(raw, 2.0)
    assert pin == wire.decode_packet_in2(raw, 2.0)
    assert decoder.walked == 1  # the second one went through the layout
    assert without_total_len(fields(pin)) == osken_fields(raw)


def test_the_agents_captured_packet_ins_go_through_one_layout_and_agree_with_the_walk_and_os_ken():
    assert len(AGENT_CAPTURE) == 50 and len({len(raw) for raw in AGENT_CAPTURE}) == 1
    decoder = Decoding()
    pins = [decoder(raw, 5.0) for raw in AGENT_CAPTURE]
    assert decoder.walked == 1 and decoder.learned == 1  # the first learns, the other 49 are read by layout
    assert decoder.read_in_c() in (None, 49)  # through the C reader: those 49 read there
    assert pins == [wire.decode_packet_in2(raw, 5.0) for raw in AGENT_CAPTURE]
    assert [without_total_len(fields(pin)) for pin in pins] == [osken_fields(raw) for raw in AGENT_CAPTURE]
    assert len({pin.packet for pin in pins}) == 50  # each its own frame (its own destination port)


def test_every_single_byte_corruption_of_a_captured_agent_packet_in_after_learning_its_layout():
    raw = AGENT_CAPTURE[1]
    for pos in range(len(raw)):
        for value in {0x00, 0xFF, raw[pos] ^ 0x01, raw[pos] ^ 0x80, raw[pos] ^ 0x08}:
            damaged = raw[:pos] + bytes([value]) + raw[pos + 1:]
            # A fresh decoder each time: the damage meets the clean layout (a decodable one is learned in turn).
            assert by_layout(learned(AGENT_CAPTURE[0]), damaged) == walk(damaged), pos


@settings(max_examples=300, deadline=None)
@given(OVS_VALUES, OVS_VALUES)
def test_messages_of_one_layout_decode_through_it_with_their_own_values(first, second):
    decoder = learned(ovs_like(*first))
    raw = ovs_like(*second)
    assert decoder(raw, 3.0) == wire.decode_packet_in2(raw, 3.0)
    assert decoder.walked == 1
    assert fields(decoder(raw, 3.0))["rule_id"] == second[2]


@settings(max_examples=400, deadline=None)
@given(packet_in2s(), packet_in2s())
def test_generated_messages_after_any_other_agree_with_the_walk(a, b):
    (_, first), (spec, raw) = a, b
    decoder = Decoding()
    by_layout(decoder, first)
    # Give the second message the first one's length, when it can be padded to it, so that
    # the learned layout is tried on a message of another layout.
    gap = len(first) - len(raw)
    if gap >= 8 and gap % 8 == 0:
        raw = with_length(raw + prop(0xFFF0, b"\0" * (gap - 4)))
    expected = walk(raw)
    assert by_layout(decoder, raw) == expected
    assert by_layout(decoder, raw) == expected  # now learned, if it decodes
    if expected is not DecodeError:
        assert fields(expected) == spec.expected()


@settings(max_examples=300, deadline=None)
@given(packet_in2s(extras=OSKEN_KNOWN_EXTRAS, ovs_order=True), st.data())
def test_a_damaged_copy_of_a_learned_message_decodes_as_the_walk_decodes_it(case, data):
    _, raw = case
    decoder = learned(raw)
    pos = data.draw(st.integers(0, len(raw) - 1), label="pos")
    damaged = raw[:pos] + bytes([data.draw(u8, label="byte")]) + raw[pos + 1:]
    assert by_layout(decoder, damaged) == walk(damaged)
    n = data.draw(st.integers(4, len(raw)), label="cut")
    cut = with_length(raw[:n])
    assert by_layout(learned(cut) if walk(cut) is not DecodeError else decoder, cut) == walk(cut)


@pytest.mark.parametrize("raw", RECORDED)
def test_every_single_byte_corruption_of_a_learned_recorded_message(raw):
    for pos in range(len(raw)):
        for value in {0x00, 0xFF, raw[pos] ^ 0x01, raw[pos] ^ 0x80, raw[pos] ^ 0x08}:
            damaged = raw[:pos] + bytes([value]) + raw[pos + 1:]
            assert by_layout(learned(raw), damaged) == walk(damaged), pos


@pytest.mark.parametrize("raw", RECORDED)
def test_truncated_recorded_messages_after_learning_their_full_length(raw):
    decoder = learned(raw)
    for n in range(len(raw)):
        assert by_layout(decoder, raw[:n]) is DecodeError  # the length field says more
        if n >= 4:
            cut = with_length(raw[:n])
            assert by_layout(decoder, cut) == walk(cut)
            assert by_layout(decoder, cut) == walk(cut)


def test_two_layouts_of_one_length_alternate_without_mixing_their_fields():
    # Same length: one with full_len, one with an unknown property of the same size instead.
    values = (b"\x11" * 60, 5, 42, 1, 0xABC, 3, b"\x01\x00\x01\x00\x00\x00\x2a")
    with_full = ovs_like(*values, full_len=1500)
    props = [prop(0, values[0]), prop(0x4242, b"\0\0\0\0"), prop(3, b"\x03"), prop(4, struct.pack("!4xQ", 0xABC)),
             prop(5, b"\x01"), prop(6, in_port_oxm(5) + xreg3_oxm(42, 1) + oxm(0x8000, 2, struct.pack("!Q", 7))),
             prop(7, values[6])]
    unknown = packet_in2(props, xid=7)
    assert len(unknown) == len(with_full)
    decoder = Decoding()
    for raw in (with_full, unknown, with_full, unknown, unknown):
        assert decoder(raw, 1.0) == wire.decode_packet_in2(raw, 1.0)
    assert decoder(with_full, 1.0).total_len == 1500
    assert decoder(unknown, 1.0).total_len == 60


def test_a_message_without_properties_and_one_without_a_packet():
    for raw in (packet_in2([]), packet_in2([prop(7, b"\x01\x00\x01\x00\x00\x00\x2a")])):
        decoder = learned(raw)
        assert decoder(raw, 4.0) == wire.decode_packet_in2(raw, 4.0)
        assert decoder.walked == 1


def test_layouts_are_bounded():
    decoder = Decoding()
    for size in range(MAX_LAYOUTS + 5):
        raw = ovs_like(b"\x00" * (8 * size), 1, 2, 1, 3, 0, b"\x01\x00\x01\x00\x00\x00\x02")
        assert decoder(raw, 0.0) == wire.decode_packet_in2(raw, 0.0)
    assert len(decoder.py._layouts) <= MAX_LAYOUTS
    assert decoder.learned == MAX_LAYOUTS + 5
    for size in range(MAX_LAYOUTS + 5):  # again: those learned since the set started over are read by layout
        raw = ovs_like(b"\x00" * (8 * size), 1, 2, 1, 3, 0, b"\x01\x00\x01\x00\x00\x00\x02")
        assert decoder(raw, 0.0) == wire.decode_packet_in2(raw, 0.0)
    if MODE[0] == "c":
        counts = decoder.call.__self__.counts()
        assert counts["layouts"] == len(decoder.py._layouts) and counts["fast"] == MAX_LAYOUTS + 5 - decoder.walked + \
            MAX_LAYOUTS + 5


def test_the_pure_python_switch_and_a_missing_module_give_the_decoder_itself(monkeypatch, caplog):
    decoder = PacketIn2Decoder()
    monkeypatch.setenv(layouts.PURE_PYTHON_ENV, "1")
    assert fast_decoder(decoder) is decoder
    monkeypatch.delenv(layouts.PURE_PYTHON_ENV)
    monkeypatch.setattr(layouts, "LayoutDecoder", None)
    with caplog.at_level(logging.WARNING, logger="packetin.layouts"):
        assert fast_decoder(decoder) is decoder
    assert "not built" in caplog.text


def test_the_c_reader_learns_what_the_decoder_learned_before_it_was_made():
    decoder = PacketIn2Decoder()
    decoder(AGENT_CAPTURE[0], 1.0)
    read = fast_decoder(decoder)
    assert [read(raw, 2.0) for raw in AGENT_CAPTURE] == [wire.decode_packet_in2(raw, 2.0) for raw in AGENT_CAPTURE]
    if MODE[0] == "c":
        assert read.__self__.counts()["fast"] == 50  # type: ignore[attr-defined]
