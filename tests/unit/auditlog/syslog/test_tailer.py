"""auditlog.syslog.tailer and checkpoint: seq order across rotation and gzip, resume, records lost to retention."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditlog import record_fast
from auditlog.chain import RecordText
from auditlog.fileset import GZIP_ERRORS, audit_files
from auditlog.syslog.checkpoint import Position, load_checkpoint, save_checkpoint
from auditlog.syslog.errors import CheckpointError
from auditlog.loss_records import METER, LossKey, loss_record
from auditlog.syslog.rfc5424 import FrameEncoder, Framing, Header, record_fields
from auditlog.syslog.tailer import Batch, Tailer, split_lines
from auditlog.writer import AuditWriter
from tests.support.syslog_parse import parse_message, split_octet_counted


def record(i: int) -> dict[str, Any]:
    return {"@timestamp": "2026-11-30T02:14:03.512Z", "event": {"action": "dropped", "id": f"e{i}"},
            "labels": {"log_label": 'x"]\n\u00e9' * (i % 5)}, "npaudit": {"disposition": "Drop"}}


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return tmp_path / "log" / "audit.jsonl"


@pytest.fixture
def writer(live: Path) -> Iterator[AuditWriter]:
    # ~4 KiB files: a rotation every ~20 records, compressed, 50 files kept.
    w = AuditWriter(live, max_bytes=4096, backup_count=50, max_age_days=0)
    w.start()
    yield w
    w.close()


def write(w: AuditWriter, first: int, count: int) -> None:
    for i in range(first, first + count):
        assert w.submit(RecordText.of(record(i)))
    assert w.flush_wait()


def drain(tailer: Tailer, limit: int = 1000) -> tuple[list[int], Batch]:
    """Poll until a poll returns nothing: (seqs read, the last non-empty batch)."""
    seqs: list[int] = []
    last = Batch()
    lost = skipped = 0
    for _ in range(limit):
        batch = tailer.poll(max_records=7)
        lost, skipped = lost + batch.lost, skipped + batch.skipped
        if not batch.records and not batch.lost:
            break
        seqs += [r.seq for r in batch.records]
        last = batch if batch.records else last
    return seqs, Batch(last.records, lost, skipped)


def test_reads_every_record_once_in_seq_order_across_rotation_and_gzip(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 150)
    assert writer.wait_compressed()
    assert sum(p.name.endswith(".gz") for _, p in audit_files(live)) >= 3
    seqs, _ = drain(Tailer(live))
    assert seqs == list(range(1, 151))


def test_following_a_writer_that_rotates_between_polls_misses_nothing(live: Path, writer: AuditWriter) -> None:
    tailer = Tailer(live)
    seqs: list[int] = []
    for step in range(30):
        write(writer, step * 9 + 1, 9)
        seqs += drain(tailer)[0]
    assert writer.wait_compressed()
    seqs += drain(tailer)[0]
    assert seqs == list(range(1, 271))


def test_each_record_carries_its_line_fields_and_the_position_after_it(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 3)
    batch = Tailer(live).poll()
    data = live.read_bytes().splitlines(keepends=True)
    assert [r.line for r in batch.records] == [d.rstrip(b"\n") for d in data]
    assert [r.position.offset for r in batch.records] == [len(b"".join(data[:i + 1])) for i in range(3)]
    assert [r.fields for r in batch.records] == [record_fields(json.loads(d)) for d in data]
    assert batch.end == batch.records[-1].position and batch.end.seq == 3


def test_a_loss_record_is_read_as_one_and_leaves_as_a_warning(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 2)
    assert writer.submit(RecordText.of(loss_record({LossKey("policy", METER, "policy_deny"): 5}, 1.0, 2.0)))
    write(writer, 4, 1)
    batch = Tailer(live).poll()
    assert [r.fields.loss for r in batch.records] == [False, False, True, False]
    encoder = FrameEncoder(Header(), Framing.OCTET_COUNTING)
    stream = b"".join(encoder.encode(r.fields, r.line)[0] for r in batch.records)
    messages, rest = split_octet_counted(stream)
    assert rest == b""
    assert [(m.msgid, m.severity) for m in map(parse_message, messages)] == [
        ("DROP", 4), ("DROP", 4), ("STATE", 4), ("DROP", 4)]  # the loss record at warning, as the denials


def test_resumes_after_the_checkpoint_in_the_same_file(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 10)
    first = Tailer(live).poll(max_records=4)
    assert first.end is not None
    write(writer, 11, 5)
    seqs, _ = drain(Tailer(live, first.end))
    assert seqs == list(range(5, 16))


def test_resumes_by_seq_when_the_checkpointed_file_was_rotated_and_compressed(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 5)
    end = Tailer(live).poll(max_records=3).end
    assert end is not None
    write(writer, 6, 100)  # the live file is rotated and gzipped: its inode is gone
    assert writer.wait_compressed()
    seqs, batch = drain(Tailer(live, end))
    assert seqs == list(range(4, 106)) and batch.lost == 0


def test_a_checkpoint_whose_inode_now_names_another_file_resumes_by_seq(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 40)
    assert writer.wait_compressed()
    st = live.stat()  # as if the checkpoint's inode had been freed and reused by the live file
    seqs, batch = drain(Tailer(live, Position(st.st_dev, st.st_ino, 300, 12)))
    assert seqs == list(range(13, 41)) and batch.lost == 0


def test_records_pruned_by_retention_before_they_were_read_are_counted_lost(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    with AuditWriter(live, max_bytes=4096, backup_count=2, max_age_days=0) as w:
        write(w, 1, 5)
        end = Tailer(live).poll(max_records=5).end
        write(w, 6, 200)
        assert w.wait_compressed()
    assert end is not None and end.seq == 5
    tailer = Tailer(live, end)
    seqs, batch = drain(tailer)
    assert seqs[-1] == 205 and seqs == list(range(seqs[0], 206))
    assert batch.lost == seqs[0] - 6 > 0


def test_a_line_still_being_written_is_read_once_it_is_complete(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 2)
    tailer = Tailer(live)
    assert [r.seq for r in tailer.poll().records] == [1, 2]
    writer.close()
    whole = live.read_bytes()
    line3 = json.dumps({"npaudit": {"seq": 3, "chain": "a" * 64}}).encode()
    with open(live, "ab") as f:
        f.write(line3[:10])
        f.flush()
        assert tailer.poll().records == ()
        f.write(line3[10:] + b"\n")
    assert [r.seq for r in tailer.poll().records] == [3]
    assert live.read_bytes().startswith(whole)


def test_lines_that_are_not_sealed_records_are_skipped_and_counted(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    good = [json.dumps({"npaudit": {"seq": s, "chain": "b" * 64}}).encode() for s in (1, 2)]
    live.write_bytes(good[0] + b"\nnot json\n{\"npaudit\":{}}\n" + good[1] + b"\n")
    batch = Tailer(live).poll()
    assert [r.seq for r in batch.records] == [1, 2] and batch.skipped == 2 and batch.lost == 0


def test_a_log_started_anew_below_the_checkpoint_is_read_from_its_start(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    with AuditWriter(live, max_bytes=0) as w:
        write(w, 1, 3)
    seqs, _ = drain(Tailer(live, Position(0, 0, 10_000, 500)))
    assert seqs == [1, 2, 3]


def test_no_file_yet_means_nothing_to_read_until_the_writer_starts(live: Path) -> None:
    tailer = Tailer(live)
    assert tailer.poll() == Batch()
    with AuditWriter(live) as w:
        write(w, 1, 2)
    assert [r.seq for r in tailer.poll().records] == [1, 2]


def test_backlog_bytes_shrinks_to_zero_once_everything_is_read(live: Path, writer: AuditWriter) -> None:
    write(writer, 1, 60)
    tailer = Tailer(live)
    assert tailer.backlog_bytes() > 4096
    drain(tailer)
    assert tailer.backlog_bytes() == 0


def test_the_checkpoint_round_trips_and_a_damaged_one_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "state" / "syslog" / "dest.json"
    assert load_checkpoint(path) is None
    save_checkpoint(path, Position(1, 2, 3, 4))
    assert load_checkpoint(path) == Position(1, 2, 3, 4)
    assert [p.name for p in path.parent.iterdir()] == ["dest.json"]
    for bad in (b"{", b'{"version": 1, "dev": 1}', b'{"version": 9, "dev":1,"ino":1,"offset":1,"seq":1}',
                b'{"version": 1, "dev":1,"ino":1,"offset":-1,"seq":1}', b"[]"):
        path.write_bytes(bad)
        with pytest.raises(CheckpointError, match="dest.json"):
            load_checkpoint(path)


def test_a_damaged_gzip_file_still_gives_every_whole_line_before_the_damage(live: Path, writer: AuditWriter) -> None:
    # The tailer reads a block of lines at a time; an error inside the block must not cost the lines before it.
    write(writer, 1, 60)
    assert writer.wait_compressed()
    oldest = [path for _, path in audit_files(live) if path.name.endswith(".gz")][0]
    oldest.write_bytes(oldest.read_bytes()[:-40])  # cut inside the compressed stream
    before: list[int] = []
    with gzip.open(oldest) as f:
        try:
            for raw in f:  # one line at a time, up to the damage
                if raw.endswith(b"\n"):
                    before.append(record_fields(json.loads(raw)).seq)
        except GZIP_ERRORS:
            pass
    assert before and before[0] == 1
    seqs, batch = drain(Tailer(live))
    later = seqs[len(before):]
    assert seqs[:len(before)] == before and later == list(range(later[0], 61)) and later[0] > before[-1] + 1
    assert batch.lost == later[0] - before[-1] - 1


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b"a", b"line", b"\r", b"\x00", b"\xff", b"x" * 2000]), max_size=30))
def test_a_read_block_is_split_into_the_same_lines_in_c_as_in_python(parts: list[bytes]) -> None:
    lines_reversed = record_fast.lines_reversed()
    assert lines_reversed is not None, "auditlog._record_fast is not built: `make setup` compiles it"
    data = b"".join(parts)
    assert lines_reversed(data) == split_lines(data)
    lines, tail = split_lines(data)
    assert b"\n".join([*reversed(lines), tail]) == data


def test_the_tailer_splits_in_python_where_records_are_built_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")
    assert record_fast.lines_reversed() is None
