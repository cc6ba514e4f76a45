"""AuditWriter's inline path: a lone record sealed and appended by `submit` itself, the rest by the thread.

Which path a record takes is decided by the writer's state (thread busy, queue, rotation
due, a failed write held) and by the gap since the previous record (an injected clock
here); the file must read the same either way: submission order, one chain, every record
once, rotation at the size, a full disk retried by the thread.
"""

from __future__ import annotations

import errno
import json
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from auditlog import rotation as rotation_mod
from auditlog.chain import RecordText
from auditlog.fileset import audit_files
from auditlog.verify import verify
from auditlog.writer import AuditWriter
from tests.support.audit_writer import lines_of, live, make_writer, record, whole_records  # noqa: F401 (fixtures)

HANG_GUARD = 5.0  # seconds: only reached when the behaviour is broken


def frozen() -> float:
    """The writer's monotonic clock, stopped: no write ever looks slow (see the back-off test)."""
    return 0.0


class WriteThreads:
    """Which thread ran each `_emit_records` (the sealing and writing), in order, by record id."""

    def __init__(self, writer: AuditWriter) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        real = writer._emit_records

        def emit_records(records: list[RecordText]) -> None:
            ids = [json.loads(r.body(0))["event"]["id"] for r in records]
            self.calls.append((threading.current_thread().name, ids))
            real(records)

        writer._emit_records = emit_records  # type: ignore[method-assign]

    def by(self, thread: str) -> list[str]:
        return [i for name, ids in self.calls if name == thread for i in ids]


def ids(live: Path) -> list[str]:
    return [r["event"]["id"] for r in lines_of(live)]


def seqs(live: Path) -> list[int]:
    return [r["npaudit"]["seq"] for r in lines_of(live)]


MAIN = threading.main_thread().name
THREAD = "npaudit-audit-writer"


def test_a_lone_record_is_written_by_submit_itself_and_the_thread_is_not_woken(live, make_writer):
    w = make_writer(live, inline_gap=0.0, monotonic=frozen)
    seen = WriteThreads(w)
    assert w.submit(record(0)) and w.flush_wait(HANG_GUARD)  # the first write learns the file's size: thread
    woken = []
    real_set = w._wake.set
    w._wake.set = lambda: (woken.append(1), real_set())[1]  # type: ignore[method-assign]
    for i in range(1, 4):
        assert w.submit(record(i))
        assert ids(live)[-1] == f"e{i}"  # in the file when submit returns: no thread, no flush
    assert woken == []
    assert seen.by(MAIN) == ["e1", "e2", "e3"] and seen.by(THREAD) == ["e0"]
    assert w.stats["written"] == 4 and w.stats["batches"] == 4


def test_records_closer_than_the_gap_go_to_the_thread_and_none_is_inline_when_the_gap_is_none(live, make_writer):
    clock = [100.0]
    w = make_writer(live, inline_gap=0.001, monotonic=lambda: clock[0])
    seen = WriteThreads(w)
    assert w.submit(record(0)) and w.flush_wait(HANG_GUARD)
    for i, step in ((1, 0.01), (2, 0.0005), (3, 0.0005), (4, 0.002)):
        clock[0] += step
        assert w.submit(record(i)) and w.flush_wait(HANG_GUARD)
    assert seen.by(MAIN) == ["e1", "e4"]  # a millisecond or more after the previous record
    assert seen.by(THREAD) == ["e0", "e2", "e3"]
    w.close()

    never = make_writer(live.with_name("other.jsonl"), inline_gap=None)
    seen = WriteThreads(never)
    for i in range(3):
        assert never.submit(record(i)) and never.flush_wait(HANG_GUARD)
    assert seen.by(MAIN) == [] and seen.by(THREAD) == ["e0", "e1", "e2"]


