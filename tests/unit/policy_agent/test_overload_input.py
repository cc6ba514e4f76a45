"""Overload triggered on input pressure (full OpenFlow reads), and the grouped hand-off it enables.

The reader (packetin/reader.py) marks pressure when reads of PRESSURE_MESSAGES or more (over TCP,
each leaving the socket PRESSURE_BACKLOG full) follow one another (PRESSURE_READS of them over
PRESSURE_SUSTAIN seconds) and holds it PRESSURE_HOLD seconds; Overload then keeps at
least the ports level whatever the queues say. While the consumer is coarse the reader hands
packet-ins over in groups; Rejects and possible trace packets still go one by one through the
policy handler. Clocks are set by the test; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import time

from auditlog.aggregate import Aggregator
from auditlog.overload import FULL, PEERS, PORTS, Overload
from auditlog.pipeline import AuditPipeline
from packetin import wire
from packetin.groups import PacketInGroup
from packetin.model import Flags, PacketIn
from packetin.demux import Demux
from packetin.reader import (PRESSURE_BACKLOG, PRESSURE_HOLD, PRESSURE_MESSAGES, PRESSURE_READS, PRESSURE_SUSTAIN, InputPressure,
                             PacketInReader)
from policy_agent.policy_packetins import PolicyPacketIns
from tests.support.audit_overload import context, pin
from tests.support.audit_pipeline import Writer
from tests.support.packet_ins import AT, frame, message
from tests.support.clock import ManualClock

FLOOD = [message(frame("10.0.0.1", "10.0.0.2", "udp", port), ct_tp_dst=port) for port in range(1024, 1024 + PRESSURE_MESSAGES + 44)]


def reader(clock: ManualClock, coarse: bool = False) -> tuple[PacketInReader, list, list]:
    singles: list[PacketIn] = []
    groups: list[PacketInGroup] = []
    r = PacketInReader(lambda batch, now: singles.extend(batch), lambda raw: None, mono_clock=clock,
                       wall_clock=lambda: AT, on_groups=lambda gs, now: groups.extend(gs), coarse=lambda: coarse)
    return r, singles, groups


def test_full_reads_sustained_are_input_pressure_until_the_hold_runs_out() -> None:
    clock = ManualClock(100.0)
    r, singles, _ = reader(clock)
    r.on_messages(FLOOD[:PRESSURE_MESSAGES - 1])
    assert not r.input_pressed()
    for _ in range(PRESSURE_READS - 1):
        r.on_messages(FLOOD[:PRESSURE_MESSAGES])
        clock.now += PRESSURE_SUSTAIN * 0.6
    assert not r.input_pressed(), "fewer than PRESSURE_READS full reads: a catch-up"
    r.on_messages(FLOOD[:PRESSURE_MESSAGES])
    assert r.input_pressed() and r.pressed_reads == PRESSURE_READS
    clock.now += PRESSURE_HOLD * 0.9
    assert r.input_pressed()
    clock.now += PRESSURE_HOLD * 0.2
    assert not r.input_pressed()
    assert len(singles) == (PRESSURE_READS + 1) * PRESSURE_MESSAGES - 1 and r.grouped == 0, "not coarse: one by one"


def test_many_full_reads_within_a_moment_are_no_pressure() -> None:
    clock = ManualClock(100.0)
    r, _, _ = reader(clock)
    for _ in range(2 * PRESSURE_READS):
        r.on_messages(FLOOD[:PRESSURE_MESSAGES])
        clock.now += PRESSURE_SUSTAIN / (4 * PRESSURE_READS)
    assert not r.input_pressed(), "full reads for less than PRESSURE_SUSTAIN"


def test_a_catch_up_of_full_reads_ended_by_a_short_one_is_no_pressure() -> None:
    """A busy node takes the agent off the CPU for a while: the backlog comes in a few full reads,
    then reads are short again. That is no overload: full detail stays."""
    clock = ManualClock(100.0)
    r, _, _ = reader(clock)
    for _ in range(PRESSURE_READS - 1):
        r.on_messages(FLOOD[:PRESSURE_MESSAGES])
        clock.now += PRESSURE_SUSTAIN
    r.on_messages(FLOOD[:2])  # caught up
    clock.now += PRESSURE_SUSTAIN
    r.on_messages(FLOOD[:PRESSURE_MESSAGES])  # a new run starts from here
    assert not r.input_pressed() and r.pressed_reads == PRESSURE_READS


def test_full_reads_that_leave_the_tcp_socket_mostly_empty_are_no_pressure() -> None:
    """An agent keeping up with a flood on a slow machine: reads of 512+ for a long while, but each
    takes most of what had come (measured: at most 0.46 of the buffer left, p50 0.12). OVS's queue
    behind the socket is not filling, so full detail stays."""
    clock = ManualClock(100.0)
    r, _, _ = reader(clock)
    for i in range(4 * PRESSURE_READS):
        r.on_messages(FLOOD[:PRESSURE_MESSAGES], (0.12, 0.46)[i % 2])
        clock.now += PRESSURE_SUSTAIN
    assert not r.input_pressed() and r.pressed_reads == 0


def test_full_reads_that_leave_the_tcp_socket_half_full_are_pressure_and_a_drained_one_ends_the_run() -> None:
    clock = ManualClock(100.0)
    r, _, _ = reader(clock)
    for _ in range(PRESSURE_READS - 1):
        r.on_messages(FLOOD[:PRESSURE_MESSAGES], PRESSURE_BACKLOG)
        clock.now += PRESSURE_SUSTAIN
    r.on_messages(FLOOD[:PRESSURE_MESSAGES], PRESSURE_BACKLOG * 0.9)  # this one drained it: caught up
    r.on_messages(FLOOD[:PRESSURE_MESSAGES], 0.8)  # a new run starts from here
    assert not r.input_pressed() and r.pressed_reads == PRESSURE_READS
    for _ in range(PRESSURE_READS - 1):
        clock.now += PRESSURE_SUSTAIN
        r.on_messages(FLOOD[:PRESSURE_MESSAGES], 0.8)
    assert r.input_pressed() and r.pressed_reads == 2 * PRESSURE_READS - 1
    r.on_messages(FLOOD[:PRESSURE_MESSAGES - 1], 0.9)
    assert r.pressed_reads == 2 * PRESSURE_READS - 1, "fewer messages than PRESSURE_MESSAGES: not full, however full the socket"


def test_input_pressure_holds_overload_at_ports_while_the_queues_look_empty() -> None:
    backlog, pressed = [0.0], [False]
    ov = Overload(lambda: backlog[0], high_mark=0.5, peers_mark=0.8, low_mark=0.1, pressed=lambda: pressed[0])
    assert ov.update(0.0) == FULL
    pressed[0] = True
    assert [ov.update(t) for t in (1.0, 2.0)] == [PORTS, PORTS]
    backlog[0] = 0.9
    assert ov.update(3.0) == PEERS, "the queues still decide past the peers mark"
    backlog[0] = 0.0
    assert ov.update(4.0) == PEERS, "pressure counts as the high mark: PEERS holds while it lasts"
    pressed[0] = False
    assert ov.update(5.0) == FULL
    assert ov.entered == 1 and ov.pressed_updates == 3  # at 1.0, 2.0 and 4.0


def test_the_spells_input_pressure_began_are_counted_apart_from_those_a_queue_began() -> None:
    """npaudit_audit_overload_entered_pressed_total: why the records were coarsened, full reads or a queue."""
    backlog, pressed = [0.0], [False]
    ov = Overload(lambda: backlog[0], high_mark=0.5, peers_mark=0.8, low_mark=0.1, pressed=lambda: pressed[0])
    backlog[0] = 0.6
    assert ov.update(1.0) == PORTS  # a queue's fill
    pressed[0] = True
    assert ov.update(2.0) == PORTS  # pressure while already coarse: no new spell
    backlog[0], pressed[0] = 0.0, False
    assert ov.update(3.0) == FULL
    pressed[0] = True
    assert ov.update(4.0) == PORTS  # full reads, the queues empty
    backlog[0] = 0.6
    assert ov.update(5.0) == PORTS
    stats = ov.stats(6.0)
    assert (stats.entered, stats.entered_pressed) == (2, 1)


def test_full_reads_are_no_pressure_while_the_categorys_admission_turns_the_excess_away() -> None:
    """A flood the token bucket cuts to its rate cannot overload the pipeline: the few admitted
    records keep their detail (tests/e2e/test_fairness_e2e.py lost every quiet Pod's record
    to coarsening without this)."""
    clock, pressed = ManualClock(100.0), [True]
    demux = Demux()
    demux.subscribe(0, lambda pins: None, rate=10, burst=2, queue_size=100, now=clock.now)
    pressure = InputPressure(lambda: pressed[0], lambda: demux.admission_drops(0), mono_clock=clock)
    assert pressure(), "pressed and nothing turned away: pressure"
    demux.dispatch([pin("10.0.0.1", 1000 + i, 53, clock.now) for i in range(5)], clock.now)  # 2 in, 3 over the rate
    assert demux.admission_drops(0) == 3
    assert not pressure()
    clock.now += PRESSURE_HOLD * 0.9
    assert not pressure(), "admission limited within the hold"
    clock.now += PRESSURE_HOLD * 0.2
    assert pressure(), "the bucket has stopped dropping: the reads' pressure counts again"
    pressed[0] = False
    assert not pressure()


def test_while_coarse_the_reader_hands_over_groups_with_every_packet_in_counted() -> None:
    clock = ManualClock(100.0)
    r, singles, groups = reader(clock, coarse=True)
    vlan = message(frame("10.0.0.1", "10.0.0.2", "udp", 5, vlan=True))
    r.on_messages(FLOOD[:100] + [vlan])
    assert [g.size for g in groups] == [100] and singles == [wire.decode_packet_in2(vlan, AT)]
    assert r.packet_ins == 101 and r.grouped == 100


class Audit:
    def __init__(self) -> None:
        self.pins: list[PacketIn] = []
        self.groups: list[PacketInGroup] = []

    def __call__(self, pin: PacketIn) -> None:
        self.pins.append(pin)

    def handle_group(self, group: PacketInGroup) -> None:
        self.groups.append(group)


def test_the_policy_handler_passes_a_logged_drop_group_whole_and_rejects_one_by_one() -> None:
    sent: list = []
    audit, tap = Audit(), []
    ppi = PolicyPacketIns(sent.append, audit=audit, tap=tap.append, suppress=lambda pin: False,
                          may_suppress=lambda: False)
    drops = PacketInGroup(wire.decode_packet_in2(FLOOD[0], AT), FLOOD[:10])
    ppi.handle_group(drops)
    assert audit.groups == [drops] and not audit.pins and not sent
    assert tap == drops.packet_ins(), "a handler without handle_group gets each packet-in"
    rejects = [message(frame("10.0.0.1", "10.0.0.2", "tcp", port), flags=int(Flags.LOG | Flags.REJECT), reg7=2)
               for port in (80, 81, 82)]
    ppi.handle_group(PacketInGroup(wire.decode_packet_in2(rejects[0], AT), rejects))
    assert len(sent) == 3 and ppi.answered == 3, "every rejected packet-in is answered"
    assert audit.pins == [wire.decode_packet_in2(m, AT) for m in rejects]


def test_while_a_trace_may_be_running_grouped_packet_ins_meet_the_trace_check_one_by_one() -> None:
    audit, seen = Audit(), []

    def suppress(pin: PacketIn) -> bool:
        seen.append(pin)
        return pin.packet == FLOOD[3][20:20 + len(pin.packet)]

    ppi = PolicyPacketIns(lambda msg: 0, audit=audit, suppress=suppress, may_suppress=lambda: True)
    ppi.handle_group(PacketInGroup(wire.decode_packet_in2(FLOOD[0], AT), FLOOD[:6]))
    assert len(seen) == 6 and len(audit.pins) == 5 and not audit.groups


def test_coarse_and_idle_the_pipeline_comes_back_to_full_detail_without_a_packet_in() -> None:
    """Input pressure ends with the flood: no packet-in comes to look at the backlog again,
    so the window timer does (every half second while coarse with no window open)."""
    backlog = [0.9]

    async def main() -> tuple[bool, bool]:
        pipe = AuditPipeline(context(), Writer(), Aggregator(window=0.05),
                             overload=Overload(lambda: backlog[0], high_mark=0.5, peers_mark=0.8, low_mark=0.1))
        pipe.start()
        pipe(pin("10.0.0.1", 40000, 53, time.time()))
        await asyncio.sleep(0.2)  # its window closed; the backlog still high
        coarse_then = pipe.coarse
        backlog[0] = 0.0
        await asyncio.sleep(0.8)
        coarse_after = pipe.coarse
        await pipe.close()
        return coarse_then, coarse_after

    assert asyncio.run(main()) == (True, False)
