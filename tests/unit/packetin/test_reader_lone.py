"""PacketInReader.lone: a read of one NXT_PACKET_IN2 handed to the lone sink leaves the reader's counters and its
input-pressure state as on_messages([it]) leaves them (the sink's own work is the demux's: test_lone_read.py);
a message it cannot take (not a packet-in, malformed, declined) leaves everything as it was."""

from __future__ import annotations

import random
import struct
from typing import Any

from packetin.reader import PRESSURE_MESSAGES, PacketInReader
from tests.support.packet_ins import frame, message

ECHO = struct.pack("!BBHI", 6, 2, 8, 1)  # OFPT_ECHO_REQUEST


def packet_in(port: int) -> bytes:
    return message(frame("10.0.0.1", "10.0.0.2", "udp", port), ct_tp_dst=port)


def _state(r: PacketInReader) -> tuple[Any, ...]:
    return (r.reads, r.packet_ins, r.malformed, r.last_rx, r.pressed_reads, r._full_since, r._full_reads,
            r._pressed_at, r.input_pressed())


def test_a_lone_read_leaves_the_reader_as_on_messages_does_and_a_refused_one_leaves_it_alone() -> None:
    rng = random.Random(3)
    for _ in range(40):
        clock = [10.0]
        got: dict[str, list[Any]] = {"lone": [], "read": []}
        readers = {}
        for side in ("lone", "read"):
            readers[side] = PacketInReader(lambda batch, now, s=side: got[s].extend(p.total_len for p in batch),
                                           lambda raw: None, mono_clock=lambda: clock[0], wall_clock=lambda: 5.0,
                                           lone_sink=(lambda pin, now: (got["lone"].append(pin.total_len), True)[1])
                                           if side == "lone" else None)
        lone, read = readers["lone"], readers["read"]
        lone_reads = 0
        for _ in range(rng.randrange(5, 40)):
            clock[0] += rng.choice((0.0, 0.01, 0.06, 0.6))
            kind = rng.choice(("full", "full", "one", "one", "echo", "cut"))
            if kind == "full":  # a full read: input pressure builds
                msgs = [packet_in(9)] * PRESSURE_MESSAGES
                lone.on_messages(msgs, 0.9)
                read.on_messages(msgs, 0.9)
                continue
            raw = {"one": packet_in(rng.randrange(1, 60000)), "echo": ECHO, "cut": packet_in(7)[:40]}[kind]
            before = _state(lone)
            if lone.lone(raw):
                assert kind == "one"
                lone_reads += 1
            else:
                assert kind != "one" and _state(lone) == before  # refused: nothing changed
                lone.on_messages([raw])
            read.on_messages([raw])
            assert _state(lone) == _state(read)
        assert got["lone"] == got["read"] and lone.lone_reads == lone_reads and read.lone_reads == 0


def test_a_declined_packet_in_goes_to_the_batch_sink_decoded_once_and_counted_as_on_messages_counts_it() -> None:
    taken: list[Any] = []
    decoded: list[bytes] = []
    r = PacketInReader(lambda batch, now: taken.extend(batch), lambda raw: None, lone_sink=lambda pin, now: False)
    real = r._decode
    r._decode = lambda raw, wall: (decoded.append(raw), real(raw, wall))[1]  # type: ignore[method-assign]
    assert r.lone(packet_in(9))
    assert (r.reads, r.packet_ins, r.lone_reads) == (1, 1, 0)
    assert [p.total_len for p in taken] == [len(frame("10.0.0.1", "10.0.0.2", "udp", 9))] and len(decoded) == 1
