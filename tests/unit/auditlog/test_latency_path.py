"""The low-rate path packet-in -> record in the file: no waits on a batch, a tick or another packet.

The latency itself is measured in bench/auditlog_throughput.py (--latency-only); these
tests pin down the behaviour it depends on, with injected clocks and no timing asserts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from auditlog import rotation as rotation_mod
from auditlog.aggregate import Aggregator
from auditlog.chain import RecordText
from auditlog.fileset import audit_files, iter_lines
from auditlog.pipeline import AuditPipeline
from auditlog.verify import verify
from auditlog.writer import AuditWriter
from tests.support.audit_pipeline import Writer, context, pin, udp_to
from tests.support.waiting import eventually

HANG_GUARD = 5.0  # seconds: only ever reached when the behaviour is broken


def lines_of(live: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for _, p in audit_files(live) for _, _, raw in iter_lines(p)]


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


def test_a_new_keys_first_record_is_in_the_file_with_no_further_packet_and_no_tick(live):
    async def run() -> tuple[list[dict[str, Any]], int]:
        writer = AuditWriter(live, clock=lambda: 1e9)
        writer.start()
        try:
            # The wall clock is frozen: the window of the key never closes, the timer never ticks.
            pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=lambda: 100.0)
            pipeline.start()
            pipeline(pin(udp_to(5353), 100.0))
            await eventually(lambda: live.exists() and live.read_bytes().endswith(b"\n"), HANG_GUARD,
                             "the first record of a new key to reach the file")
            held = pipeline.aggregator.snapshot().open_windows
            await pipeline.close()
            return lines_of(live), held
        finally:
            writer.close()

    records, held = asyncio.run(run())
    assert held == 1  # written while its window was still open: not by a window closing
    assert records[0]["destination"]["port"] == 5353
    assert records[0]["npaudit"]["aggregate"]["packets"] == 1


def test_the_window_timer_sleeps_through_new_keys_and_still_closes_every_window():
    async def run() -> tuple[Writer, list[bool]]:
        writer = Writer()
        clock = [100.0]
        pipeline = AuditPipeline(context(), writer, Aggregator(window=0.05), wall_clock=lambda: clock[0])
        pipeline.start()
        woken = []
        pipeline(pin(udp_to(1), 100.0))  # the timer has no deadline yet: woken
        woken.append(pipeline._wake.is_set())
        await eventually(lambda: not pipeline._wake.is_set(), HANG_GUARD)  # it sleeps until the first window closes
        for port in (2, 3, 1, 2, 3):
            pipeline(pin(udp_to(port), 100.01))  # new keys and repeats: no window closes sooner
            woken.append(pipeline._wake.is_set())
        clock[0] = 100.2  # past every deadline: the timer closes the windows with repeats
        await eventually(lambda: len(writer.records) == 6, HANG_GUARD, lambda: f"6 records in {writer.records}")
        await pipeline.close()
        return writer, woken

    writer, woken = asyncio.run(run())
    assert woken == [True, False, False, False, False, False]
    assert writer.packets() == 6


def test_new_keys_leave_the_timer_alone_while_it_sleeps_towards_an_older_window():
    # A flood of new keys opens a window per packet-in: none closes before the one the timer sleeps
    # towards, so none needs the timer looked at (it used to be, once per packet-in).
    async def run() -> tuple[Writer, int]:
        writer = Writer()
        clock = [100.0]
        pipeline = AuditPipeline(context(), writer, Aggregator(window=0.05), wall_clock=lambda: clock[0])
        pipeline.start()
        pipeline(pin(udp_to(1), 100.0))
        await eventually(lambda: not pipeline._wake.is_set(), HANG_GUARD)  # asleep towards 100.05
        pokes = []
        real = pipeline._poke_timer
        pipeline._poke_timer = lambda: pokes.append(1) or real()  # type: ignore[method-assign]
        for port in range(2, 50):
            pipeline(pin(udp_to(port), 100.01))
            pipeline(pin(udp_to(port), 100.02))  # a repeat: an aggregate when its window closes
        clock[0] = 100.2
        await eventually(lambda: len(writer.records) == 1 + 48 * 2, HANG_GUARD, "every first and aggregate")
        await pipeline.close()
        return writer, len(pokes)

    writer, pokes = asyncio.run(run())
    assert pokes == 0
    assert writer.packets() == 1 + 48 * 2


def test_a_window_opened_after_the_wall_clock_stepped_back_closes_without_waiting_for_the_old_deadline():
    async def run() -> Writer:
        writer = Writer()
        clock = [5000.0]
        # A long window: the timer first sleeps ~1000 s (real) until the old timeline's deadline.
        pipeline = AuditPipeline(context(), writer, Aggregator(window=1000.0), wall_clock=lambda: clock[0])
        pipeline.start()
        pipeline(pin(udp_to(1), 5000.0))
        await eventually(lambda: not pipeline._wake.is_set(), HANG_GUARD)
        clock[0] = 2000.0  # the clock was reset far back; the new timeline's windows end at 1010
        pipeline(pin(udp_to(2), 10.0))
        pipeline(pin(udp_to(2), 10.0))  # a repeat: its aggregate is due at 1010, long past at 2000
        await eventually(lambda: len(writer.records) == 3, HANG_GUARD,
                         "3 records (else the timer slept on the old timeline's deadline)")
        await pipeline.close()
        return writer

    assert asyncio.run(run()).packets() == 3


def test_records_after_the_first_write_are_appended_without_the_logging_machinery(live, monkeypatch):
    emits = []
    real_emit = rotation_mod.JsonlHandler.emit

    def counting_emit(self: rotation_mod.JsonlHandler, record: Any) -> None:
        emits.append(record)
        real_emit(self, record)

    monkeypatch.setattr(rotation_mod.JsonlHandler, "emit", counting_emit)
    with AuditWriter(live) as writer:
        for i in range(5):
            assert writer.submit(RecordText.of({"event": {"id": f"e{i}"}, "npaudit": {"aggregate": {}}}))
            assert writer.flush_wait(HANG_GUARD)
    assert len(emits) == 1  # the first write (it learns the file's size); the others are plain appends
    assert [r["event"]["id"] for r in lines_of(live)] == [f"e{i}" for i in range(5)]
    assert verify([live.parent]).ok


def test_appends_follow_the_live_file_when_it_is_replaced_and_rotation_still_happens(live, caplog):
    record = {"event": {"id": "x" * 200}, "npaudit": {"aggregate": {}}}
    moved = live.with_name("moved-away.jsonl")
    with AuditWriter(live, max_bytes=4096, compress=False) as writer:
        assert writer.submit(RecordText.of(record)) and writer.flush_wait(HANG_GUARD)
        live.rename(moved)  # someone else's doing
        with caplog.at_level(logging.ERROR, logger="auditlog.rotation"):
            assert writer.submit(RecordText.of(record)) and writer.flush_wait(HANG_GUARD)
        # The write that found it out (the live file is looked at after a write: auditlog/rotation.py) went
        # with the moved file, and says so; the next go to a new live file, not into the moved one.
        assert [r["npaudit"]["seq"] for r in lines_of(moved)] == [1, 2]
        assert any("the last 1 record(s)" in r.getMessage() and "moved away" in r.getMessage()
                   for r in caplog.records if r.levelno == logging.ERROR)
        assert writer.submit(RecordText.of(record)) and writer.flush_wait(HANG_GUARD)
        assert [r["npaudit"]["seq"] for r in lines_of(live)] == [3]
        for _ in range(40):  # ~10 KiB, one record a write: rotations at 4 KiB
            assert writer.submit(RecordText.of(record)) and writer.flush_wait(HANG_GUARD)
        assert writer.stats["rotations"] >= 2
    sizes = [p.stat().st_size for index, p in audit_files(live) if index]
    assert sizes and all(4096 <= s < 4096 + 400 for s in sizes), sizes  # rotated at the size, not later
    assert [r["npaudit"]["seq"] for r in lines_of(live)] == list(range(3, 44))
    assert [r["npaudit"]["seq"] for r in lines_of(moved)] == [1, 2]
