"""auditlog.syslog.rfc5424: header fields, SD escaping, framing and the UDP stub, read back by an independent parser."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from auditlog.chain import GENESIS, RecordText, chain_restart_record, records_lost_record
from auditlog.loss_records import METER, LossKey, loss_record
from auditlog.syslog.errors import SyslogConfigError, SyslogFormatError
from auditlog.syslog.rfc5424 import (MIN_UDP_MAX_BYTES, FrameEncoder, Framing, Header, RecordFields, encode_record,
                                     facility_code, frame, header_hostname, record_fields, sd_escape)
from tests.support.syslog_parse import parse_message, split_octet_counted

HOSTILE = ['a"b', "x]y", "back\\slash", "new\nline", "tab\tand\rcr", "café ☕ 名前", "[npaudit@32473 seq=\"1\"]",
           "\u2028sep", "z" * 10_000]


def sealed(disposition: str | None = "Drop", *, name: str = "web-1", label: str = "audit",
           seq: int = 7) -> tuple[dict[str, Any], bytes]:
    record: dict[str, Any] = {
        "@timestamp": "2026-11-30T02:14:03.512Z",
        "event": {"id": "0123456789abcdef0123456789abcdef", "action": "dropped"},
        "labels": {"log_label": label},
        "npaudit": {"source": {"pod": {"name": name, "namespace": "ns"}}, "priority": 10.0},
    }
    if disposition is not None:
        record["npaudit"]["disposition"] = disposition
    line, _ = RecordText.of(record).seal(GENESIS, seq)
    return json.loads(line), line.encode("ascii") + b"\n"


def test_a_drop_record_becomes_one_rfc5424_message_with_its_json_as_msg() -> None:
    record, line = sealed("Drop")
    enc = encode_record(record, line, Header.for_node("node-a", "local3"))
    msg = parse_message(enc.message)
    assert (msg.facility, msg.severity, msg.version) == (19, 4, 1)
    assert (msg.timestamp, msg.hostname, msg.app_name, msg.procid, msg.msgid) == (
        "2026-11-30T02:14:03.512Z", "node-a", "npaudit", "-", "DROP")
    assert msg.sd == {"npaudit@32473": {"seq": "7", "chain": record["npaudit"]["chain"]}}
    assert msg.msg == line.rstrip(b"\n")  # byte for byte, no BOM
    assert enc.seq == 7 and not enc.truncated


@pytest.mark.parametrize("disposition,msgid,severity", [
    ("Allow", "ALLOW", 6), ("Pass", "PASS", 6), ("Drop", "DROP", 4), ("Reject", "REJECT", 4), (None, "STATE", 5)])
def test_msgid_and_severity_follow_the_disposition_table(disposition: str | None, msgid: str, severity: int) -> None:
    record, line = sealed(disposition)
    msg = parse_message(encode_record(record, line, Header()).message)
    assert (msg.msgid, msg.severity, msg.facility) == (msgid, severity, 16)


def _writers_own(kind: str) -> dict[str, Any]:
    """One of the writer's own records (no disposition) as auditlog makes it."""
    if kind == "loss":
        return loss_record({LossKey("policy", METER, "policy_deny"): 12}, 1764468843.0, 1764468844.0)
    if kind == "records-lost":
        return records_lost_record(lost={"dropped_queue_full": 3}, after_seq=41, now=1764468843.0)
    return chain_restart_record(file="audit.jsonl", line=9, offset=900, nbytes=17, after_seq=8, now=1764468843.0)


@pytest.mark.parametrize("kind,severity", [("loss", 4), ("records-lost", 4), ("torn-write", 5)])
def test_a_record_stating_a_loss_is_a_warning_other_state_records_a_notice(kind: str, severity: int) -> None:
    line, _ = RecordText.of(_writers_own(kind)).seal(GENESIS, 3)
    record, raw = json.loads(line), line.encode("ascii")
    fields = record_fields(record)
    assert fields.loss is (severity == 4)
    for encoded in (encode_record(record, raw, Header()).message, encode_record(fields, raw, Header()).message,
                    FrameEncoder(Header(), Framing.LF).encode(fields, raw)[0].rstrip(b"\n")):
        msg = parse_message(encoded)
        assert (msg.msgid, msg.severity, msg.msg) == ("STATE", severity, raw)


def test_an_invalid_timestamp_becomes_the_nilvalue() -> None:
    record, line = sealed()
    record["@timestamp"] = "yesterday at noon"
    assert parse_message(encode_record(record, line, Header()).message).timestamp == "-"


def test_facility_names_and_numbers_are_checked() -> None:
    assert facility_code("LOCAL7") == 23 and facility_code(0) == 0 and facility_code("authpriv") == 10
    for bad in ("local8", 24, -1, True, "", 3.0):
        with pytest.raises(SyslogConfigError, match="facility"):
            facility_code(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "with space", "tab\t", "é", "a" * 256, "new\nline"])
def test_a_hostname_that_is_not_printusascii_becomes_the_nilvalue(name: str) -> None:
    assert header_hostname(name) == "-"
    assert header_hostname("node-1.example.com") == "node-1.example.com"
    assert header_hostname("a" * 255) == "a" * 255


