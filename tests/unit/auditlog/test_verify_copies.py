"""`npaudit verify` on copies: re-encoded by other JSON tools, forwarded as syslog, and across the format upgrade.

A SIEM receives the records through tools that re-encode JSON (jq, Python json,
JavaScript, rsyslog's mmjsonparse): other key order, whitespace and escapes, ``10``
for ``10.0``. Each such copy must verify, and a record edited, dropped or moved
in the copy must be named.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from auditlog.chain import GENESIS, RecordText
from auditlog.syslog.rfc5424 import Header, encode_record, encode_test_message
from auditlog.verify import EDITED, MISSING, REORDERED, verify
from auditlog.writer import AuditWriter
from policy_agent.cli.main import main as npaudit

DATA = Path(__file__).resolve().parents[1] / "data"
COUNT = 12


def record(i: int) -> dict[str, Any]:
    """A record with what re-encoders change: floats (10.0, 5.5), non-ASCII, "/", controls, big counts."""
    return {"@timestamp": f"2026-11-30T02:14:{i:02d}.512Z",
            "event": {"action": "dropped", "id": f"{i:032x}", "type": ["connection", "denied"]},
            "labels": {"log_label": ["café ☕ 名前", "a/b\\c", 'quote "q"', "tab\tnl\nU+2028\u2028", "😀"][i % 5]},
            "network": {"bytes": 2**40 + i, "packets": i},
            "npaudit": {"disposition": "Drop", "priority": [10.0, 5.5, 0.1, 1e-7, 250.0][i % 5],
                        "aggregate": {"packets": i, "bytes": 60 * i, "first": "x", "last": "y"},
                        "destination": {"pod": {"name": f"api-{i}", "namespace": "ns-é"}}},
            "source": {"ip": "10.10.1.5", "port": 40000 + i}}


def sealed_lines() -> list[str]:
    lines, prev = [], GENESIS
    for seq in range(1, COUNT + 1):
        line, prev = RecordText.of(record(seq)).seal(prev, seq)
        lines.append(line)
    return lines


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def js_numbers(value: Any) -> Any:
    """What JavaScript (and jq, Go) do to numbers: 10.0 is the number 10."""
    if isinstance(value, dict):
        return {k: js_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [js_numbers(v) for v in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def python(**options: Any) -> Callable[[list[str]], list[str]]:
    return lambda lines: [json.dumps(json.loads(line), **options) for line in lines]


def slashes_and_escapes(lines: list[str]) -> list[str]:
    # "/" occurs only inside strings, so escaping every one keeps the JSON (PHP does this).
    return [json.dumps(json.loads(line), ensure_ascii=True).replace("/", "\\/") for line in lines]


def key_order_shuffled(lines: list[str]) -> list[str]:
    rng = random.Random(7)
    return [json.dumps(shuffled(json.loads(line), rng), ensure_ascii=False, separators=(",", ":")) for line in lines]


def javascript_numbers(lines: list[str]) -> list[str]:
    return [json.dumps(js_numbers(json.loads(line)), ensure_ascii=False) for line in lines]


def tool(*argv: str) -> Callable[[list[str]], list[str]]:
    def run(lines: list[str]) -> list[str]:
        out = subprocess.run(argv, input="".join(line + "\n" for line in lines), capture_output=True, text=True,
                             check=True, timeout=60).stdout
        return out.split("\n")[:-1]  # not splitlines(): U+2028 is no line end in JSON lines
    return run


NODE = ("node", "-e", "require('readline').createInterface({input: process.stdin})"
        ".on('line', l => console.log(JSON.stringify(JSON.parse(l))))")

RE_ENCODERS = {
    "python-default": python(),                                  # ", " and ": ", \u escapes
    "python-utf8-compact": python(ensure_ascii=False, separators=(",", ":")),
    "key-order-shuffled": key_order_shuffled,
    "javascript-numbers": javascript_numbers,
    "slashes-escaped": slashes_and_escapes,
    "jq-c": tool("jq", "-c", "."),
    "node-json-stringify": tool(*NODE),
}


def write_copy(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def original() -> list[str]:
    return sealed_lines()


@pytest.mark.parametrize("name", list(RE_ENCODERS))
def test_a_re_encoded_copy_verifies(name: str, original: list[str], tmp_path: Path) -> None:
    copy = RE_ENCODERS[name](original)
    assert copy != original  # the tool did change the text
    assert [json.loads(c) == json.loads(o) for c, o in zip(copy, original)] == [True] * COUNT  # not the data
    result = verify([write_copy(tmp_path / "copy.jsonl", copy)])
    assert result.ok, result.first_break
    assert (result.first_seq, result.last_seq, result.records) == (1, COUNT, COUNT)


def test_integral_floats_are_written_as_integers_in_the_file(original: list[str]) -> None:
    # The file holds what JavaScript would write: nothing for a re-encoder to change.
    assert '"priority":10,' in original[4] and '"priority":5.5,' in original[0]
    assert '"priority":1e-7,' in original[2] and '"priority":250,' in original[3]
    assert all(line.isascii() for line in original)


@pytest.mark.parametrize("name", ["python-default", "jq-c", "node-json-stringify"])
def test_an_edited_dropped_or_moved_record_in_a_re_encoded_copy_is_named(name: str, original: list[str],
                                                                        tmp_path: Path) -> None:
    copy = RE_ENCODERS[name](original)
    edited = list(copy)
    edited[4] = edited[4].replace("40005", "40099")
    brk = verify([write_copy(tmp_path / "edited.jsonl", edited)]).first_break
    assert brk is not None and (brk.kind, brk.line, brk.found_seq) == (EDITED, 5, 5)

    dropped = copy[:6] + copy[7:]
    brk = verify([write_copy(tmp_path / "dropped.jsonl", dropped)]).first_break
    assert brk is not None and (brk.kind, brk.line, brk.expected_seq, brk.found_seq) == (MISSING, 7, 7, 8)

    swapped = copy[:2] + [copy[3], copy[2]] + copy[4:]
    brk = verify([write_copy(tmp_path / "swapped.jsonl", swapped)]).first_break
    assert brk is not None and (brk.kind, brk.line, brk.expected_seq, brk.found_seq) == (REORDERED, 3, 3, 4)


# --- forwarded syslog messages ---

def syslog_copy(lines: list[str], edit: Callable[[bytes], bytes] = lambda msg: msg) -> list[str]:
    header = Header.for_node("node-a", "local0")
    out = []
    for line in lines:
        message = encode_record(json.loads(line), line.encode("ascii"), header).message
        out.append(edit(message).decode("utf-8"))
    return out


def test_a_file_of_forwarded_syslog_messages_verifies(original: list[str], tmp_path: Path, capsys) -> None:
    copy = write_copy(tmp_path / "received.log", syslog_copy(original))
    assert copy.read_text().startswith("<") and "[npaudit@32473 seq=\"1\"" in copy.read_text()
    result = verify([copy])
    assert result.ok and (result.first_seq, result.last_seq) == (1, COUNT)
    assert npaudit(["verify", str(copy), "--from-syslog"]) == 0
    assert f"OK: {COUNT} records" in capsys.readouterr().out


def test_a_syslog_test_message_in_a_forwarded_copy_is_skipped_not_a_break(original: list[str],
                                                                           tmp_path: Path) -> None:
    # `npaudit syslog test` sends marked messages outside the chain; a SIEM copy holds them too.
    test = encode_test_message(Header.for_node("node-a", "local0"), timestamp="2026-11-30T02:14:03.512Z",
                               test_id="t1").decode("ascii")
    copy = syslog_copy(original)
    copy.insert(5, test)
    result = verify([write_copy(tmp_path / "received.log", copy)], syslog=True)
    assert result.ok and (result.first_seq, result.last_seq) == (1, COUNT)
    assert any("syslog test" in w and "line 6" in w for w in result.warnings)
    # Only the marked message is skipped: the same line without its mark is a break.
    copy[5] = test.replace(' test="true"', "")
    assert not verify([write_copy(tmp_path / "unmarked.log", copy)], syslog=True).ok


def test_a_syslog_test_message_right_after_a_gap_does_not_hide_the_missing_record(original: list[str],
                                                                                 tmp_path: Path) -> None:
    # Looking past a gap for the missing seq and for the next record, a test message is skipped as well.
    test = encode_test_message(Header.for_node("node-a", "local0"), timestamp="2026-11-30T02:14:03.512Z",
                               test_id="t1").decode("ascii")
    copy = syslog_copy(original)
    del copy[4]  # seq 5
    copy.insert(5, test)  # after seq 6, the line the gap is found at
    result = verify([write_copy(tmp_path / "received.log", copy)], syslog=True)
    assert not result.ok and result.first_break is not None
    assert (result.first_break.kind, result.first_break.line) == (MISSING, 5)
    assert "seq 5 missing" in result.first_break.detail


def test_forwarded_messages_whose_json_a_receiver_re_encoded_verify(original: list[str], tmp_path: Path) -> None:
    # A receiver that parsed MSG and wrote it back (rsyslog mmjsonparse + %$!all-json%, other order).
    rng = random.Random(3)
    messages = syslog_copy(original)
    rewritten = []
    for message in messages:
        head, _, msg = message.partition("] ")
        rewritten.append(head + "] " + json.dumps(shuffled(js_numbers(json.loads(msg)), rng), ensure_ascii=False))
    assert verify([write_copy(tmp_path / "received.log", rewritten)], syslog=True).ok


def test_an_edit_in_a_forwarded_message_is_named(original: list[str], tmp_path: Path, capsys) -> None:
    copy = syslog_copy(original)
    copy[7] = copy[7].replace("40008", "40009")
    path = write_copy(tmp_path / "received.log", copy)
    brk = verify([path]).first_break
    assert brk is not None and (brk.kind, brk.line, brk.found_seq) == (EDITED, 8, 8)
    assert npaudit(["verify", str(path), "--from-syslog"]) == 1
    assert "BREAK: edited" in capsys.readouterr().out
    # The structured data and the record disagree: one of them was changed.
    copy = syslog_copy(original)
    copy[2] = copy[2].replace('seq="3"', 'seq="4"', 1)
    brk = verify([write_copy(tmp_path / "sd.log", copy)]).first_break
    assert brk is not None and (brk.kind, brk.line) == (EDITED, 3) and "structured data" in brk.detail


def test_from_syslog_names_a_line_that_is_not_a_message(original: list[str], tmp_path: Path) -> None:
    copy = syslog_copy(original)
    copy[5] = original[5]  # a bare JSON line among messages
    path = write_copy(tmp_path / "received.log", copy)
    assert verify([path]).ok  # by default each line is taken for what it is
    brk = verify([path], syslog=True).first_break
    assert brk is not None and (brk.kind, brk.line) == ("unparseable", 6) and "RFC 5424" in brk.detail


def test_a_udp_stub_is_a_warning_and_the_chain_goes_on(original: list[str], tmp_path: Path) -> None:
    header = Header.for_node("node-a")
    copy = syslog_copy(original)
    longer = json.loads(original[3])
    longer["labels"]["log_label"] = "k" * 3000  # record 4 as if it were too long for a datagram
    stub = encode_record(longer, json.dumps(longer).encode(), header, max_bytes=1024)
    assert stub.truncated
    copy[3] = stub.message.decode()
    result = verify([write_copy(tmp_path / "udp.log", copy)])
    assert result.ok and result.last_seq == COUNT
    assert any("seq 4 was shortened" in w for w in result.warnings)


# --- the format upgrade: old files keep verifying ---

def test_a_file_set_spanning_the_upgrade_verifies(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    shutil.copy(DATA / "audit-chain-format1.jsonl", live)  # written by the format-1 writer
    old = live.read_text().splitlines()
    assert '"priority":10.0' in old[0] and "chain_format" not in old[0]
    writer = AuditWriter(live)
    writer.start()
    for i in range(1, 4):
        writer.submit(RecordText.of(record(i)))
    assert writer.flush_wait(5) and writer.close(timeout=5)
    lines = live.read_text().splitlines()
    assert len(lines) == len(old) + 3 and all('"chain_format":2' in line for line in lines[len(old):])
    result = verify([live])
    assert result.ok and (result.first_seq, result.last_seq) == (1, len(lines))
    # Both formats are really checked: an edit on either side of the upgrade is named.
    for n in (2, len(old) + 2):  # both have port 40002
        edited = list(lines)
        edited[n - 1] = edited[n - 1].replace('"port":40002', '"port":40099')
        brk = verify([write_copy(tmp_path / "edited.jsonl", edited)]).first_break
        assert brk is not None and (brk.kind, brk.line) == (EDITED, n)


def test_a_record_cannot_be_passed_off_as_format_1(original: list[str], tmp_path: Path) -> None:
    copy = list(original)
    copy[2] = copy[2].replace('"chain_format":2,', "")
    brk = verify([write_copy(tmp_path / "downgraded.jsonl", copy)]).first_break
    assert brk is not None and (brk.kind, brk.line) == (EDITED, 3)
