"""`npaudit logs` and `npaudit stats` over a SIEM copy: forwarded RFC 5424 lines read, re-sent duplicates once.

Issue 23: both printed nothing for a file of forwarded messages that `verify
--from-syslog` reads, and would have counted re-sent records twice.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from auditlog.copy_lines import CopyLines
from auditlog.fileset import audit_files, iter_lines
from auditlog.syslog.rfc5424 import Header, encode_record, encode_test_message
from policy_agent.cli.main import main
from policy_agent.config.loader import AgentConfig
from policy_agent.cli.stats import run_stats
from tests.support.audit_records import T0, sample_record, write_set

NODES = ("node-a", "node-b")


def node_lines(directory: Path, node: str, n: int, offset: int) -> list[bytes]:
    live = directory / node / "audit.jsonl"
    records = []
    for i in range(n):
        rec = sample_record(i + offset, t0=T0 + offset)
        rec["observer"] = {"hostname": node}
        records.append(rec)
    write_set(live, records, max_bytes=10_000)
    return [raw.rstrip(b"\n") for _, path in audit_files(live) for _, _, raw in iter_lines(path)]


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the nodes' own files, one merged receiver file of syslog lines, one of JSON lines), with re-sends."""
    base = tmp_path_factory.mktemp("siem")
    own = base / "own"
    lines = {node: node_lines(own, node, 90, k) for k, node in enumerate(NODES)}
    syslog, jsonl = [], []
    a, b = lines["node-a"], lines["node-b"]
    # node-a re-sends 25 records after a receiver restart; node-b goes to two destinations of this receiver.
    stream = a[:60] + b[:45] + a[35:] + b + b[45:]
    for line in stream:
        node = json.loads(line)["observer"]["hostname"]
        syslog.append(encode_record(json.loads(line), line, Header.for_node(node)).message)
        jsonl.append(line)
    syslog.insert(10, encode_test_message(Header.for_node("node-a"), timestamp="2026-11-30T02:14:03.512Z",
                                          test_id="t1"))
    copy_syslog = base / "rx" / "messages.log"
    copy_syslog.parent.mkdir()
    copy_syslog.write_bytes(b"".join(m + b"\n" for m in syslog))
    copy_jsonl = base / "rx2" / "audit.json"
    copy_jsonl.parent.mkdir()
    copy_jsonl.write_bytes(b"".join(m + b"\n" for m in jsonl))
    return own, copy_syslog, copy_jsonl


def logs(capsysbinary: Any, *paths: Path) -> list[dict[str, Any]]:
    assert main(["logs", "-o", "json", *map(str, paths)]) == 0
    return [json.loads(line) for line in capsysbinary.readouterr().out.splitlines()]


def key(r: dict[str, Any]) -> tuple[str, int]:
    return r["observer"]["hostname"], r["npaudit"]["seq"]


@pytest.mark.parametrize("copy", [1, 2], ids=["syslog", "jsonl"])
def test_logs_over_a_copy_gives_each_record_once_as_the_nodes_wrote_it(sets: Any, copy: int,
                                                                        capsysbinary: Any) -> None:
    own = sets[0]
    expected = logs(capsysbinary, own / "node-a", own / "node-b")
    got = logs(capsysbinary, sets[copy])
    assert len(expected) == 180
    assert sorted(got, key=key) == sorted(expected, key=key)


def stats(paths: list[Path]) -> tuple[dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_stats(AgentConfig(state_dir="/nonexistent"), paths, since=None, until=None, output="json",
                     now=__import__("datetime").datetime.now(__import__("datetime").timezone.utc),
                     api=lambda s, r: (_ for _ in ()).throw(FileNotFoundError(2, "x")), out=out, err=err)
    assert code == 0
    return json.loads(out.getvalue())["files"], err.getvalue()


@pytest.mark.parametrize("copy", [1, 2], ids=["syslog", "jsonl"])
def test_stats_over_a_copy_counts_each_record_once(sets: Any, copy: int) -> None:
    own = sets[0]
    expected, _ = stats([own / "node-a", own / "node-b"])
    got, notes = stats([sets[copy]])
    assert got == expected and got["records"] == 180
    assert "skipped 115 re-sent duplicate records" in notes


def test_an_edited_record_under_a_seen_seq_is_shown_not_hidden() -> None:
    lines = [json.dumps({"npaudit": {"seq": i, "chain": f"{i:016x}" * 4}}, separators=(",", ":")).encode()
             for i in range(1, 4)]
    edited = json.dumps({"npaudit": {"seq": 2, "chain": "e" * 64}}).encode()  # another tool's spacing
    block = b"".join(x + b"\n" for x in [*lines, lines[1], edited])
    copy = CopyLines()
    assert copy.block(block).split(b"\n")[:-1] == [*lines, edited] and copy.duplicates == 1


def test_the_remembered_chains_stay_within_the_window() -> None:
    copy = CopyLines(window_bytes=10_000)
    for start in range(0, 50_000, 100):
        copy.block(b"".join(json.dumps({"npaudit": {"seq": i, "chain": f"{i:016x}" * 4}}).encode() + b"\n"
                            for i in range(start, start + 100)))
    assert len(copy._seen) == sum(len(prints) for prints, _ in copy._order) <= 200  # the newest blocks only
    assert copy.duplicates == 0


def test_a_nodes_own_file_set_is_read_as_it_is(tmp_path: Path, capsysbinary: Any) -> None:
    """The writer's own set (its lock file beside it) holds each record once: nothing is searched or dropped."""
    copy = CopyLines(dedup=False)
    line = json.dumps({"npaudit": {"seq": 1, "chain": "a" * 64}}).encode() + b"\n"
    assert copy.block(line + line) == line + line and copy.duplicates == 0


def test_a_member_called_chain_inside_a_record_neither_hides_it_nor_hides_a_repeat() -> None:
    def line(seq: int, chain: str, label: Any = None) -> bytes:
        rec: dict[str, Any] = {"labels": {"chain": label}} if label is not None else {}
        rec["npaudit"] = {"chain": chain, "seq": seq}
        return json.dumps(rec, separators=(",", ":")).encode() + b"\n"
    a, b, c = ("a1" * 32), ("b2" * 32), ("c3" * 32)
    copy = CopyLines()
    assert copy.block(line(1, a)) == line(1, a)
    # A label holding record 1's chain value (hex, as a chain) and one holding a short value.
    tricky = line(2, b, label=a) + line(3, c, label="x")
    assert copy.block(tricky) == tricky
    assert copy.block(line(2, b, label=a) + line(1, a)) == b"" and copy.duplicates == 2