def test_sd_escape_escapes_quote_backslash_and_bracket_only() -> None:
    assert sd_escape('a"b\\c]d[e=f') == 'a\\"b\\\\c\\]d[e=f'


@given(name=st.one_of(st.sampled_from(HOSTILE), st.text(max_size=300)),
       label=st.one_of(st.sampled_from(HOSTILE), st.text(max_size=300)),
       node=st.one_of(st.sampled_from(HOSTILE), st.text(max_size=300)),
       framing=st.sampled_from([Framing.OCTET_COUNTING, Framing.LF]))
@settings(max_examples=200, deadline=None)
def test_hostile_names_never_break_the_frame_and_read_back_field_by_field(
        name: str, label: str, node: str, framing: Framing) -> None:
    record, line = sealed(name=name, label=label)
    wire = b"".join(frame(encode_record(record, line, Header.for_node(node)).message, framing) for _ in range(3))
    if framing is Framing.OCTET_COUNTING:
        messages, rest = split_octet_counted(wire)
        assert rest == b""
    else:
        messages = wire.split(b"\n")[:-1]
    assert len(messages) == 3
    for raw in messages:
        msg = parse_message(raw)
        assert msg.hostname == (node if node == header_hostname(node) else "-")
        assert json.loads(msg.msg) == record
        assert msg.sd["npaudit@32473"]["seq"] == "7"


@given(name=st.text(min_size=0, max_size=5000), max_bytes=st.integers(MIN_UDP_MAX_BYTES, 4096))
@settings(max_examples=200, deadline=None)
def test_an_oversized_udp_message_is_shortened_to_a_json_stub_that_names_the_record(name: str, max_bytes: int) -> None:
    record, line = sealed(name=name)
    enc = encode_record(record, line, Header.for_node("n" * 255), max_bytes=max_bytes)
    assert len(enc.message) <= max_bytes
    msg = parse_message(enc.message)
    if not enc.truncated:
        assert json.loads(msg.msg) == record
        return
    stub = json.loads(msg.msg)
    assert stub["npaudit"] == {"seq": 7, "chain": record["npaudit"]["chain"], "disposition": "Drop",
                               "truncated": True, "original_bytes": len(line) - 1}
    assert msg.sd["npaudit@32473"]["original_bytes"] == str(len(line) - 1)
    assert stub["@timestamp"] == record["@timestamp"]


def test_a_cap_below_what_any_stub_needs_is_an_error_not_a_broken_datagram() -> None:
    record, line = sealed(name="x" * 3000)
    with pytest.raises(SyslogFormatError, match="seq 7"):
        encode_record(record, line, Header(), max_bytes=200)


def test_octet_counting_counts_bytes_and_lf_framing_refuses_a_raw_line_feed() -> None:
    assert frame(b"<14>1 - - - - - - hi", Framing.OCTET_COUNTING) == b"20 <14>1 - - - - - - hi"
    assert frame(b"abc", Framing.DATAGRAM) == b"abc"
    with pytest.raises(SyslogFormatError):
        frame(b"a\nb", Framing.LF)


def test_an_unsealed_record_is_a_format_error() -> None:
    with pytest.raises(SyslogFormatError):
        encode_record({"npaudit": {"seq": "1"}}, b"{}", Header())


@given(fields=st.builds(RecordFields, st.integers(1, 2**53), st.one_of(st.none(), st.sampled_from(
           ["a" * 64, "0123456789abcdef" * 4]), st.text(max_size=70)),
           st.one_of(st.none(), st.sampled_from(["Allow", "Drop", "Reject", "Pass"]), st.text(max_size=8)),
           st.sampled_from(["-", "2026-11-30T02:14:03.512Z"]), st.booleans()),
       line=st.one_of(st.binary(max_size=200).map(lambda b: b.replace(b"\n", b"")), st.just(b'{"a":1}\n')),
       node=st.sampled_from(["node-a", "é", "n" * 255]),
       framing=st.sampled_from(list(Framing)), udp=st.booleans())
@example(fields=RecordFields(1, "a\nb", None, "-", False), line=b"", node="node-a", framing=Framing.LF, udp=False)
@example(fields=RecordFields(1, 'x"]\\', "Drop", "-", False), line=b"{}", node="node-a", framing=Framing.OCTET_COUNTING,
         udp=False)
@settings(max_examples=300, deadline=None)
def test_the_frame_encoder_writes_exactly_what_encode_record_and_frame_write(
        fields: RecordFields, line: bytes, node: str, framing: Framing, udp: bool) -> None:
    header = Header.for_node(node, "local5")
    max_bytes = 1024 if udp else None
    encoder = FrameEncoder(header, framing, max_bytes)
    try:
        expected = encode_record(fields, line, header, max_bytes)
        want: tuple[bytes, bool] | Exception = (frame(expected.message, framing), expected.truncated)
    except (SyslogFormatError, UnicodeEncodeError) as exc:  # a non-ASCII chain: never the tailer's
        want = exc
    if isinstance(want, Exception):
        with pytest.raises(type(want)):
            encoder.encode(fields, line)
    else:
        assert encoder.encode(fields, line) == want
