"""The records of one read's packet-ins reach the audit file as one batch (one write, no thread wake-up),
and windows closing in a burst are closed together by the window timer, every record still exact."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from auditlog.aggregate import Aggregator
from auditlog.fileset import audit_files, iter_lines
from auditlog.pipeline import AuditPipeline, tick_delay
from auditlog.verify import verify
from auditlog.writer import AuditWriter
from packetin.demux import Demux
from packetin.model import Category, Disposition
from policy_agent.policy_packetins import PolicyPacketIns
from tests.support.audit_pipeline import Writer, context, pin, udp_to
from tests.support.waiting import eventually

HANG_GUARD = 5.0  # seconds: only ever reached when the behaviour is broken


def lines_of(live: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for _, p in audit_files(live) for _, _, raw in iter_lines(p)]


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


def test_one_reads_packet_ins_are_written_in_one_write_by_the_loop_thread(live):
    async def run() -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
        writer = AuditWriter(live, compress=False)
        writer.start()
        # The clock of the packet-ins' times: no window is due until close().
        pipeline = AuditPipeline(context(), writer, Aggregator(window=60.0), wall_clock=lambda: 100.0)
        demux = Demux(inline_max=64)
        demux.subscribe(int(Category.POLICY), PolicyPacketIns(lambda msg: 0, audit=pipeline), rate=1e9, burst=1e9,
                        queue_size=1000, now=0.0)
        demux.start()
        demux.dispatch([pin(udp_to(9), 99.0)], now=0.0)  # the first write (the thread's) learns the file's size
        assert writer.flush_wait(HANG_GUARD)
        writes: list[tuple[str, int]] = []
        real = writer._emit
        writer._emit = lambda text: (writes.append((threading.current_thread().name, text.count("\n") + 1)),  # type: ignore[method-assign]
                                     real(text))[1]
        demux.dispatch([pin(udp_to(port), 100.0) for port in (1, 2, 3, 1)], now=0.0)  # one read
        await pipeline.close()
        await demux.stop()
        writer.close()
        return writes, lines_of(live)

    writes, records = asyncio.run(run())
    assert writes[0] == (threading.main_thread().name, 3)  # three new keys' "first" records, one write
    assert [r["destination"]["port"] for r in records] == [9, 1, 2, 3, 1]  # the repeat closed at close()
    assert sum(r["npaudit"]["aggregate"]["packets"] for r in records) == 5
    assert verify([live]).ok


def test_windows_closing_within_the_tick_grain_close_in_one_tick_with_exact_counts():
    async def run() -> tuple[Writer, int]:
        writer = Writer()
        clock = [100.0]
        pipeline = AuditPipeline(context(), writer, Aggregator(window=0.05), wall_clock=lambda: clock[0])
        ticks = []
        real_tick = pipeline._agg.tick
        pipeline._agg.tick = lambda now: (ticks.append(now), real_tick(now))[1]  # type: ignore[method-assign]
        pipeline.start()
        for i, port in enumerate((1, 2, 3, 1, 2, 3)):  # six windows' worth, deadlines 1 ms apart
            pipeline(pin(udp_to(port), 100.0 + (i % 3) * 0.001))
        clock[0] = 100.2  # every window is due
        await eventually(lambda: len(writer.records) == 6, HANG_GUARD, lambda: f"6 records in {writer.records}")
        n = len(ticks)  # (close() flushes with one more)
        await pipeline.close()
        return writer, n

    writer, ticks = asyncio.run(run())
    assert ticks == 1  # not one wake-up per window
    assert writer.packets() == 6


def test_the_window_timer_waits_a_grain_after_a_tick_however_soon_the_next_window_closes():
    grain = 0.01
    assert tick_delay(deadline=100.0001, now=100.0, ticked=100.0) == pytest.approx(grain)  # not 0.1 ms
    assert tick_delay(deadline=100.0001, now=100.004, ticked=100.0) == pytest.approx(0.006)
    assert tick_delay(deadline=101.0, now=100.0, ticked=100.0) == pytest.approx(1.0)  # a far window: its deadline
    assert tick_delay(deadline=99.0, now=100.0, ticked=50.0) < 0  # long since the last tick: at once
    assert tick_delay(deadline=50.0, now=50.0, ticked=100.0) == pytest.approx(grain)  # clock stepped back: one grain


class BatchWriter(Writer):
    """A batching sink: the records of each hold .. release, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []  # each batch's records, by destination port
        self._open: list[int] | None = None

    def hold(self) -> None:
        self._open = []

    def submit(self, record: Any) -> bool:
        if self._open is not None:
            self._open.append(record.record()["destination"]["port"])
        return super().submit(record)

    def release(self) -> None:
        if self._open is not None:
            self.batches.append(self._open)
        self._open = None


