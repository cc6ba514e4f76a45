"""A read's per-packet-in work in one call each: the reader's decoding (LayoutDecoder.decode_run), the demux's
sort by category (packetin/layouts.py common_category) and its fair-share keys (AppliedToKey.keys). Each gives
what the one-by-one path it replaces gives, on mixes that take every branch; and each is checked to be the
one in use where packetin/_layout_fast.c is built (it always is under `make test`)."""

from __future__ import annotations

import asyncio
import ipaddress
import struct
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether

from packetin import wire
from packetin.demux import Demux, FairShareSettings
from packetin.fair_key import AppliedToKey, applied_to_key
from packetin.layouts import common_category, run_decoder
from packetin.model import Category, PacketIn, Userdata
from packetin.reader import PacketInReader
from tests.support.packet_in_cases import RECORDED, with_length

CAPTURE = wire.Framer().feed(
    (Path(__file__).resolve().parents[1] / "data" / "agent_udp_drop_packet_in2_stream.bin").read_bytes())
POLICY, TRACE = int(Category.POLICY), int(Category.TRACEFLOW)
MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def retyped(raw: bytes, msg_type: int) -> bytes:
    """A captured packet-in's bytes with another OpenFlow message type (byte 1): not a packet-in."""
    return raw[:1] + bytes([msg_type]) + raw[2:]


def resubtyped(raw: bytes) -> bytes:
    """Another Nicira subtype (bytes 12..16): not an NXT_PACKET_IN2, the layout's bytes otherwise."""
    return raw[:12] + struct.pack("!I", wire.NXT_PACKET_IN2 + 1) + raw[16:]


ECHO = struct.pack("!BBHI", 4, 2, 8, 7)  # OFPT_ECHO_REQUEST
# What a read may hold: the agent's packet-ins (one layout, learned after the first), recorded ones of other
# layouts, damaged copies (a truncated one, with its length fixed: DecodeError or another layout), messages that
# only look like a packet-in (another type or subtype, the bytes of a learned layout), an echo.
MESSAGES = st.one_of(
    st.sampled_from(CAPTURE[:8]),
    st.sampled_from(RECORDED),
    st.sampled_from(CAPTURE[:2]).map(lambda r: with_length(r[:-3])),
    st.sampled_from(CAPTURE[:2]).map(lambda r: retyped(r, 2)),
    st.sampled_from(CAPTURE[:2]).map(resubtyped),
    st.just(ECHO),
)


class Read:
    """A PacketInReader whose batches, controls and malformed counts are kept; `runs` off: one by one."""

    def __init__(self, runs: bool) -> None:
        self.batches: list[list[PacketIn]] = []
        self.controls: list[bytes] = []
        self.reader = PacketInReader(lambda batch, now: self.batches.append(batch), self.controls.append,
                                     wall_clock=lambda: 1.5)
        if not runs:
            self.reader._decode_run = None
        else:
            assert self.reader._decode_run is not None, "packetin._layout_fast is not built: `make setup`"

    def __call__(self, reads: list[list[bytes]]) -> tuple[Any, ...]:
        for msgs in reads:
            self.reader.on_messages(msgs)
        r = self.reader
        return self.batches, self.controls, r.malformed, r.packet_ins, r.decoder.walked, r.decoder.learned


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(MESSAGES, max_size=12), min_size=1, max_size=5))
def test_a_reads_packet_ins_decoded_in_one_call_are_those_of_one_by_one(reads):
    assert Read(runs=True)(reads) == Read(runs=False)(reads)


def test_messages_that_only_look_like_a_learned_packet_in_are_not_read_as_one():
    # Another message type or Nicira subtype with the bytes of a learned layout: the run stops there, and the
    # reader hands it on as a control message, as it does one by one.
    odd = [retyped(CAPTURE[1], 2), resubtyped(CAPTURE[2])]
    read = Read(runs=True)
    batches, controls, malformed, *_ = read([[CAPTURE[0]], [CAPTURE[1], *odd, CAPTURE[3]]])
    assert [len(b) for b in batches] == [1, 2] and controls == odd and malformed == 0
    assert read.reader._decode.__self__.counts()["fast"] == 2  # CAPTURE[1] and [3] through their layout


