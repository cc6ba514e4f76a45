"""auditlog.writer.AuditWriter: write-through, batching, rotation, retention, modes, restarts, never blocking."""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from auditlog import compressor as compressor_mod, rotation as rotation_mod, writer as writer_mod
from auditlog.chain import GENESIS, OBSERVER, check_line
from auditlog.fileset import audit_files, iter_lines
from auditlog.verify import verify
from policy_agent.cli.main import main as npaudit
from auditlog.writer import AuditWriter
from tests.support.audit_writer import lines_of, record, record_fields, whole_records
from tests.support.audit_writer import live, make_writer  # noqa: F401 (fixtures)

DAY = 86400.0


def test_lone_record_reaches_the_file_at_once(live, make_writer):
    # No batching window: with the writer's clock frozen, no flush and no second record,
    # the first record still reaches the file (the latency itself: bench/auditlog_throughput.py).
    w = make_writer(live, clock=lambda: 1e9)
    assert w.submit(record(1))
    # Without asking for a flush: poll the file as a tailing reader would (5 s: a hang guard).
    for _ in range(5000):
        if live.exists() and live.read_bytes().endswith(b"\n"):
            break
        time.sleep(0.001)
    assert [r["npaudit"]["seq"] for r in lines_of(live)] == [1], "a lone record never reached the file"
    assert w.submit(record(2))
    assert w.flush_wait(5)
    got = lines_of(live)
    assert [r["npaudit"]["seq"] for r in got] == [1, 2]
    assert got[0]["rule"]["name"] == record_fields(1)["rule"]["name"]
    assert w.stats["written"] == 2 and w.stats["batches"] == 2


def test_burst_is_batched_and_every_record_is_there_in_order(live, make_writer):
    n = 50_000
    w = make_writer(live, queue_size=n)
    for i in range(n):
        assert w.submit(record(i))
    assert w.flush_wait(30)
    assert w.stats["written"] == n and w.stats["dropped_queue_full"] == 0
    assert w.stats["batches"] * 20 < n, w.stats
    got = lines_of(live)
    assert [r["npaudit"]["seq"] for r in got] == list(range(1, n + 1))
    assert [r["event"]["id"] for r in got] == [f"e{i}" for i in range(n)]
    result = verify([live.parent])
    assert result.ok and result.records == n and result.head_chain == w.head[1]


def test_rotation_under_load_gzips_and_never_splits_a_record(live, make_writer):
    max_bytes = 32 * 1024
    w = make_writer(live, max_bytes=max_bytes, backup_count=500, queue_size=100_000)
    n = 20_000
    for i in range(n):
        assert w.submit(record(i))
    assert w.flush_wait(30) and w.wait_compressed(30)
    files = audit_files(live)
    assert w.stats["rotations"] == len(files) - 1 >= 20
    assert w.stats["compressed"] == w.stats["rotations"]
    line_len = max(len(raw) for _, _, raw in iter_lines(files[0][1]))
    for index, path in files:
        if index:
            assert path.name == f"audit.jsonl.{index}.gz"
            with gzip.open(path) as f:
                data = f.read()
        else:
            data = path.read_bytes()
        assert data.endswith(b"\n")
        # Rotation happens between writes of at most max_bytes/16 bytes.
        assert len(data) <= max_bytes + max_bytes // 16 + line_len
        for raw in data.splitlines():
            json.loads(raw)  # whole records only
    assert [int(i) for i, _ in files] == list(range(len(files) - 1, -1, -1))
    result = verify([live.parent])
    assert result.ok and (result.records, result.first_seq, result.last_seq) == (n, 1, n)


