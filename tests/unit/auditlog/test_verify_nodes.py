"""`npaudit verify` on SIEM copies of many nodes: one chain per node, re-sent duplicates counted, edits still breaks.

Issue 23: a receiver writing two nodes into one file made verify report
``reordered … expected seq 135, found seq 1``, and the forwarder's at-least-once
re-sends after a receiver restart made every copy fail for good.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from auditlog.chain import GENESIS, RecordText
from auditlog.syslog.rfc5424 import Header, encode_record
from auditlog.verify import BEYOND_WINDOW, EDITED, MISSING, verify
from policy_agent.cli.main import main as npaudit
from auditlog.verify_nodes import BEYOND_WINDOW as NODES_BEYOND, DIFFERS, DUPLICATE, RecentChains


def record(node: str, i: int) -> dict[str, Any]:
    return {"@timestamp": f"2026-11-30T02:14:{i % 60:02d}.512Z",
            "event": {"action": "dropped", "id": f"{node}-{i}"},
            "observer": {"hostname": node, "product": "npaudit"},
            "npaudit": {"disposition": "Drop", "priority": 10.0,
                        "aggregate": {"packets": i, "bytes": 60 * i}},
            "source": {"ip": "10.10.1.5", "port": 40000 + i}}


def chain_of(node: str, count: int) -> list[str]:
    lines, prev = [], GENESIS
    for seq in range(1, count + 1):
        line, prev = RecordText.of(record(node, seq)).seal(prev, seq)
        lines.append(line)
    return lines


def as_syslog(line: str, node: str) -> str:
    parsed = json.loads(line)
    return encode_record(parsed, line.encode("ascii"), Header.for_node(node)).message.decode("ascii")


def merged(a: list[str], b: list[str], seed: int = 7) -> list[str]:
    """The two lists interleaved at random, each in its own order (what one receiver file of two nodes holds)."""
    rng, out, i, j = random.Random(seed), [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and rng.random() < 0.5):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("form", ["jsonl", "syslog"])
def test_two_nodes_in_one_file_verify_each_on_its_own(tmp_path: Path, form: str, capsys: Any) -> None:
    a, b = chain_of("node-a", 150), chain_of("node-b", 140)
    if form == "syslog":
        a, b = [as_syslog(x, "node-a") for x in a], [as_syslog(x, "node-b") for x in b]
    path = write(tmp_path / "merged.log", merged(a, b))
    result = verify([path])
    assert result.ok, result.first_break
    assert {(n.node, n.records, n.first_seq, n.last_seq, n.duplicates) for n in result.nodes} == {
        ("node-a", 150, 1, 150, 0), ("node-b", 140, 1, 140, 0)}
    assert result.records == 290
    assert npaudit(["verify", str(path)]) == 0
    out = capsys.readouterr().out
    assert "OK: 290 records in 1 files, 2 nodes" in out
    assert "node node-a: 150 records, seq 1..150: ok" in out and "node node-b: 140 records, seq 1..140: ok" in out


def test_a_break_names_its_node_and_the_other_node_still_verifies(tmp_path: Path, capsys: Any) -> None:
    a, b = chain_of("node-a", 50), chain_of("node-b", 50)
    del b[20]  # node-b's seq 21 removed
    path = write(tmp_path / "merged.jsonl", merged(a, b))
    result = verify([path])
    assert not result.ok
    brk = result.first_break
    assert (brk.kind, brk.node, brk.expected_seq, brk.found_seq) == (MISSING, "node-b", 21, 22)
    nodes = {n.node: n for n in result.nodes}
    assert nodes["node-a"].brk is None and nodes["node-a"].records == 50
    assert nodes["node-b"].brk == brk and nodes["node-b"].records == 20
    assert npaudit(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "BREAK: missing: node node-b: " in out
    assert "node node-a: 50 records, seq 1..50: ok" in out


def resent(lines: list[str], after: int, back: int) -> list[str]:
    """The stream a receiver writes when the forwarder re-sends `back` records after the first `after`."""
    return lines[:after] + lines[after - back:]


@pytest.mark.parametrize("form", ["jsonl", "syslog"])
def test_re_sent_records_are_duplicates_not_a_break(tmp_path: Path, form: str, capsys: Any) -> None:
    a, b = chain_of("node-a", 120), chain_of("node-b", 80)
    if form == "syslog":
        a, b = [as_syslog(x, "node-a") for x in a], [as_syslog(x, "node-b") for x in b]
    # node-a: a receiver restart re-sends 30 records; node-b's copy through a second destination, twice.
    stream = merged(resent(a, 70, 30), merged(b, b, seed=3))
    path = write(tmp_path / "copy.log", stream)
    result = verify([path])
    assert result.ok, result.first_break
    assert {(n.node, n.records, n.last_seq, n.duplicates) for n in result.nodes} == {
        ("node-a", 120, 120, 30), ("node-b", 80, 80, 80)}
    assert result.duplicates == 110
    assert npaudit(["verify", str(path)]) == 0
    out = capsys.readouterr().out
    assert "110 duplicates" in out and "node node-a: 120 records, seq 1..120, 30 duplicates: ok" in out


def test_the_same_seq_with_other_content_is_still_an_edit(tmp_path: Path) -> None:
    a = chain_of("node-a", 40)
    forged = json.loads(a[25])
    forged["source"]["port"] = 1
    stream = resent(a, 30, 10)
    stream[30 + 5] = json.dumps(forged)  # the "re-sent" seq 26 differs from the one verified
    result = verify([write(tmp_path / "copy.jsonl", stream)])
    brk = result.first_break
    assert brk is not None and (brk.kind, brk.node, brk.found_seq, brk.line) == (EDITED, "node-a", 26, 36)
    assert "differs from the seq 26 verified before" in brk.detail


def test_a_re_sent_record_with_its_chain_changed_is_an_edit(tmp_path: Path) -> None:
    a = chain_of("node-a", 20)
    forged = json.loads(a[11])
    forged["npaudit"]["chain"] = "f" * 64
    stream = resent(a, 15, 5)
    stream[15 + 1] = json.dumps(forged)  # the copy of seq 12
    brk = verify([write(tmp_path / "copy.jsonl", stream)]).first_break
    assert brk is not None and (brk.kind, brk.found_seq) == (EDITED, 12)


def test_a_duplicate_older_than_the_window_is_its_own_finding(tmp_path: Path, capsys: Any) -> None:
    a = chain_of("node-a", 60)
    path = write(tmp_path / "copy.jsonl", resent(a, 60, 50))  # all but the first 10 again
    size = len(a[0]) + 1
    small = verify([path], duplicate_window=20 * size)
    brk = small.first_break
    assert brk is not None and (brk.kind, brk.node, brk.found_seq) == (BEYOND_WINDOW, "node-a", 11)
    assert "--duplicate-window" in brk.detail
    assert verify([path]).ok and verify([path]).duplicates == 50  # the default window holds them
    assert npaudit(["verify", "--duplicate-window", str(20 * size), str(path)]) == 1
    assert "BREAK: beyond_window: node node-a" in capsys.readouterr().out


def test_a_duplicate_of_the_oldest_record_present_is_recognised(tmp_path: Path) -> None:
    """Retention removed seqs 1..9: seq 10 is taken on trust; its re-sent copy is still told apart from an edit."""
    a = chain_of("node-a", 30)[9:]
    path = write(tmp_path / "copy.jsonl", resent(a, 15, 15))
    result = verify([path])
    assert result.ok and result.duplicates == 15 and result.first_seq == 10
    forged = json.loads(a[0])
    forged["source"]["port"] = 1
    stream = resent(a, 15, 15)
    stream[15] = json.dumps(forged)
    brk = verify([write(tmp_path / "edited.jsonl", stream)]).first_break
    assert brk is not None and (brk.kind, brk.found_seq) == (EDITED, 10)


def test_one_file_per_node_in_a_directory(tmp_path: Path) -> None:
    for node in ("node-a", "node-b", "node-c"):
        (tmp_path / node).mkdir()
        write(tmp_path / node / "audit.jsonl", resent(chain_of(node, 30), 30, 4))
    result = verify([tmp_path])
    assert result.ok and sorted((n.node, n.records, n.duplicates) for n in result.nodes) == [
        ("node-a", 30, 4), ("node-b", 30, 4), ("node-c", 30, 4)]


def test_json_output_lists_every_node(tmp_path: Path, capsys: Any) -> None:
    path = write(tmp_path / "m.jsonl", merged(resent(chain_of("node-a", 10), 10, 2), chain_of("node-b", 5)))
    assert npaudit(["verify", "--json", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["duplicates"] == 2
    assert [(n["node"], n["records"], n["duplicates"], n["ok"]) for n in out["nodes"]] == [
        ("node-a", 10, 2, True), ("node-b", 5, 0, True)] or \
        [(n["node"], n["records"], n["duplicates"], n["ok"]) for n in out["nodes"]] == [
        ("node-b", 5, 0, True), ("node-a", 10, 2, True)]


def test_recent_chains_stays_bounded_and_keeps_the_chain_before_its_oldest() -> None:
    window = RecentChains(max_bytes=1000)
    chains = [f"{i:064x}" for i in range(200_001)]
    for seq in range(1, 200_001):
        window.add(seq, chains[seq], 100)
    assert (window.first, window.last) == (199_991, 200_000)
    assert window.chain(199_990) == chains[199_990] and window.chain(199_989) is None
    assert window.chain(200_000) == chains[200_000]
    assert len(window._sizes) - window._start == 10 and len(window._sizes) <= 2 * (1 << 16) + 10
    assert window.judge(5, chains[5], {}, None) == NODES_BEYOND
    assert window.judge(199_995, "0" * 64, {}, None) == DIFFERS
    assert DUPLICATE != DIFFERS