def test_a_flood_read_is_decoded_in_one_call():
    calls = []
    read = Read(runs=True)
    run = read.reader._decode_run

    def counted(*args: Any) -> int:
        calls.append(args[1])
        return run(*args)
    read.reader._decode_run = counted
    read([[CAPTURE[0]], CAPTURE[1:40]])
    assert calls == [0, 0] and [len(b) for b in read.batches] == [1, 39]
    assert read.batches[1] == [wire.decode_packet_in2(m, 1.5) for m in CAPTURE[1:40]]


def test_the_run_decoder_needs_the_c_reader():
    assert run_decoder(lambda raw, at: wire.decode_packet_in2(raw, at)) is None


def pin(category: int | None, *, userdata: bytes | None = None, reason: int = 0, rule_id: int = 1) -> PacketIn:
    ud = userdata if userdata is not None else Userdata(category=category or 0, rule_id=rule_id).encode()
    return PacketIn(reason=reason, table_id=0, cookie=0, in_port=1, rule_id=rule_id, reg7=0, userdata=ud,
                    packet=b"", total_len=0, received_at=0.0)


PINS = st.one_of(
    st.builds(pin, st.sampled_from([POLICY, TRACE, 7, 200])),
    st.builds(pin, st.none(), userdata=st.just(b""), reason=st.sampled_from([0, 1, 9])),  # the reason routes
    st.builds(pin, st.none(), userdata=st.sampled_from([b"\x02\x00\x00\x00\x00\x00\x01", b"\x01\x00"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PINS, max_size=8))
def test_a_reads_common_category_is_each_packet_ins_or_none(pins):
    common = common_category()
    assert common is not None, "packetin._layout_fast is not built: `make setup`"
    got = common(pins)
    categories = {p.category for p in pins}
    ours = all(p.userdata[:1] == b"\x01" and len(p.userdata) >= 7 for p in pins)
    assert got == (categories.pop() if pins and ours and len(categories) == 1 else None)


def dispatched(reads: list[list[PacketIn]], shortcut: bool) -> tuple[Any, ...]:
    async def run() -> tuple[Any, ...]:
        demux = Demux()
        if not shortcut:
            demux._common_category = None
        seen: dict[int, list[PacketIn]] = {POLICY: [], TRACE: []}
        demux.subscribe(POLICY, seen[POLICY].append, rate=1e6, burst=1e6, queue_size=6, now=0.0)
        demux.subscribe(TRACE, seen[TRACE].append, rate=3.0, burst=3.0, queue_size=100, now=0.0)
        demux.start()
        for batch in reads:
            demux.dispatch(list(batch), now=0.0)
        await demux.stop()
        return seen, demux.stats(), demux.unroutable
    return asyncio.run(run())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(PINS, max_size=8), max_size=4))
def test_dispatch_with_a_reads_common_category_counts_and_queues_as_one_by_one(reads):
    assert dispatched(reads, shortcut=True) == dispatched(reads, shortcut=False)


def test_a_one_category_read_is_not_sorted_one_by_one(monkeypatch):
    # The shortcut in use: the read goes whole to its channel without a look at each packet-in's category.
    looked: list[int] = []
    monkeypatch.setattr(PacketIn, "category", property(lambda p: looked.append(1) or p.userdata[1]))
    seen, stats, _ = dispatched([[pin(POLICY)] * 5, [pin(POLICY), pin(TRACE)]], shortcut=True)
    assert len(seen[POLICY]) == 6 and len(seen[TRACE]) == 1 and len(looked) == 2


def frame(kind: str, dst: int) -> bytes:
    if kind == "v4":
        return bytes(Ether(**MAC) / IP(src="10.0.0.1", dst=f"10.0.0.{dst}") / UDP(dport=53))
    if kind == "vlan":
        return bytes(Ether(**MAC) / Dot1Q(vlan=5) / Dot1Q(vlan=6) / IP(src="10.0.0.1", dst=f"10.9.0.{dst}") / UDP())
    if kind == "v6":
        return bytes(Ether(**MAC) / IPv6(src="fd00::1", dst=str(ipaddress.IPv6Address(f"fd00::{dst}"))) / UDP())
    if kind == "arp":
        return bytes(Ether(**MAC) / ARP())
    return bytes(Ether(**MAC) / IP(dst=f"10.0.0.{dst}"))[:20 + dst % 14]  # cut inside its IPv4 header