def test_retention_keeps_backup_count_files_and_prunes_strays(live, make_writer):
    live.parent.mkdir(parents=True)
    stray = live.with_name("audit.jsonl.9.gz")
    stray.write_bytes(gzip.compress(b""))
    w = make_writer(live, max_bytes=4096, backup_count=3)
    assert not stray.exists()  # above backup_count: removed at start
    for i in range(2000):
        assert w.submit(record(i))
    assert w.flush_wait(30) and w.wait_compressed(30)
    assert w.stats["rotations"] > 3
    assert [p.name for _, p in audit_files(live)] == [
        "audit.jsonl.3.gz", "audit.jsonl.2.gz", "audit.jsonl.1.gz", "audit.jsonl"]
    result = verify([live.parent])
    assert result.ok and result.last_seq == 2000 and result.first_seq > 1
    assert any("checked from seq" in warning for warning in result.warnings)


def test_retention_by_age_at_start_and_at_rotation(live, make_writer):
    now = [1_700_000_000.0]
    w1 = make_writer(live, max_bytes=2048, backup_count=50)
    for i in range(200):
        w1.submit(record(i))
    assert w1.flush_wait(10)
    w1.close()
    rotated = [p for i, p in audit_files(live) if i]
    assert len(rotated) >= 4
    # Oldest half: 40 days old; the rest: 1 day old (by the injected clock).
    for k, path in enumerate(rotated):
        age = 40 * DAY if k < len(rotated) // 2 else 1 * DAY
        os.utime(path, (now[0] - age, now[0] - age))
    young = rotated[len(rotated) // 2:]
    w2 = make_writer(live, max_bytes=2048, backup_count=50, max_age_days=28, clock=lambda: now[0])
    assert sorted(p for i, p in audit_files(live) if i) == sorted(young)
    assert w2.stats["pruned"] == len(rotated) // 2
    # Thirty days later every file from before is too old; a rotation removes them.
    now[0] += 30 * DAY
    for path in young:
        os.utime(path, (now[0] - 31 * DAY, now[0] - 31 * DAY))
    rotations = w2.stats["rotations"]
    for i in range(40):
        w2.submit(record(i))
    assert w2.flush_wait(10) and w2.wait_compressed(10)
    assert w2.stats["rotations"] > rotations
    left = [p for i, p in audit_files(live) if i]
    assert left and all(p.stat().st_mtime > now[0] - 28 * DAY for p in left)


def test_directory_0750_and_files_0640_whatever_the_umask(live, make_writer):
    old = os.umask(0o077)
    try:
        w = make_writer(live, max_bytes=2048, backup_count=5)
        for i in range(100):
            w.submit(record(i))
        assert w.flush_wait(10) and w.wait_compressed(10)
    finally:
        os.umask(old)
    for directory in (live.parent, live.parent.parent):  # created by the writer: both levels
        assert stat.S_IMODE(directory.stat().st_mode) == 0o750, directory
    files = audit_files(live)
    assert len(files) > 1
    for _, path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path


def test_existing_directory_mode_is_left_alone(tmp_path, make_writer):
    tmp_path.chmod(0o755)
    w = make_writer(tmp_path / "audit.jsonl")
    w.submit(record(0))
    assert w.flush_wait(1)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755


def test_full_queue_refuses_and_counts(live, make_writer):
    w = make_writer(live, start=False, queue_size=10)  # nothing drains yet
    results = [w.submit(record(i)) for i in range(15)]
    assert results == [True] * 10 + [False] * 5
    assert w.stats["dropped_queue_full"] == 5
    w.start()
    assert w.flush_wait(5)
    assert [r["event"]["id"] for r in lines_of(live)] == [f"e{i}" for i in range(10)]


def test_close_drains_then_refuses(live, make_writer):
    w = make_writer(live)
    for i in range(3000):
        w.submit(record(i))
    assert w.close(timeout=10)
    assert len(lines_of(live)) == 3000
    assert not w.submit(record(0))
    assert w.stats["dropped_closed"] == 1


def test_restart_continues_seq_and_chain(live, make_writer):
    w1 = make_writer(live)
    for i in range(100):
        w1.submit(record(i))
    w1.close()
    w2 = make_writer(live)
    assert w2.head == w1.head
    for i in range(100, 150):
        w2.submit(record(i))
    assert w2.flush_wait(5)
    assert [r["npaudit"]["seq"] for r in lines_of(live)] == list(range(1, 151))
    assert npaudit(["verify", str(live.parent)]) == 0


def test_restart_resumes_from_newest_rotated_file_when_live_is_gone(live, make_writer):
    w1 = make_writer(live, max_bytes=4096, backup_count=50)
    for i in range(300):
        w1.submit(record(i))
    w1.close()
    # As if the agent stopped right after a rotation: live -> .1.gz, no new live file yet.
    for index, path in audit_files(live):
        if index:
            path.rename(live.with_name(f"audit.jsonl.{index + 1}.gz"))
    live.with_name("audit.jsonl.1.gz").write_bytes(gzip.compress(live.read_bytes()))
    live.unlink()
    w2 = make_writer(live, max_bytes=4096, backup_count=50)
    assert w2.head == w1.head
    w2.submit(record(300))
    assert w2.flush_wait(5)
    result = verify([live.parent])
    assert result.ok and (result.first_seq, result.last_seq) == (1, 301)


def test_torn_last_line_starts_a_new_segment_that_verify_accepts(live, make_writer, capsys):
    w1 = make_writer(live)
    for i in range(10):
        w1.submit(record(i))
    w1.close()
    data = live.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    live.write_bytes(data[:-25])  # the agent died in the middle of writing seq 10
    w2 = make_writer(live, state_fields={"observer": {"hostname": "node-1"}}, clock=lambda: 1_000_000_000.123)
    assert w2.stats["chain_restarts"] == 1
    for i in range(10, 15):
        w2.submit(record(i))
    assert w2.flush_wait(5)
    raws = [raw for _, _, raw in iter_lines(live)]
    assert raws[9] == data[last_start:-25] + b"\n"  # the torn bytes stay, ended by a newline
    restart = json.loads(raws[10])
    assert restart["event"]["kind"] == "state" and restart["event"]["action"] == "chain-restart"
    assert restart["@timestamp"] == "2001-09-09T01:46:40.123Z"  # the writer's injected clock
    # The same observer as every record kind: the node given, vendor and product always.
    assert restart["observer"] == {"hostname": "node-1", **OBSERVER} and len(restart["event"]["id"]) == 32
    assert restart["npaudit"]["chain_restart"]["line"] == 10
    assert restart["npaudit"]["chain_restart"]["offset"] == last_start
    assert restart["npaudit"]["seq"] == 10  # sealed onto seq 9, the last good record
    assert check_line(raws[10].rstrip(b"\n"), json.loads(raws[8])["npaudit"]["chain"], 9)[0] == 10
    assert [json.loads(r)["npaudit"]["seq"] for r in raws[11:]] == [11, 12, 13, 14, 15]
    assert npaudit(["verify", str(live.parent)]) == 0
    out = capsys.readouterr().out
    assert "WARNING:" in out and "chain-restart" in out and "line 10" in out
    assert "OK: 15 records in 1 files, seq 1..15" in out


def test_torn_line_in_a_full_file_is_explained_across_the_rotation(live, make_writer):
    w1 = make_writer(live, max_bytes=1 << 20)
    for i in range(30):
        w1.submit(record(i))
    w1.close()
    live.write_bytes(live.read_bytes()[:-10])
    # Restart with a smaller size limit: the torn file is rotated before the
    # chain-restart record is written, which then opens the new live file.
    w2 = make_writer(live, max_bytes=2048, backup_count=5)
    w2.submit(record(30))
    assert w2.flush_wait(5) and w2.wait_compressed(10)
    assert [p.name for _, p in audit_files(live)] == ["audit.jsonl.1.gz", "audit.jsonl"]
    first = json.loads(next(iter_lines(live))[2])
    assert first["event"]["action"] == "chain-restart" and first["npaudit"]["chain_restart"]["line"] == 30
    result = verify([live.parent])
    assert result.ok and (result.first_seq, result.last_seq) == (1, 31), result
    assert len(result.warnings) == 1 and "audit.jsonl.1.gz line 30" in result.warnings[0]


def test_complete_last_record_without_newline_just_continues(live, make_writer):
    w1 = make_writer(live)
    for i in range(5):
        w1.submit(record(i))
    w1.close()
    live.write_bytes(live.read_bytes()[:-1])
    w2 = make_writer(live)
    w2.submit(record(5))
    assert w2.flush_wait(5)
    assert w2.stats["chain_restarts"] == 0
    result = verify([live])
    assert result.ok and result.last_seq == 6 and not result.warnings


def test_submit_never_blocks_while_rotation_is_stuck(live, make_writer, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real_gzip = rotation_mod.JsonlHandler.do_gzip

    left = threading.Event()

    def stuck_gzip(self, name):
        entered.set()
        release.wait(20)
        left.set()
        real_gzip(self, name)

    monkeypatch.setattr(rotation_mod.JsonlHandler, "do_gzip", stuck_gzip)
    w = make_writer(live, max_bytes=65536, backup_count=100, queue_size=5000)
    accepted = refused = 0
    i = 0
    while not entered.wait(0 if i % 100 else 0.001):
        ok = w.submit(record(i))
        accepted, refused, i = accepted + ok, refused + (not ok), i + 1
        assert i < 200_000, "rotation never started"
    for _ in range(20_000):  # the writer thread sits in the rotation all along
        ok = w.submit(record(i))
        accepted, refused, i = accepted + ok, refused + (not ok), i + 1
    # Every submit returned while the rotation was still held: none waited for the writer.
    assert not release.is_set() and not left.is_set() and w.queued >= 4999
    assert refused > 0 and w.stats["dropped_queue_full"] == refused
    release.set()
    assert w.flush_wait(20)
    assert w.stats["written"] == accepted
    result = verify([live.parent])
    assert result.ok and result.records == accepted


def text_record(i: int) -> Any:
    """A record as the pipeline hands it over: chain.RecordText from the encoder, event id e<i>."""
    from auditlog.packet import decode_frame
    from auditlog.record import RecordContext, RecordEncoder
    from packetin.model import PacketIn
    from policy_agent.policy.rules import RuleRegistry

    class NoPods:
        def by_ip(self, ip: str) -> None:
            return None

    frame = bytes.fromhex("020000000002020000000001080045000028000100004006" "0000" "0a000001" "0a000002"
                          "9c40" "0050" "00000000" "00000000" "5002" "2000" "0000" "0000")
    pin = PacketIn(reason=0, table_id=40, cookie=1, in_port=1, rule_id=9, reg7=1, userdata=b"", packet=frame,
                   total_len=len(frame), received_at=1e9)
    encoder = RecordEncoder(RecordContext(node="n", rules=RuleRegistry(), pods=NoPods(),
                                          new_event_id=lambda: f"e{i}"))
    return encoder.encode(pin, decode_frame(frame), packets=1, bytes_=len(frame), first=1e9, last=1e9)


@pytest.mark.parametrize("make_record", [record, text_record], ids=["dict", "RecordText"])
def test_failed_write_is_retried_and_the_chain_stays_verifiable(live, make_writer, monkeypatch, make_record):
    real_write = rotation_mod.JsonlHandler.do_write
    calls = [0]

    def disk_full_once(self, msg):
        calls[0] += 1
        if calls[0] != 4:
            return real_write(self, msg)
        if self.stream is None or self.stream.closed:
            self.stream = self.do_open()
        self.stream.write(msg[: len(msg) // 2])  # half a line reached the disk
        self.stream.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rotation_mod.JsonlHandler, "do_write", disk_full_once)
    w = make_writer(live)
    for i in range(8):
        w.submit(make_record(i))
        assert w.flush_wait(5)
    assert w.stats["write_errors"] == 1 and w.stats["chain_restarts"] == 1
    assert w.stats["written"] == 9  # 8 records and the chain-restart record
    got = whole_records(live)
    assert got[3]["event"]["action"] == "chain-restart"
    del got[3]
    assert [r["event"]["id"] for r in got] == [f"e{i}" for i in range(8)]  # each once, in order
    result = verify([live])
    assert result.ok and result.last_seq == 9, result
    assert any("chain-restart" in warning for warning in result.warnings)


def test_rotation_interrupted_by_a_crash_is_finished_at_start(live, make_writer):
    w1 = make_writer(live, max_bytes=4096, backup_count=50)
    for i in range(200):
        w1.submit(record(i))
    w1.close()
    # The library renames the live file to .rotate.N first; a crash there leaves it.
    live.rename(live.with_name("audit.jsonl.rotate.12345"))
    w2 = make_writer(live, max_bytes=4096, backup_count=50)
    assert not list(live.parent.glob("*.rotate.*"))
    assert w2.head == w1.head
    w2.submit(record(200))
    assert w2.flush_wait(5)
    result = verify([live.parent])
    assert result.ok and (result.first_seq, result.last_seq) == (1, 201)


def test_writing_and_rotation_go_on_while_compression_is_stuck(live, make_writer, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real_gzip = compressor_mod.gzip_file

    def stuck_gzip(src, dst, **kw):
        entered.set()
        release.wait(20)
        real_gzip(src, dst, **kw)

    monkeypatch.setattr(compressor_mod, "gzip_file", stuck_gzip)
    w = make_writer(live, max_bytes=4096, backup_count=100)
    for i in range(100):
        assert w.submit(record(i))
    assert entered.wait(5)
    for i in range(100, 1000):
        assert w.submit(record(i))
    # The compressor holds the first rotated file; the writer does not wait for it.
    assert w.flush_wait(5) and not release.is_set()
    assert w.stats["written"] == 1000 and w.stats["rotations"] > 50 and w.stats["compressed"] == 0
    assert verify([live.parent]).ok  # plain rotated files are part of the set meanwhile
    release.set()
    assert w.wait_compressed(30)
    names = [p.name for i, p in audit_files(live) if i]
    assert names and all(n.endswith(".gz") for n in names)
    assert w.stats["compressed"] == w.stats["rotations"]
    result = verify([live.parent])
    assert result.ok and (result.first_seq, result.last_seq) == (1, 1000)


def test_compressed_file_keeps_the_age_of_its_records(live, make_writer, monkeypatch):
    made: list[Path] = []
    real_gzip = compressor_mod.gzip_file

    def older_first(src, dst, **kw):
        os.utime(src.fileno(), (1_000_000_000, 1_000_000_000))  # as if written long ago
        made.append(dst)
        real_gzip(src, dst, **kw)

    monkeypatch.setattr(compressor_mod, "gzip_file", older_first)
    w = make_writer(live, max_bytes=2048, backup_count=100)
    for i in range(40):
        w.submit(record(i))
    assert w.flush_wait(5) and w.wait_compressed(10) and made
    assert all(p.stat().st_mtime == 1_000_000_000 for i, p in audit_files(live) if i)


def test_close_leaves_an_unfinished_compression_plain_and_the_next_start_finishes_it(live, make_writer,
                                                                                     monkeypatch, caplog):
    real_gzip = compressor_mod.gzip_file
    slow = threading.Event()

    abandoned: list[bool] = []

    def slow_gzip(src, dst, *, abandon=None, **kw):
        slow.set()
        abandoned.append(abandon is not None and abandon.wait(20))  # close gives up on the compression
        real_gzip(src, dst, abandon=abandon, **kw)

    monkeypatch.setattr(compressor_mod, "gzip_file", slow_gzip)
    w1 = make_writer(live, max_bytes=2048, backup_count=100)
    for i in range(30):
        w1.submit(record(i))
    assert w1.flush_wait(5) and slow.wait(5)
    with caplog.at_level(logging.INFO, logger="auditlog.writer"):
        assert w1.close(timeout=0.5)  # every record written; only the compression is left
    # close abandoned the compression (not waited out its 20 s) and the compressor has ended.
    assert abandoned == [True] and "compression stopped at close" in caplog.text
    plain = [p for i, p in audit_files(live) if i and not p.name.endswith(".gz")]
    assert plain and not list(live.parent.glob(".*.tmp"))
    assert verify([live.parent]).ok
    monkeypatch.setattr(compressor_mod, "gzip_file", real_gzip)
    live.with_name(f".{live.name}.gz-999.tmp").write_bytes(b"half a gzip")  # a crash mid-compression
    w2 = make_writer(live, max_bytes=2048, backup_count=100)
    assert w2.wait_compressed(10)
    assert not list(live.parent.glob(".*.tmp"))
    assert all(p.name.endswith(".gz") for i, p in audit_files(live) if i)
    result = verify([live.parent])
    assert result.ok and (result.first_seq, result.last_seq) == (1, 30)


def test_verify_reads_a_rotated_file_the_compressor_just_replaced(live, make_writer):
    w = make_writer(live, max_bytes=2048, backup_count=100, compress=False)
    for i in range(30):
        w.submit(record(i))
    w.close()
    files = [p for _, p in audit_files(live)]
    rotated = files[0]
    assert not rotated.name.endswith(".gz")
    # As verify sees it when the writer compresses between listing and reading:
    rotated.with_name(rotated.name + ".gz").write_bytes(gzip.compress(rotated.read_bytes()))
    rotated.unlink()
    from auditlog.verify import _Walk
    walk = _Walk(files)
    assert walk.run() is None and walk.records == 30


def test_unencodable_record_is_counted_and_skipped_without_a_gap(live, make_writer):
    w = make_writer(live)
    w.submit(record(0))
    w.submit({"bad": float("nan")})
    w.submit({"bad": {1, 2}})
    w.submit(record(1))
    assert w.flush_wait(5)
    assert w.stats["unencodable"] == 2
    result = verify([live])
    assert result.ok and result.last_seq == 2


def test_fsync_option_and_head(live, make_writer):
    w = make_writer(live, fsync=True)
    assert w.head == (0, GENESIS)
    w.submit(record(0))
    assert w.flush_wait(5)
    assert w.head[0] == 1 and lines_of(live)[0]["npaudit"]["chain"] == w.head[1]


@pytest.mark.parametrize("field,value", [("max_bytes", -1), ("backup_count", 0), ("queue_size", 0),
                                         ("max_age_days", -1)])
def test_bad_settings_name_the_field(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        AuditWriter(tmp_path / "a.jsonl", **{field: value})


def test_a_second_writer_on_the_same_files_is_refused(live, make_writer):
    make_writer(live)
    with pytest.raises(writer_mod.AuditWriterError, match="in use by another writer"):
        make_writer(live)


def test_verify_while_the_writer_rotates_and_compresses_sees_an_intact_chain(live, make_writer):
    # A security team runs `npaudit verify` on a live node: rotations shift names and the
    # compressor replaces files while it reads. Every run must see one intact chain.
    w = make_writer(live, max_bytes=32 * 1024, backup_count=30)
    stop = threading.Event()
    fed = [0]

    def feed() -> None:
        i = 0
        while not stop.is_set():
            for _ in range(100):
                fed[0] += w.submit(record(i))
                i += 1
            time.sleep(0.005)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        while w.stats["rotations"] < 3:
            time.sleep(0.01)
        results = [verify([live.parent]) for _ in range(15)]
        rotations_during = w.stats["rotations"]
    finally:
        stop.set()
        feeder.join()
    assert rotations_during > 8 and w.stats["compressed"] > 3, w.stats
    assert all(r.ok for r in results), [r.first_break for r in results if not r.ok]
    assert all(r.records > 100 for r in results)
    assert w.flush_wait(10) and w.wait_compressed(10)
    final = verify([live.parent])
    assert final.ok and final.last_seq == fed[0]


def test_a_cut_short_live_line_is_damage_unless_the_file_is_still_growing(live, make_writer):
    w = make_writer(live)
    for i in range(5):
        w.submit(record(i))
    w.close()
    whole = live.read_bytes()
    live.write_bytes(whole[:-20])  # the last record cut short, nothing appends any more
    result = verify([live])
    assert not result.ok and result.first_break.kind == "truncated"

    from auditlog.fileset import pin_files
    from auditlog.verify import _Walk

    live.write_bytes(whole[:-20])
    files, _, pinned = pin_files([live])
    sizes = iter([False, False, True])  # the writer finishes the line while verify looks
    naps: list[float] = []
    walk = _Walk(files, pinned.open, lambda path, size: next(sizes), sleep=naps.append)
    assert walk.run() is None and walk.records == 4
    assert len(naps) == 2  # looked three times, waiting between looks
    assert any("being written" in warning for warning in walk.warnings)
    pinned.close()


def test_verify_lists_the_set_only_while_no_writer_renames_in_it(live, make_writer):
    import fcntl

    from auditlog.fileset import set_lock

    w = make_writer(live, max_bytes=2048, backup_count=50)
    for i in range(30):
        w.submit(record(i))
    assert w.flush_wait(5) and w.wait_compressed(5)
    done = threading.Event()
    with set_lock(live, fcntl.LOCK_EX) as held:  # as the writer holds it while it rotates
        assert held
        checker = threading.Thread(target=lambda: (verify([live.parent]), done.set()), daemon=True)
        checker.start()
        assert not done.wait(0.3)  # verify waits instead of listing a set in motion
    assert done.wait(5)
    # And the other way round: while verify holds the set still (for the milliseconds
    # it lists and opens), the writer waits: its handler locks every write and rotation,
    # the compressor and retention lock their renames.
    with set_lock(live, fcntl.LOCK_SH):
        for i in range(30, 60):
            w.submit(record(i))
        assert not w.flush_wait(0.3)
    assert w.flush_wait(5) and w.wait_compressed(5)
    result = verify([live.parent])
    assert result.ok and result.last_seq == 60


def test_a_record_text_that_is_not_unicode_is_skipped_and_non_ascii_is_written_escaped(live, make_writer):
    from auditlog.chain import RecordText

    w = make_writer(live)
    good = text_record(0)
    w.submit(good)
    w.submit(RecordText(good.head, good.mid, good.tail.replace('"n"', '"\ud800"')))  # a bug upstream
    w.submit(RecordText(good.head, good.mid, good.tail.replace('"n"', '"caf\u00e9"')))  # JCS text: é as itself
    w.submit(text_record(1))
    assert w.flush_wait(5)
    assert w.stats["unencodable"] == 1 and w.stats["written"] == 3
    data = live.read_bytes()
    assert data.isascii() and b'"caf\\u00e9"' in data  # the file stays ASCII
    assert json.loads(data.splitlines()[1])["observer"]["hostname"] == "caf\u00e9"
    result = verify([live])
    assert result.ok and result.last_seq == 3


def test_a_file_that_cannot_be_compressed_stays_plain_counted_and_close_does_not_hang(live, make_writer,
                                                                                    monkeypatch, caplog):
    def no_space(src, dst, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(compressor_mod, "gzip_file", no_space)
    w = make_writer(live, max_bytes=2048, backup_count=100)
    for i in range(40):
        w.submit(record(i))
    assert w.flush_wait(5)
    with caplog.at_level(logging.INFO, logger="auditlog.writer"):
        assert w.close(timeout=10)
    # The compressor ended by itself after the failure: close had nothing to abandon.
    assert "compression stopped at close" not in caplog.text
    assert w.stats["compress_errors"] >= 1 and w.stats["compressed"] == 0
    assert all(not p.name.endswith(".gz") for _, p in audit_files(live))
    result = verify([live.parent])
    assert result.ok and result.last_seq == 40
