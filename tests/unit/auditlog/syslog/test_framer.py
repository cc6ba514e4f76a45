"""The forwarder's frames made in C a run at a time (auditlog.syslog.framer, auditlog/_scan_fast.c sealed_frames)
against the tailer's records framed one by one by rfc5424.FrameEncoder: the same frames, batch for batch, with
the same losses, skipped lines and positions, on files that mix what the C part takes with every kind of line it
must leave to the Python (other seqs, seqs past what C reads, broken chains, torn or foreign lines, records that state a loss, escaped or
long text, stamps that are no TIMESTAMP), at any batch limit and in both stream framings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditlog import record_fast
from auditlog.chain import GENESIS, RecordText
from auditlog.syslog.framer import Framer
from auditlog.syslog.rfc5424 import SD_ID, FrameEncoder, Framing, Header
from auditlog.syslog.tailer import Batch, Tailer
from auditlog.writer import AuditWriter
from tests.support.syslog_parse import parse_message, split_octet_counted

STAMPS = ["2026-11-30T02:14:03.512Z", "2026-11-30T02:14:03.513Z", "not a time", 'a\\"b', "", "2026-13-40T99:99:99Z"]
DISPOSITIONS: list[Any] = ["Drop", "Allow", "Reject", "Pass", "Undetermined", None, 7, 'Dr"op', "Dröp"]
NAMES = ["pod-0", "pod-1", 'x"]y', "back\\slash", "café", "}}}{", "z" * 1500]


@st.composite
def line_kinds(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["record"] * 12 + ["loss", "restart", "gap", "back", "broken", "foreign", "blank",
                                                   "huge"]))
    return kind, draw(st.tuples(st.sampled_from(STAMPS), st.sampled_from(DISPOSITIONS), st.sampled_from(NAMES)))


def build(kinds: list[tuple[str, Any]], torn_end: bool) -> bytes:
    """A file of sealed lines, one per drawn kind, each after the one before it where the kind keeps the chain."""
    prev, seq, out = GENESIS, 0, []
    for kind, (stamp, disposition, name) in kinds:
        npaudit: dict[str, Any] = {"pod": name}
        if disposition is not None:
            npaudit["disposition"] = disposition
        if kind == "loss":
            npaudit["loss"] = {"packets": 3}
        if kind == "restart":
            npaudit["chain_restart"] = {"records_lost": 2}
        record = {"@timestamp": stamp, "event": {"action": "dropped"}, "npaudit": npaudit, "rule": {"name": name}}
        if kind == "foreign":
            out.append(b'{"not":"ours"}')
            continue
        if kind == "blank":
            out.append(b"")
            continue
        seq = {"gap": seq + 3, "back": max(1, seq - 2), "huge": 10**19 * (seq + 1)}.get(kind, seq + 1)
        text, chain = RecordText.of(record).seal("0" * 64 if kind == "broken" else prev, seq)
        out.append(text.encode("utf-8"))
        prev = chain
    data = b"\n".join(out) + b"\n"
    return data[:-7] if torn_end and len(data) > 7 else data


def frames_of(batch: Batch, encoder: FrameEncoder) -> list[bytes]:
    items = batch.framed or batch.records
    return [item if isinstance(item, bytes) else encoder.encode(item.fields, item.line)[0] for item in items]


def both_ways(path: Path, encoder: FrameEncoder, limits: list[tuple[int, int]]) -> list[Any]:
    """Per poll, both ways: (frames, lost, skipped, bytes, end, count) and, at the end, what the tailers expect."""
    framer = Framer.for_encoder(encoder)
    assert framer is not None, "auditlog._record_fast is not built: `make setup` compiles it"
    plain, framed = Tailer(path), Tailer(path)
    seen: list[Any] = []
    for max_records, max_bytes in limits:
        a, b = plain.poll(max_records, max_bytes), framed.poll(max_records, max_bytes, framer)
        assert not a.framed and not b.records
        assert b.slow == sum(not isinstance(item, bytes) for item in b.framed)
        seen.append(((frames_of(a, encoder), a.lost, a.skipped, a.bytes, a.end, a.count),
                     (frames_of(b, encoder), b.lost, b.skipped, b.bytes, b.end, b.count)))
    seen.append(((plain.next_seq, plain._prev_chain), (framed.next_seq, framed._prev_chain)))
    plain.close()
    framed.close()
    return seen


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(line_kinds(), min_size=1, max_size=40), torn_end=st.booleans(),
       limits=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 40_000)), min_size=1, max_size=8),
       framing=st.sampled_from([Framing.OCTET_COUNTING, Framing.LF]))
def test_the_framer_gives_the_frames_of_the_records_batch_for_batch(
        tmp_path: Path, kinds: list[tuple[str, Any]], torn_end: bool, limits: list[tuple[int, int]],
        framing: Framing) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(build(kinds, torn_end))
    for plain, framed in both_ways(path, FrameEncoder(Header.for_node("node-a", 13), framing), limits + [(10**6, 1 << 30)]):
        assert framed == plain


def test_the_drawn_files_have_runs_the_c_part_takes_and_lines_it_leaves(tmp_path: Path) -> None:
    """Not vacuous: on a file like the drawn ones most records come framed from C and the others as records."""
    path = tmp_path / "audit.jsonl"
    kinds = [("record", ("2026-11-30T02:14:03.512Z", "Drop", "pod-0"))] * 30 + [("loss", (STAMPS[0], "Drop", "p"))] \
        + [("record", (STAMPS[1], "Allow", "pod-1"))] * 5 + [("gap", (STAMPS[1], "Allow", "pod-1"))] \
        + [("record", (STAMPS[1], "Reject", "z" * 1500))] * 3 + [("record", (STAMPS[2], "Allow", "pod-1"))] * 2
    path.write_bytes(build(kinds, torn_end=False))
    encoder = FrameEncoder(Header.for_node("node-a"), Framing.OCTET_COUNTING)
    framer = Framer.for_encoder(encoder)
    assert framer is not None
    batch = Tailer(path).poll(1000, 1 << 30, framer)
    assert batch.count == 42 and batch.end is not None and batch.end.seq == 44
    # The first record, the loss record, the record after the gap and those with a segment too long to keep.
    assert batch.slow == 6
    messages, rest = split_octet_counted(b"".join(frames_of(batch, encoder)))
    assert rest == b"" and [m.msgid for m in map(parse_message, messages)][29:32] == ["DROP", "DROP", "ALLOW"]
    assert [isinstance(item, bytes) for item in batch.framed[:32]] == [False] + [True] * 29 + [False, True]


def test_more_distinct_segments_and_stamps_than_are_kept_give_the_same_frames(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    kinds = [("record", (f"2026-11-30T02:14:{i // 1000:02d}.{i % 1000:03d}Z", "Drop", f"pod-{i}")) for i in range(1500)]
    path.write_bytes(build(kinds, torn_end=False))
    encoder = FrameEncoder(Header.for_node("node-a"), Framing.LF)
    for plain, framed in both_ways(path, encoder, [(1000, 1 << 30)] * 3):
        assert framed == plain
    framer = Framer.for_encoder(encoder)
    assert framer is not None
    assert Tailer(path).poll(2000, 1 << 30, framer).slow == 1  # the first: C needs a chain to follow


def test_following_a_writer_that_rotates_between_polls_gives_every_record_once(tmp_path: Path) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    encoder = FrameEncoder(Header.for_node("node-a"), Framing.OCTET_COUNTING)
    framer = Framer.for_encoder(encoder)
    assert framer is not None
    tailer, stream = Tailer(live), b""
    with AuditWriter(live, max_bytes=4096, backup_count=50, max_age_days=0) as writer:
        for step in range(20):
            for i in range(9):
                assert writer.submit(RecordText.of({"@timestamp": STAMPS[0], "npaudit": {"disposition": "Drop"},
                                                    "event": {"id": f"e{step}-{i}"}}))
            assert writer.flush_wait()
            for _ in range(50):
                batch = tailer.poll(7, 1 << 20, framer)
                if not batch.count:
                    break
                stream += b"".join(frames_of(batch, encoder))
        assert writer.wait_compressed()
    while (batch := tailer.poll(7, 1 << 20, framer)).count:
        stream += b"".join(frames_of(batch, encoder))
    messages, rest = split_octet_counted(stream)
    assert rest == b"" and [int(parse_message(m).sd[SD_ID]["seq"]) for m in messages] == list(range(1, 181))


def test_no_framer_where_records_are_framed_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Framer.for_encoder(FrameEncoder(Header(), Framing.DATAGRAM, max_bytes=2048)) is None  # udp: a cap
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")
    assert Framer.for_encoder(FrameEncoder(Header(), Framing.OCTET_COUNTING)) is None


def test_the_c_part_refuses_arguments_it_cannot_take() -> None:
    sealed_frames = record_fast.sealed_frames()
    assert sealed_frames is not None
    keys = (b'{"@timestamp":"', b'"chain":"', b'"chain_format":2,', b'"seq":')
    lines: list[bytes] = [b"x"]
    with pytest.raises(ValueError):  # its frames would land among the lines it reads
        sealed_frames(lines, lines, GENESIS, 1, 10, 100, {}, {}, False, *keys)
    with pytest.raises(TypeError):
        sealed_frames(tuple(lines), [], GENESIS, 1, 10, 100, {}, {}, False, *keys)
    with pytest.raises(ValueError):
        sealed_frames(lines, [], "é", 1, 10, 100, {}, {}, False, *keys)
    assert sealed_frames(lines, [], GENESIS, 1, 10, 100, {}, {}, False, *keys) == (0, 0, None, 1, None)
