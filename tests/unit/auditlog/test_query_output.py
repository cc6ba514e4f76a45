"""`npaudit logs` output: table and compact columns, colour only on a terminal, hostile names escaped."""

from __future__ import annotations

import datetime as dt
import json
import re
from io import BytesIO, StringIO
from pathlib import Path

import pytest

from auditlog.logs_command import LogsRequest, run_logs
from auditlog.query_output import safe_text
from tests.support.audit_records import sample_record, write_set

NOW = dt.datetime(2024, 5, 2, tzinfo=dt.timezone.utc)
HOSTILE = ["evil\x1b[2J\x1b[H", "two\nlines", "cr\rback", "ls\u2028sep", "rtl\u202eoverride", "bell\x07",
           "c1\x9bcsi", "nul\x00"]


@pytest.fixture
def hostile_set(tmp_path: Path) -> Path:
    """Records whose Pod, namespace, rule, label and node names are terminal escape attacks."""
    records = []
    for i, name in enumerate(HOSTILE):
        r = sample_record(i)
        r["npaudit"]["source"]["pod"] = {"namespace": f"ns{name}", "name": f"pod{name}"}
        r["rule"]["name"] = f"rule{name}"
        r["rule"]["ruleset"] = f"NetworkPolicy:x/{name}"
        r["rule"]["category"] = f"tier{name}"
        r["observer"]["hostname"] = f"node{name}"
        records.append(r)
    write_set(tmp_path / "audit.jsonl", records, max_bytes=0, compress=False)
    return tmp_path


def logs(directory: Path, *, output: str | None = None, tty: bool = False, **kw: object) -> tuple[int, str, str]:
    out, err = BytesIO(), StringIO()
    req = LogsRequest(paths=[directory], output=output, **kw)  # type: ignore[arg-type]
    code = run_logs(req, out=out, err=err, now=NOW, tty=tty, colour=True)
    return code, out.getvalue().decode("utf-8"), err.getvalue()


@pytest.mark.parametrize("output", ["table", "compact"])
def test_hostile_names_cannot_move_the_cursor_or_forge_lines(hostile_set, output):
    code, text, _ = logs(hostile_set, output=output, tty=False)
    lines = text.split("\n")[:-1]
    assert code == 0
    assert len(lines) == len(HOSTILE) + (output == "table")  # one line per record (and the header)
    for ch in ("\x1b", "\r", "\u2028", "\u202e", "\x07", "\x9b", "\x00"):
        assert ch not in text, repr(ch)
    assert "podevil\\x1b[2J\\x1b[H" in text and "two\\nlines" in text and "rtl\\u202eoverride" in text


def test_json_output_is_the_record_lines_byte_for_byte(hostile_set):
    code, text, _ = logs(hostile_set, output="json")
    assert text.encode() == (hostile_set / "audit.jsonl").read_bytes()
    assert json.loads(text.splitlines()[1])["npaudit"]["source"]["pod"]["name"] == "podtwo\nlines"


def test_terminal_default_is_an_aligned_table_with_both_pods_rule_tier_and_count(tmp_path):
    write_set(tmp_path / "audit.jsonl", (sample_record(i) for i in range(12)), max_bytes=0)
    code, text, err = logs(tmp_path, tty=True)
    lines = [re.sub(r"\x1b\[\d+m", "", line) for line in text.splitlines()]
    header = lines[0].split()
    assert header == ["TIME", "SOURCE", "DESTINATION", "PROTO", "DISPOSITION", "TIER", "POLICY", "RULE", "COUNT"]
    starts = [lines[0].index(h) for h in header[:-1]]
    for line in lines[1:]:  # each column starts where its header does
        assert all(line[s - 2:s] == "  " and line[s] != " " for s in starts[1:]), line
    first = sample_record(0)
    assert lines[1].split() == ["2024-05-01T02:14:03.500Z", "frontend/client-0-7d9f:40000", "frontend/db-0:80", "tcp",
                                "Allow", "securityops", "AntreaClusterNetworkPolicy:deny-all", "rule-0",
                                str(first["npaudit"]["aggregate"]["packets"])]
    assert lines[6].split()[2] == "10.96.0.12:443"  # record 5 has no destination Pod: its address
    assert (code, err) == (0, "")


def test_disposition_is_coloured_on_a_terminal_only(tmp_path):
    write_set(tmp_path / "audit.jsonl", (sample_record(i) for i in range(4)), max_bytes=0)
    for output in ("table", "compact"):
        _, on_tty, _ = logs(tmp_path, output=output, tty=True)
        _, piped, _ = logs(tmp_path, output=output, tty=False)
        assert "\x1b[31mDrop\x1b[0m" in on_tty and "\x1b[32mAllow\x1b[0m" in on_tty
        assert "\x1b" not in piped and "Drop" in piped


def test_compact_is_one_line_per_record(tmp_path):
    write_set(tmp_path / "audit.jsonl", (sample_record(i) for i in range(3)), max_bytes=0)
    _, text, _ = logs(tmp_path, output="compact")
    assert text.splitlines()[1] == ("2024-05-01T02:14:04.500Z node-b: backend/client-1-7d9f:40001 -> "
                                    "frontend/web-5c:443 udp Drop x2 (ingress securityops "
                                    "NetworkPolicy:frontend/allow-web rule=rule-1)")


def test_safe_text_keeps_printable_unicode_and_escapes_the_rest():
    assert safe_text("café-ß-名前") == "café-ß-名前"
    assert safe_text("a\tb\x7fc\u200bd\r\n") == "a\\tb\\x7fc\\u200bd\\r\\n"
    assert safe_text(None) == "" and safe_text(42) == "42"