class GatedWake(threading.Event):
    """The writer thread's wake-up, held at a gate: records queue while the thread does not run."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        got = super().wait(timeout)
        self.gate.wait(HANG_GUARD)
        return got


def test_mixed_inline_and_thread_writes_keep_submission_order_and_one_chain(live, make_writer):
    w = make_writer(live, inline_gap=0.0, monotonic=frozen)
    seen = WriteThreads(w)
    assert w.submit(record(0)) and w.flush_wait(HANG_GUARD)
    assert w.submit(record(1))  # inline
    # The thread is about to be woken but does not run yet: e2 is queued because the
    # rotation lock is busy; e3 then finds the writer idle but the queue not empty, and
    # must queue behind e2 rather than be written before it.
    wake, old = GatedWake(), w._wake
    w._wake = wake
    old.set()  # the thread goes round once more and then waits on the gated wake-up
    assert wake.entered.wait(HANG_GUARD)
    with w._files_lock:
        assert w.submit(record(2))
    assert w.submit(record(3))
    assert ids(live) == ["e0", "e1"]
    wake.gate.set()
    assert w.flush_wait(HANG_GUARD)
    assert w.submit(record(4))  # idle again: inline
    # A burst from another thread while this one keeps submitting: each thread's order holds.
    other = threading.Thread(target=lambda: [w.submit(record(1000 + i)) for i in range(200)])
    other.start()
    for i in range(5, 205):
        assert w.submit(record(i))
    other.join()
    assert w.flush_wait(HANG_GUARD)
    got = ids(live)
    assert got[:5] == ["e0", "e1", "e2", "e3", "e4"]
    assert [x for x in got[5:] if int(x[1:]) < 1000] == [f"e{i}" for i in range(5, 205)]
    assert [x for x in got[5:] if int(x[1:]) >= 1000] == [f"e{i}" for i in range(1000, 1200)]
    assert seqs(live) == list(range(1, len(got) + 1))
    assert seen.by(MAIN)[:2] == ["e1", "e4"] and "e2" in seen.by(THREAD) and "e3" in seen.by(THREAD)
    w.close()
    result = verify([live.parent])
    assert result.ok and result.last_seq == 405, result


def test_rotation_is_left_to_the_thread_and_happens_at_the_size(live, make_writer, monkeypatch):
    rotated_by: list[str] = []
    real = rotation_mod.JsonlHandler.doRollover

    def rollover(self: Any) -> None:
        rotated_by.append(threading.current_thread().name)
        real(self)

    monkeypatch.setattr(rotation_mod.JsonlHandler, "doRollover", rollover)
    big = {"event": {"id": "x" * 200}, "npaudit": {"aggregate": {}}}
    w = make_writer(live, inline_gap=0.0, monotonic=frozen, max_bytes=4096, compress=False)
    seen = WriteThreads(w)
    for _ in range(60):  # ~15 KiB, one record at a time: rotations at 4 KiB
        assert w.submit(RecordText.of(big)) and w.flush_wait(HANG_GUARD)
    w.close()
    assert w.stats["rotations"] >= 3 and len(rotated_by) == w.stats["rotations"]
    assert set(rotated_by) == {THREAD}  # never on the submitting thread
    assert len(seen.by(MAIN)) > 40  # the rest were written inline
    sizes = [p.stat().st_size for index, p in audit_files(live) if index]
    assert sizes and all(4096 <= s < 4096 + 400 for s in sizes), sizes  # not carried past the size by inline appends
    assert seqs(live) == list(range(1, 61))
    assert verify([live.parent]).ok


def _fail_write(monkeypatch: pytest.MonkeyPatch, when: Callable[[], bool], partial: bool = True) -> list[str]:
    """do_write fails with ENOSPC (with `partial`, half the line reaching the disk) while `when()`;
    the threads that failed."""
    real_write = rotation_mod.JsonlHandler.do_write
    failed: list[str] = []

    def write(self: Any, msg: str) -> None:
        if not when():
            return real_write(self, msg)
        failed.append(threading.current_thread().name)
        if not partial:
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.stream is None or self.stream.closed:
            self.stream = self.do_open()
        self.stream.write(msg[: len(msg) // 2])
        self.stream.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rotation_mod.JsonlHandler, "do_write", write)
    return failed


def test_a_failed_inline_write_is_retried_by_the_thread_and_the_chain_stays_verifiable(live, make_writer,
                                                                                       monkeypatch):
    w = make_writer(live, inline_gap=0.0, monotonic=frozen)
    seen = WriteThreads(w)
    for i in range(3):
        assert w.submit(record(i)) and w.flush_wait(HANG_GUARD)
    fail = [True]
    failed = _fail_write(monkeypatch, lambda: fail[0] and threading.current_thread().name == MAIN)
    assert w.submit(record(3))  # inline; the disk refuses it; the thread takes it over
    fail[0] = False
    assert failed == [MAIN]
    assert w.flush_wait(HANG_GUARD)
    for i in range(4, 7):
        assert w.submit(record(i)) and w.flush_wait(HANG_GUARD)
    w.close()
    assert w.stats["write_errors"] == 1 and w.stats["chain_restarts"] == 1 and w.stats["lost_write_error"] == 0
    assert "e3" in seen.by(THREAD)  # the retry (resealed after the chain-restart record)
    got = whole_records(live)
    assert got[3]["event"]["action"] == "chain-restart"
    assert [r["event"]["id"] for r in got if r["event"]["action"] != "chain-restart"] == [f"e{i}" for i in range(7)]
    result = verify([live])
    assert result.ok and result.last_seq == 8, result


def test_while_the_disk_stays_full_submit_never_blocks_and_the_records_are_counted_at_close(live, monkeypatch):
    w = AuditWriter(live, inline_gap=0.0, monotonic=frozen)
    w.start()
    for i in range(2):
        assert w.submit(record(i)) and w.flush_wait(HANG_GUARD)
    failed = _fail_write(monkeypatch, lambda: True, partial=False)
    for i in range(2, 7):
        assert w.submit(record(i))  # the first fails inline and is held; the rest queue behind the retries
    assert not w.close(timeout=0.5)
    assert failed[0] == MAIN and set(failed[1:]) == {THREAD}  # retried by the thread only
    lost = w.snapshot().lost()
    assert sum(lost.values()) == 5 and set(lost) <= {"lost_write_error", "dropped_closed"}, lost
    assert w.stats["written"] == 2


def test_inline_writes_continue_one_chain_across_a_restart(live, make_writer):
    for run in range(2):
        w = make_writer(live, inline_gap=0.0, monotonic=frozen)
        for i in range(run * 5, run * 5 + 5):
            assert w.submit(record(i)) and w.flush_wait(HANG_GUARD)
        w.close()
    assert ids(live) == [f"e{i}" for i in range(10)] and seqs(live) == list(range(1, 11))
    result = verify([live])
    assert result.ok and result.last_seq == 10, result


def test_fsync_and_a_closing_writer_never_write_inline(live, make_writer):
    w = make_writer(live, inline_gap=0.0, monotonic=frozen, fsync=True)
    seen = WriteThreads(w)
    for i in range(3):
        assert w.submit(record(i)) and w.flush_wait(HANG_GUARD)
    assert seen.by(MAIN) == []
    w.close()
    assert not w.submit(record(9)) and w.stats["dropped_closed"] == 1


def test_after_a_slow_inline_write_records_go_through_the_thread_for_a_while(live, make_writer, monkeypatch):
    clock = [100.0]
    w = make_writer(live, inline_gap=0.0, monotonic=lambda: clock[0])
    seen = WriteThreads(w)
    assert w.submit(record(0)) and w.flush_wait(HANG_GUARD)
    real_write = rotation_mod.JsonlHandler.do_write

    def slow_write(self: Any, msg: str) -> None:
        if threading.current_thread().name == MAIN and '"id":"e2"' in msg:
            clock[0] += 0.05  # the page cache made this write wait (dirty pages throttled)
        real_write(self, msg)

    monkeypatch.setattr(rotation_mod.JsonlHandler, "do_write", slow_write)
    for i, step in ((1, 0.01), (2, 0.01), (3, 0.01), (4, 0.5), (5, 0.6)):
        clock[0] += step
        assert w.submit(record(i)) and w.flush_wait(HANG_GUARD)
    assert seen.by(MAIN) == ["e1", "e2", "e5"]  # e3, e4 within a second of the slow write
    assert seen.by(THREAD) == ["e0", "e3", "e4"]
    assert w.stats["inline_backoffs"] == 1  # npaudit_audit_writer_total{event="inline_backoffs"}: said, not only logged
    assert ids(live) == [f"e{i}" for i in range(6)]


def test_write_now_writes_as_a_released_batch_would_and_otherwise_leaves_everything_to_the_caller(live, make_writer):
    """write_now (a lone packet-in's record, auditlog/pipeline.py AuditPipeline.lone): written on the caller's thread
    when hold, submit_many and release would have written it inline; else False with nothing queued, pending or
    written (the caller then submits): while a batch is held, with more records than the queue takes, while the
    thread writes, and with inline writes off."""
    w = make_writer(live, inline_gap=0.0, monotonic=frozen, queue_size=3)
    seen = WriteThreads(w)
    assert w.submit(record(0)) and w.flush_wait(HANG_GUARD)  # the first write learns the file's size: thread
    assert w.write_now([record(1), record(2)])
    assert ids(live) == ["e0", "e1", "e2"] and seen.by(MAIN) == ["e1", "e2"]
    w.hold()
    assert not w.write_now([record(3)])
    assert w.release() == 0
    assert not w.write_now([record(i) for i in range(3, 7)])  # more than the queue takes
    with w._io_lock:  # the thread writing
        assert not w.write_now([record(3)])
    assert ids(live) == ["e0", "e1", "e2"] and w.queued == 0 and not w._pending
    assert w.write_now([record(3)]) and ids(live)[-1] == "e3"
    assert w.stats["written"] == 4 and verify([live]).ok

    never = make_writer(live.with_name("other.jsonl"), inline_gap=None)
    assert never.submit(record(0)) and never.flush_wait(HANG_GUARD)
    assert not never.write_now([record(1)]) and never.queued == 0
