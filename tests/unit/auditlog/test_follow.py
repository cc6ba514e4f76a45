"""`npaudit logs --follow` against the real AuditWriter rotating and gzipping while it reads."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from io import StringIO
from pathlib import Path
from typing import Iterator

import pytest

from auditlog.chain import RecordText
from auditlog.fileset import audit_files
from auditlog.follow import Follower, position_at_end
from auditlog.logs_command import LogsRequest, run_logs
from auditlog.query import Filter, Query
from auditlog.writer import AuditWriter
from tests.support.audit_records import sample_record
from tests.support.waiting import wait_for

NOW = dt.datetime(2024, 5, 2, tzinfo=dt.timezone.utc)
MAX_BYTES = 6000  # about eight records per file: a rotation every few records


class Sink:
    """A thread-safe binary stream that counts the lines written to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data = bytearray()

    def write(self, data: bytes) -> int:
        with self._lock:
            self._data += data
        return len(data)

    def flush(self) -> None:
        pass

    def seqs(self) -> list[int]:
        with self._lock:
            data = bytes(self._data)
        return [json.loads(line)["npaudit"]["seq"] for line in data.splitlines()]


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[AuditWriter]:
    w = AuditWriter(tmp_path / "audit.jsonl", max_bytes=MAX_BYTES, backup_count=1000, max_age_days=0)
    w.start()
    yield w
    w.close(10)


def write(w: AuditWriter, first: int, count: int, pause: float = 0.0) -> None:
    for i in range(first, first + count):
        assert w.submit(RecordText.of(sample_record(i)))
        if pause:
            time.sleep(pause)
    assert w.flush_wait(10)


@pytest.mark.parametrize("history", [{"last": 5}, {}], ids=["last-5-then-follow", "from-the-end"])
def test_follow_sees_every_record_once_across_rotation_and_compression(writer, tmp_path, history):
    write(writer, 0, 20)
    assert writer.wait_compressed(10)
    sink, err, stop = Sink(), StringIO(), threading.Event()
    req = LogsRequest(paths=[tmp_path], follow=True, output="json", **history)
    follower = threading.Thread(target=run_logs, kwargs=dict(req=req, out=sink, err=err, now=NOW, tty=False,
                                                              colour=False, stop=stop))
    follower.start()
    try:
        first = 16 if history else 21
        if history:
            wait_for(lambda: sink.seqs() == list(range(16, 21)))
        else:
            time.sleep(0.3)  # let it take its position at the end before anything new is written
        rotations = writer.stats["rotations"]
        write(writer, 20, 200, pause=0.002)  # a writer thread of its own, while the follower polls
        assert writer.wait_compressed(10)
        wait_for(lambda: len(sink.seqs()) >= 220 - first + 1,
                 what=lambda: f"seqs {first}..220 shown; missing: {sorted(set(range(first, 221)) - set(sink.seqs()))}"
                              f", follower alive: {follower.is_alive()}, stderr: {err.getvalue()!r}")
    finally:
        stop.set()
        follower.join(10)
    assert not follower.is_alive()
    assert writer.stats["rotations"] - rotations >= 20, "the live file was rotated many times meanwhile"
    assert all(p.name.endswith(".gz") for i, p in audit_files(writer.path) if i)
    assert sink.seqs() == list(range(first, 221)), "a record missed or shown twice"
    assert err.getvalue() == ""


def test_follow_filters_new_records(writer, tmp_path):
    sink, stop = Sink(), threading.Event()
    query = Query([Filter("disposition", "drop"), Filter("namespace", "kube-system", negated=True)])
    follower = Follower(writer.path, query, position_at_end(writer.path))  # no file yet: waits for it
    thread = threading.Thread(target=follower.run, args=(lambda m: sink.write(b"".join(r + b"\n" for r, _ in m)),
                                                         stop, 0.01))
    thread.start()
    try:
        write(writer, 0, 80, pause=0.001)
        records = [sample_record(i) for i in range(80)]
        expected = [i + 1 for i, r in enumerate(records) if r["npaudit"]["disposition"] == "Drop"
                    and "kube-system" not in (r["npaudit"]["source"]["pod"]["namespace"],
                                              r["npaudit"].get("destination", {}).get("pod", {}).get("namespace"))]
        wait_for(lambda: sink.seqs() == expected)
    finally:
        stop.set()
        thread.join(10)
        follower.close()


def test_a_follower_started_before_the_first_file_shows_records_rotated_before_its_first_look(writer):
    # Started on a node with no audit file yet: every record is new, also those that a
    # rotation (and gzip) moved away before the follower first found the set.
    follower = Follower(writer.path, Query(), position_at_end(writer.path))
    try:
        write(writer, 0, 60)
        assert writer.wait_compressed(10)
        assert sum(1 for i, _ in audit_files(writer.path) if i) > 3
        got = [json.loads(raw)["npaudit"]["seq"] for raw, _ in follower.poll()]
        assert got == list(range(1, 61))
    finally:
        follower.close()


def test_a_follower_that_misses_several_rotations_reads_them_from_the_gzip_files(writer):
    write(writer, 0, 10)
    follower = Follower(writer.path, Query(), position_at_end(writer.path))
    try:
        assert follower.poll() == []
        write(writer, 10, 100)  # a dozen rotations between two polls
        assert writer.wait_compressed(10)
        assert sum(1 for i, p in audit_files(writer.path) if i and p.name.endswith(".gz")) > 10
        got = [json.loads(raw)["npaudit"]["seq"] for raw, _ in follower.poll()]
        assert got == list(range(11, 111))
        write(writer, 110, 3)
        assert [json.loads(raw)["npaudit"]["seq"] for raw, _ in follower.poll()] == [111, 112, 113]
        assert follower.notes == []
    finally:
        follower.close()


def test_records_removed_by_retention_before_they_were_read_are_noted(tmp_path):
    w = AuditWriter(tmp_path / "audit.jsonl", max_bytes=MAX_BYTES, backup_count=2, max_age_days=0)
    w.start()
    try:
        write(w, 0, 5)
        follower = Follower(w.path, Query(), position_at_end(w.path))
        write(w, 5, 100)
        assert w.wait_compressed(10)
        got = [json.loads(raw)["npaudit"]["seq"] for raw, _ in follower.poll()]
        follower.close()
    finally:
        w.close(10)
    # The file it held open is read to its end; then the gap, then the oldest records still kept.
    gap = next(i for i in range(1, len(got)) if got[i] != got[i - 1] + 1)
    assert got[:gap] == list(range(6, got[gap - 1] + 1)) and got[gap:] == list(range(got[gap], 106))
    assert follower.notes == [f"records {got[gap - 1] + 1}-{got[gap] - 1} were removed (retention) "
                              "before they could be read"]


def test_a_partial_line_is_shown_only_once_it_is_complete(tmp_path):
    live = tmp_path / "audit.jsonl"
    line = json.dumps({**sample_record(0), "npaudit": {**sample_record(0)["npaudit"], "seq": 1}}).encode()
    live.write_bytes(line[:50])
    follower = Follower(live, Query(), position_at_end(live))
    try:
        assert follower.poll() == []
        with open(live, "ab") as f:
            f.write(line[50:] + b"\n")
        assert [raw for raw, _ in follower.poll()] == [line]
    finally:
        follower.close()
