"""auditlog.chain and auditlog.verify: canonical sealing, and the first break found precisely."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditlog import chain
from auditlog.chain import GENESIS, ChainError, RecordText, check_line
from auditlog.jcs import ascii_form, canonical
from auditlog.verify import verify
from policy_agent.cli.main import main as npaudit

SIZES = [30, 25, 40, 35]  # audit.jsonl.3.gz, .2.gz, .1.gz, audit.jsonl


def seal(record: dict[str, Any], prev_chain: str, seq: int) -> str:
    """Seal `record` as the writer does (through RecordText) and set its npaudit.seq and .chain."""
    line, chain_value = RecordText.of(record).seal(prev_chain, seq)
    meta = record.setdefault("npaudit", {})
    meta.pop("chain", None)
    meta.update(seq=seq, chain=chain_value, chain_format=chain.FORMAT)
    return line


def make_record(seq: int) -> dict[str, Any]:
    return {"@timestamp": f"2024-05-01T02:14:{seq % 60:02d}.512Z",
            "event": {"action": "allowed" if seq % 3 else "dropped", "id": f"id-{seq}"},
            "rule": {"name": f'r{seq} "quoted"\nline\u2028é\U0001F600', "id": seq % 7},
            "source": {"ip": "10.0.0.5", "port": 1024 + seq}, "labels": {"log_label": "x\x00y"},
            "npaudit": {"disposition": "Allow", "aggregate": {"packets": seq, "bytes": 60 * seq}}}


def file_name(index: int) -> str:
    return "audit.jsonl" if index == 0 else f"audit.jsonl.{index}.gz"


def build(directory: Path, sizes: list[int], *, first_seq: int = 1) -> list[list[str]]:
    """Lines of a sealed file set, oldest file first, as the writer would leave it."""
    prev = GENESIS if first_seq == 1 else "ab" * 32
    seq, files = first_seq, []
    for size in sizes:
        lines = []
        for _ in range(size):
            rec = make_record(seq)
            lines.append(seal(rec, prev, seq))
            prev, seq = rec["npaudit"]["chain"], seq + 1
        files.append(lines)
    write(directory, files)
    return files


def write(directory: Path, files: list[list[str]], *, torn_last: bytes | None = None) -> None:
    for path in directory.glob("audit.jsonl*"):
        path.unlink()
    n = len(files)
    for k, lines in enumerate(files):
        data = "".join(line + "\n" for line in lines).encode("ascii")
        path = directory / file_name(n - 1 - k)
        if k == n - 1:
            path.write_bytes(data if torn_last is None else torn_last)
        else:
            path.write_bytes(gzip.compress(data))


@pytest.fixture
def logset(tmp_path: Path) -> tuple[Path, list[list[str]]]:
    return tmp_path, build(tmp_path, SIZES)


def run(capsys, *args: str) -> tuple[int, str]:
    code = npaudit(["verify", *args])
    return code, capsys.readouterr().out


# --- chain ---

@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=12),
       st.dictionaries(st.text(), st.integers() | st.text(), max_size=4),
       st.integers(min_value=1, max_value=2**53))
def test_seal_hashes_the_rfc8785_form_and_writes_it_on_one_ascii_line(payload, meta, seq):
    record = {"payload": payload, "a": [payload], "zz": payload, "npaudit": dict(meta)}
    line = seal(record, GENESIS, seq)
    assert line == ascii_form(canonical(record))  # JCS, non-ASCII escaped (auditlog/test_jcs.py checks canonical)
    assert "\n" not in line and "\r" not in line and line.isascii()
    body = dict(record, npaudit={k: v for k, v in record["npaudit"].items() if k != "chain"})
    raw = GENESIS + "\n" + canonical(body)
    assert record["npaudit"]["chain"] == hashlib.sha256(raw.encode("utf-8")).hexdigest()
    assert check_line(line, "0" * 64, seq - 1 if seq > 1 else None) == (seq, record["npaudit"]["chain"])


def test_seal_replaces_an_old_chain_and_refuses_nan():
    rec = {"x": 1, "npaudit": {"chain": "f" * 64}}
    seal(rec, GENESIS, 1)
    first = rec["npaudit"]["chain"]
    seal(rec, GENESIS, 1)
    assert rec["npaudit"]["chain"] == first
    with pytest.raises(ValueError):
        seal({"x": float("nan")}, GENESIS, 1)


@pytest.mark.parametrize("line,prev_seq,kind", [
    ("not json", 1, chain.UNPARSEABLE),
    ("[1,2]", 1, chain.UNPARSEABLE),
    ('{"npaudit":{"seq":2}}', 1, chain.UNSEALED),
    ('{"npaudit":{"seq":true,"chain":"' + "0" * 64 + '"}}', 1, chain.UNSEALED),
])
def test_check_line_names_what_is_wrong(line, prev_seq, kind):
    with pytest.raises(ChainError) as err:
        check_line(line, GENESIS, prev_seq)
    assert err.value.kind == kind


def test_check_line_seq_and_chain_errors():
    recs = [make_record(i) for i in (1, 2, 3)]
    prev, lines = GENESIS, []
    for seq, rec in enumerate(recs, 1):
        lines.append(seal(rec, prev, seq))
        prev = rec["npaudit"]["chain"]
    c1 = recs[0]["npaudit"]["chain"]
    assert check_line(lines[1], c1, 1)[0] == 2
    for line, prev_seq, kind in ((lines[2], 1, chain.SEQ_GAP), (lines[0], 1, chain.SEQ_REORDER),
                                 (lines[1].replace("id-2", "id-X"), 1, chain.CHAIN_MISMATCH)):
        with pytest.raises(ChainError) as err:
            check_line(line, c1, prev_seq)
        assert err.value.kind == kind
    with pytest.raises(ChainError):
        check_line(lines[0].replace("id-1", "id-X"), GENESIS, None)  # seq 1 is checked against GENESIS


# --- verify: the intact set and each kind of break ---

def test_intact_set_exits_0_with_summary(logset, capsys):
    directory, _ = logset
    code, out = run(capsys, str(directory))
    assert code == 0
    assert "OK: 130 records in 4 files, seq 1..130" in out
    result = verify([directory])
    assert [p.name for p in result.files] == ["audit.jsonl.3.gz", "audit.jsonl.2.gz", "audit.jsonl.1.gz",
                                              "audit.jsonl"]
    assert result.head_chain in out


def test_explicit_files_in_any_order_are_put_in_rotation_order(logset, capsys):
    directory, _ = logset
    names = ["audit.jsonl", "audit.jsonl.1.gz", "audit.jsonl.3.gz", "audit.jsonl.2.gz"]
    code, out = run(capsys, *(str(directory / n) for n in names))
    assert code == 0 and "seq 1..130" in out


def test_deleted_line_is_missing_at_its_place(logset, capsys):
    directory, files = logset
    del files[1][9]  # audit.jsonl.2.gz line 10, seq 30 + 10 = 40
    write(directory, files)
    code, out = run(capsys, str(directory))
    assert code == 1
    assert f"BREAK: missing: {directory / 'audit.jsonl.2.gz'} line 10: record(s) seq 40 missing" in out
    brk = verify([directory]).first_break
    assert (brk.kind, brk.file.name, brk.line, brk.expected_seq, brk.found_seq) == (
        "missing", "audit.jsonl.2.gz", 10, 40, 41)


def test_several_deleted_lines_give_the_range(logset):
    directory, files = logset
    del files[2][5:8]  # audit.jsonl.1.gz starts at seq 56: lines 6..8 are seq 61..63
    write(directory, files)
    brk = verify([directory]).first_break
    assert (brk.kind, brk.file.name, brk.line, brk.expected_seq, brk.found_seq) == (
        "missing", "audit.jsonl.1.gz", 6, 61, 64)
    assert brk.detail.startswith("record(s) seq 61..63 missing (3)")


def test_edited_field_is_edited_at_that_line(logset, capsys):
    directory, files = logset
    files[3][4] = files[3][4].replace('"port":1', '"port":2', 1)  # live file line 5
    write(directory, files)
    code, out = run(capsys, str(directory))
    assert code == 1 and f"BREAK: edited: {directory / 'audit.jsonl'} line 5:" in out
    brk = verify([directory]).first_break
    assert (brk.expected_seq, brk.found_seq) == (30 + 25 + 40 + 5,) * 2


def test_swapped_lines_are_reordered(logset, capsys):
    directory, files = logset
    files[0][11], files[0][12] = files[0][12], files[0][11]
    write(directory, files)
    code, out = run(capsys, str(directory))
    assert code == 1
    assert f"BREAK: reordered: {directory / 'audit.jsonl.3.gz'} line 12: expected seq 12, found seq 13" in out


def test_truncated_last_line_is_truncated(logset, capsys):
    directory, files = logset
    data = "".join(line + "\n" for line in files[3]).encode()
    write(directory, files, torn_last=data[:-40])
    code, out = run(capsys, str(directory))
    assert code == 1
    assert f"BREAK: truncated: {directory / 'audit.jsonl'} line 35: the last line is cut short" in out
    assert verify([directory]).first_break.expected_seq == 130


def test_removed_rotated_file_is_missing_across_the_boundary(logset, capsys):
    directory, _ = logset
    (directory / "audit.jsonl.2.gz").unlink()
    code, out = run(capsys, str(directory))
    assert code == 1
    assert (f"BREAK: missing_file: {directory / 'audit.jsonl.1.gz'} line 1: record(s) seq 31..55 missing (25) "
            f"between {directory / 'audit.jsonl.3.gz'} (ends with seq 30 at line 30) and "
            f"{directory / 'audit.jsonl.1.gz'} (continues with seq 56); audit.jsonl.2.gz absent") in out


def test_garbage_line_is_unparseable_and_truncated_gzip_is_truncated(logset):
    directory, files = logset
    files[1].insert(3, "this is not a record")
    write(directory, files)
    brk = verify([directory]).first_break
    assert (brk.kind, brk.file.name, brk.line, brk.expected_seq) == ("unparseable", "audit.jsonl.2.gz", 4, 34)
    build(directory, SIZES)
    gz = directory / "audit.jsonl.2.gz"
    gz.write_bytes(gz.read_bytes()[:-30])
    brk = verify([directory]).first_break
    assert (brk.kind, brk.file.name) == ("truncated", "audit.jsonl.2.gz")


def test_unsealed_line_is_reported(logset):
    directory, files = logset
    files[3][0] = json.dumps({"message": "inserted"})
    write(directory, files)
    brk = verify([directory]).first_break
    assert (brk.kind, brk.file.name, brk.line) == ("unsealed", "audit.jsonl", 1)


def test_set_without_its_oldest_records_is_ok_with_a_note(tmp_path, capsys):
    build(tmp_path, [10, 10], first_seq=1000)
    code, out = run(capsys, str(tmp_path))
    assert code == 0 and "OK: 20 records in 2 files, seq 1000..1019" in out
    assert "WARNING: the chain is checked from seq 1000" in out


def test_json_output_and_usage_errors(logset, capsys, tmp_path):
    directory, files = logset
    del files[0][2]
    write(directory, files)
    code, out = run(capsys, "--json", str(directory))
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["break"]["line"] == 3 and doc["break"]["expected_seq"] == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    assert npaudit(["verify", str(empty)]) == 2
    assert npaudit(["verify", str(tmp_path / "nope.jsonl")]) == 2


# --- property: any single deletion, edit or swap is found where it was made ---

def _edit(line: str, how: int, seq: int) -> str:
    rec = json.loads(line)
    if how == 0:
        rec["source"]["port"] += 1
    elif how == 1:
        rec["rule"]["name"] = "renamed"
    elif how == 2:
        rec["npaudit"]["seq"] = seq + 5 if seq < 5 else seq - 3
    elif how == 3:
        c = rec["npaudit"]["chain"]
        rec["npaudit"]["chain"] = ("1" if c[0] == "0" else "0") + c[1:]
    else:
        rec["event"]["outcome"] = "success"
    return chain.encode(rec)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(min_value=2, max_value=12), min_size=1, max_size=4),
       mutation=st.sampled_from(["delete", "edit", "swap"]), data=st.data())
def test_any_single_deletion_edit_or_swap_is_found_at_its_place(sizes, mutation, data):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        files = build(directory, sizes)
        positions = [(k, i) for k, lines in enumerate(files) for i in range(len(lines))]
        n = len(positions)
        if mutation == "delete":
            # The first and the last record can go unnoticed (see auditlog.chain): not tested here.
            if n < 3:
                return
            g = data.draw(st.integers(min_value=1, max_value=n - 2))
            k, i = positions[g]
            expect_k, expect_i = positions[g + 1] if positions[g + 1][0] != k else (k, i)
            del files[k][i]
            kinds = {"missing"}
        elif mutation == "edit":
            g = data.draw(st.integers(min_value=0, max_value=n - 1))
            k, i = expect_k, expect_i = positions[g]
            files[k][i] = _edit(files[k][i], data.draw(st.integers(0, 4)), g + 1)
            kinds = {"edited"}
        else:
            g = data.draw(st.integers(min_value=0, max_value=n - 2))
            h = data.draw(st.integers(min_value=g + 1, max_value=n - 1))
            (k, i), (k2, i2) = expect = positions[g], positions[h]
            expect_k, expect_i = expect[0]
            files[k][i], files[k2][i2] = files[k2][i2], files[k][i]
            kinds = {"reordered"}
        write(directory, files)
        brk = verify([directory]).first_break
        assert brk is not None, (mutation, g)
        assert brk.kind in kinds, brk
        assert (brk.file.name, brk.line) == (file_name(len(files) - 1 - expect_k), expect_i + 1), brk
        if mutation == "delete":
            assert brk.expected_seq == g + 1
        assert npaudit(["verify", str(directory)]) == 1


def test_a_copy_of_the_set_elsewhere_verifies_the_same(logset, tmp_path):
    directory, _ = logset
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    assert verify([copy]).head_chain == verify([directory]).head_chain


def test_directory_with_another_configured_file_name(tmp_path, capsys):
    build(tmp_path, [5, 5])
    for path in tmp_path.glob("audit.jsonl*"):
        path.rename(tmp_path / path.name.replace("audit.jsonl", "flows.jsonl"))
    code, out = run(capsys, str(tmp_path))
    assert code == 0 and "OK: 10 records in 2 files" in out
    (tmp_path / "other.jsonl").write_text("")
    assert npaudit(["verify", str(tmp_path)]) == 2
    assert "pass --base" in capsys.readouterr().err
    assert npaudit(["verify", "--base", "flows.jsonl", str(tmp_path)]) == 0