DIRECTIONS = {1: "egress", 2: "ingress", 3: None, 4: "both", 5: "ingress"}
KEYED = st.builds(
    lambda rule, port, kind, dst: PacketIn(reason=0, table_id=0, cookie=0, in_port=port, rule_id=rule, reg7=0,
                                           userdata=b"", packet=frame(kind, dst), total_len=0, received_at=0.0),
    st.sampled_from(sorted(DIRECTIONS)), st.sampled_from([None, 3, 4]),
    st.sampled_from(["v4", "vlan", "v6", "arp", "cut"]), st.integers(1, 3))


def keyer(fast: bool) -> tuple[AppliedToKey, list[int]]:
    asked: list[int] = []

    def direction_of(rule: int) -> str | None:
        asked.append(rule)
        return DIRECTIONS[rule]
    return AppliedToKey(direction_of, fast=fast), asked


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(KEYED, max_size=10), max_size=4))
def test_a_reads_fair_share_keys_in_c_are_the_python_keys(reads):
    fast, fast_asked = keyer(True)
    slow, slow_asked = keyer(False)
    one, _ = keyer(False)
    known: set[int] = set()  # rules whose direction the keyer has kept
    for pins in reads:
        got = fast.keys(list(pins))
        assert got == slow.keys(list(pins)) == [one(p) for p in pins]
        in_c = []  # whether C made the key: the rule's direction kept before, egress or ingress
        for p in pins:
            in_c.append(p.rule_id in known and DIRECTIONS[p.rule_id] in ("egress", "ingress"))
            if DIRECTIONS[p.rule_id]:
                known.add(p.rule_id)
        for i in range(1, len(got)):  # an equal key after one made in C is that very key
            if in_c[i - 1] and in_c[i] and got[i] == got[i - 1]:
                assert got[i] is got[i - 1]
    assert fast_asked == slow_asked  # a direction is asked for as often (an unknown one again each time)


def test_the_agents_keyer_reads_its_keys_in_c_and_a_plain_key_function_one_by_one(monkeypatch):
    key = applied_to_key(lambda rule: "ingress")
    pins = [PacketIn(0, 0, 0, 1, 9, 0, b"", frame("v4", 2), 0, 0.0)] * 3
    assert key.keys is not key._py_keys and key.keys(pins) == [(9, bytes([10, 0, 0, 2]))] * 3

    def pins_from(ports: list[int]) -> list[PacketIn]:
        return [pin(POLICY)._replace(in_port=port) for port in ports]

    async def run(key: Any) -> tuple[list[int], dict[str, int]]:
        seen: list[int] = []
        demux = Demux()
        demux.subscribe(POLICY, lambda p: seen.append(p.in_port), rate=4.0, burst=4.0, queue_size=100, now=0.0,
                        fair=FairShareSettings(key, key_rate=1.0, key_burst=2.0, max_keys=10))
        assert (demux._subs[POLICY].fair_keys is None) == (type(key) is not AppliedToKey)
        demux.start()
        demux.dispatch(pins_from([1, 1, 1, 2, 2, 1, 2, 3]), now=0.0)
        await demux.stop()
        return seen, demux.stats()[POLICY]
    # A plain key function (the keys one by one) and the agent's keyer (in C) admit the same packet-ins.
    plain = asyncio.run(run(lambda p: (p.rule_id, p.in_port)))
    called: list[int] = []
    keyer = applied_to_key(lambda rule: "egress")
    learn = AppliedToKey.__call__
    monkeypatch.setattr(AppliedToKey, "__call__", lambda self, p: called.append(1) or learn(self, p))
    assert plain == asyncio.run(run(keyer))
    assert called == [1]  # the first packet-in's key in Python (its rule's direction not yet kept), the rest in C
    assert plain[1]["dropped_fair_share"] + plain[1]["dropped_rate_limit"] > 0 and len(plain[0]) == 4


def test_the_pure_python_switch_turns_every_shortcut_off(monkeypatch):
    monkeypatch.setenv("NPAUDIT_PURE_PYTHON", "1")
    assert PacketInReader(lambda batch, now: None, lambda msg: None)._decode_run is None
    assert Demux()._common_category is None and common_category() is None
    key = applied_to_key(lambda rule: "egress")
    assert key.keys == key._py_keys