def test_windows_due_when_a_read_ends_are_closed_in_that_reads_write_and_the_timer_sleeps_past_them():
    """A read's end closes the windows due (a read of Allows opens none, so nothing else would), and the
    timer, whose window a new key's packet-in closed, sleeps towards the next one, not the closed one."""
    allow = int(Disposition.ALLOW)
    reads = ((100.0, (1, 1), 1), (101.5, (2,), allow), (102.0, (3, 3), 1), (103.5, (4,), 1))

    async def run() -> tuple[BatchWriter, list[float | None]]:
        writer = BatchWriter()
        clock = [100.0]
        pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=lambda: clock[0],
                                 window_slack=0.025)
        pipeline.start()
        untils = []
        for at, ports, disposition in reads:
            clock[0] = at
            pipeline.begin_batch()
            for port in ports:
                pipeline(pin(udp_to(port), at, disposition))
            pipeline.end_batch()
            for _ in range(3):  # the timer's turns: it recomputes what it sleeps towards
                await asyncio.sleep(0)
            untils.append(pipeline._timer_until)
        await pipeline.close()
        return writer, untils

    writer, untils = asyncio.run(run())
    # Port 1's repeat is in the write of the read of Allows that came after its window; port 3's in port 4's.
    assert writer.batches == [[1], [2, 1], [3], [3, 4]]
    assert untils == [101.0, None, 103.0, 104.5]
    assert writer.packets() == 6


def test_with_a_slack_the_timer_still_closes_windows_when_no_read_comes():
    async def run() -> Writer:
        writer = Writer()
        pipeline = AuditPipeline(context(), writer, Aggregator(window=0.05), window_slack=0.03)
        pipeline.start()
        now = time.time()
        for port in (1, 1, 2, 2, 2):
            pipeline(pin(udp_to(port), now))
        await eventually(lambda: len(writer.records) == 4, HANG_GUARD, lambda: f"4 records in {writer.records}")
        await pipeline.close()
        return writer

    writer = asyncio.run(run())
    assert writer.packets() == 5


def test_the_window_timer_does_not_wake_itself_after_its_own_tick():
    async def run() -> tuple[list[str], Writer]:
        writer = Writer()
        clock = [100.0]
        pipeline = AuditPipeline(context(), writer, Aggregator(window=0.01), wall_clock=lambda: clock[0])
        events: list[str] = []
        real_tick = pipeline._agg.tick
        pipeline._agg.tick = lambda now: (events.append("tick"), real_tick(now))[1]  # type: ignore[method-assign]
        pipeline.start()
        wake = pipeline._wake
        assert wake is not None
        real_set = wake.set
        wake.set = lambda: (events.append("wake"), real_set())[1]  # type: ignore[method-assign]
        for _ in range(2):
            pipeline(pin(udp_to(1), 100.0))  # a "first" and a repeat: the window holds one packet
        for _ in range(3):  # the timer's turns: it goes to sleep towards the window's end (10 ms)
            await asyncio.sleep(0)
        clock[0] = 100.5  # due by the time that sleep ends
        await eventually(lambda: len(writer.records) == 2, HANG_GUARD, lambda: f"2 records in {writer.records}")
        for _ in range(3):
            await asyncio.sleep(0)
        await pipeline.close()
        return events, writer

    events, writer = asyncio.run(run())
    tick = events.index("tick")
    after = events[tick + 1:]
    # Between its tick and close()'s flush: no wake of its own for the window it just closed.
    assert after[:after.index("tick")] == [], events
    assert writer.packets() == 2


def test_a_read_that_closes_the_timers_window_moves_its_alarm_without_waking_it():
    """The timer sleeps towards window A; a read closes A and leaves B open: the timer's alarm moves to B's
    end and its task sleeps on (waking it would be a loop turn a read), then B closes at its alarm."""
    async def run() -> tuple[list[str], Writer, list[float | None]]:
        writer = Writer()
        clock = [100.0]
        pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=lambda: clock[0])
        pipeline.start()
        wake = pipeline._wake
        assert wake is not None
        events: list[str] = []
        real_set = wake.set
        wake.set = lambda: (events.append("wake"), real_set())[1]  # type: ignore[method-assign]
        untils = []
        for at, port in ((100.0, 1), (100.5, 2)):  # window A ends at 101.0, B at 101.5
            clock[0] = at
            pipeline(pin(udp_to(port), at, 1))
            pipeline(pin(udp_to(port), at, 1))  # a repeat: the window's record comes when it closes
            for _ in range(3):
                await asyncio.sleep(0)
        untils.append(pipeline._timer_until)
        events.clear()
        clock[0] = 101.2  # A due, B not
        pipeline.begin_batch()
        pipeline(pin(udp_to(3), 101.2, 1))
        pipeline.end_batch()
        for _ in range(3):
            await asyncio.sleep(0)
        untils.append(pipeline._timer_until)
        woken = list(events)
        clock[0] = 101.6  # B due by the time its alarm rings (~0.3 s from now)
        await eventually(lambda: writer.packets() == 5, HANG_GUARD, lambda: f"5 packets in {writer.records}")
        await pipeline.close()
        return woken, writer, untils

    woken, writer, untils = asyncio.run(run())
    assert untils == [101.0, 101.5]
    assert woken == [], "the timer's task was woken for a window the read closed"
    assert writer.packets() == 5
