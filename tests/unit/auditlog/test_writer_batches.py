"""AuditWriter.hold / release: the records of one batch of packet-ins handed over as one batch.

Between hold() and release() `submit` only collects; release() writes the batch with one write, by the
caller itself while the writer is idle (no thread wake-up), else queues it with one wake-up. Either way
the file reads the same: submission order, one chain, every record once; a close with a batch still held
writes it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from auditlog.verify import verify
from tests.support.audit_writer import lines_of, live, make_writer, record  # noqa: F401 (fixtures)

HANG_GUARD = 5.0  # seconds: only reached when the behaviour is broken


def frozen() -> float:
    return 0.0


def ids(live: Path) -> list[str]:
    return [r["event"]["id"] for r in lines_of(live)]


def writes_by_thread(writer) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    """(thread name, records) of each _emit (one write of sealed lines), in order."""
    calls: list[tuple[str, int]] = []
    real = writer._emit

    def emit(text: str) -> None:
        calls.append((threading.current_thread().name, text.count("\n") + 1))
        real(text)

    writer._emit = emit
    return calls


def test_a_held_batch_is_written_at_release_in_one_write_by_the_caller_without_waking_the_thread(live, make_writer):
    w = make_writer(live, inline_gap=0.001, monotonic=frozen)
    assert w.submit(record(0)) and w.flush_wait(HANG_GUARD)  # the first write learns the file's size
    writes = writes_by_thread(w)
    woken = []
    real_set = w._wake.set
    w._wake.set = lambda: (woken.append(1), real_set())[1]  # type: ignore[method-assign]
    w.hold()
    for i in range(1, 6):
        assert w.submit(record(i))
    assert ids(live) == ["e0"]  # collected, not written, until release
    assert w.queue_fill() == 5 / w.queue_size  # held records count against the queue
    assert w.release() == 5
    assert ids(live) == [f"e{i}" for i in range(6)]  # in the file when release returns
    assert writes == [(threading.main_thread().name, 5)] and woken == []
    w.close()
    report = verify([live])
    assert report.ok and report.records == 6


def test_a_busy_or_non_inline_writer_gets_the_batch_queued_with_one_wake_up(live, make_writer):
    w = make_writer(live, inline_gap=None)
    writes = writes_by_thread(w)
    woken = []
    real_set = w._wake.set
    w._wake.set = lambda: (woken.append(1), real_set())[1]  # type: ignore[method-assign]
    w.hold()
    for i in range(4):
        assert w.submit(record(i))
    w.hold()  # nested: only the outer release hands the batch over
    assert w.submit(record(4))
    assert w.release() == 0 and woken == []
    assert w.release() == 5 and len(woken) == 1
    assert w.flush_wait(HANG_GUARD)
    assert ids(live) == [f"e{i}" for i in range(5)]
    assert writes == [("npaudit-audit-writer", 5)]


def test_a_full_queue_counts_held_records_and_refuses_the_rest(live, make_writer):
    w = make_writer(live, queue_size=3, inline_gap=0.001, monotonic=frozen)
    w.hold()
    assert [w.submit(record(i)) for i in range(5)] == [True, True, True, False, False]
    w.release()
    assert w.flush_wait(HANG_GUARD)
    assert ids(live) == ["e0", "e1", "e2"]
    assert w.stats["dropped_queue_full"] == 2


def test_close_writes_a_batch_still_held(live, make_writer):
    w = make_writer(live, inline_gap=0.001, monotonic=frozen)
    w.hold()
    for i in range(3):
        assert w.submit(record(i))
    assert w.close()
    assert ids(live) == ["e0", "e1", "e2"]
    assert verify([live]).ok
