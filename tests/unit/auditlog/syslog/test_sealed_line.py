"""auditlog.syslog.sealed_line: the scan without a JSON parse gives json's fields, or steps aside for json."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditlog.chain import GENESIS, ChainError, RecordText, parse_line
from auditlog.syslog.rfc5424 import record_fields
from auditlog.syslog import sealed_line
from auditlog.syslog.sealed_line import read_fields, scan_sealed

HOSTILE = ['a"b', "x]y", "back\\slash", "ends\\", "new\nline", "café ☕", '"seq":5,', '"disposition":"Allow"',
           '{"seq":9}', "}}}", "{{[", '","chain":"' + "f" * 64 + '",', "\u2028", "z" * 5000]

# A Drop record as auditlog.record writes it (every member the writer's records carry).
TEMPLATE: dict[str, Any] = {
    "@timestamp": "2026-11-30T11:53:17.202Z",
    "destination": {"ip": "10.99.0.3", "port": 26357}, "ecs": {"version": "8.11.0"},
    "event": {"action": "dropped", "category": ["network"], "dataset": "npaudit.audit", "id": "10f814e97f1a42b1",
              "kind": "event", "outcome": "success", "type": ["connection", "denied"]},
    "labels": {"log_label": "bench"},
    "network": {"bytes": 98, "direction": "egress", "iana_number": "17", "packets": 1, "transport": "udp"},
    "npaudit": {"aggregate": {"bytes": 98, "packets": 1},
                "destination": {"pod": {"name": "postgres-0", "namespace": "backend"}}, "disposition": "Drop",
                "ovs": {"cookie": "0x0000000000000000", "in_port": 1, "table": 0}, "priority": 1,
                "source": {"pod": {"name": "client-5d8f7c9b4-x2k8q", "namespace": "frontend"}},
                "tier": "securityops"},
    "observer": {"hostname": "node-a", "product": "Open vSwitch", "vendor": "npaudit project"},
    "rule": {"id": "4242", "name": "drop-udp-0", "ruleset": "AntreaClusterNetworkPolicy:bench"},
    "source": {"ip": "10.99.0.2", "port": 2048},
}

# Mostly text without quotes or backslashes, where the scan must tell keys, values and nesting apart itself.
texts = st.one_of(st.text(alphabet="{}[]:,seqdisponAlw", max_size=12), st.sampled_from(HOSTILE),
                  st.text(max_size=40))
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**60, 2**60) | st.floats(allow_nan=False,
                           allow_infinity=False) | texts,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                               st.one_of(st.sampled_from(["seq", "disposition", "chain", "npaudit", 'x"seq']),
                                         texts), inner, max_size=3),
                           max_leaves=8)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """The template with hostile text where users write (Pod names, labels, rule names) and extra members."""
    record = copy.deepcopy(TEMPLATE)
    meta = record["npaudit"]
    meta["destination"]["pod"]["name"] = draw(texts)
    meta["source"]["pod"]["namespace"] = draw(texts)
    record["labels"]["log_label"] = draw(texts)
    record["rule"]["name"] = draw(texts)
    meta["disposition"] = draw(st.one_of(st.sampled_from(["Allow", "Drop", "Reject", "Pass"]), json_values))
    if draw(st.booleans()):
        del meta["disposition"]
    for target in (meta, record, meta["destination"]):
        target.update(draw(st.dictionaries(st.one_of(st.sampled_from(["seq", "disposition", "dz", 'd"seq', "loss",
                                                                      "chain_restart"]),
                                                     texts), json_values, max_size=2)))
    if draw(st.booleans()):
        record["@timestamp"] = draw(st.one_of(texts, json_values))
    meta.pop("seq", None)  # RecordText.of puts the seq in and drops a chain
    meta.pop("chain", None)
    return record


def sealed_lines(items: list[dict[str, Any]], first_seq: int = 1) -> list[tuple[bytes, str]]:
    """(line, chain of the record before it) for `items` sealed in a chain from GENESIS."""
    out, prev = [], GENESIS
    for seq, record in enumerate(items, first_seq):
        line, chain = RecordText.of(record).seal(prev, seq)
        out.append((line.encode("ascii"), prev))
        prev = chain
    return out


@given(st.lists(records(), min_size=1, max_size=4), st.integers(1, 2**53))
@settings(max_examples=400, deadline=None)
def test_the_scan_gives_what_json_gives_or_steps_aside(items: list[dict[str, Any]], first_seq: int) -> None:
    for line, prev in sealed_lines(items, first_seq):
        expected = record_fields(json.loads(line))
        assert scan_sealed(line, prev) in (None, expected)
        assert read_fields(line, prev) == expected


def test_the_writers_own_records_take_the_scan_even_with_hostile_text_outside_npaudit() -> None:
    items = []
    for i, text in enumerate(HOSTILE):
        record = copy.deepcopy(TEMPLATE)
        record["labels"]["log_label"] = text
        record["rule"]["name"] = text
        record["npaudit"]["disposition"] = ["Allow", "Drop", "Reject", "Pass"][i % 4]
        items.append(record)
    for line, prev in sealed_lines(items):
        if line.isascii() and "\\u" not in line.decode():
            assert scan_sealed(line, prev) == record_fields(json.loads(line))


def test_a_state_record_without_disposition_is_read_too() -> None:
    record = copy.deepcopy(TEMPLATE)
    del record["npaudit"]["disposition"]
    (line, prev), = sealed_lines([record])
    fields = scan_sealed(line, prev)
    assert fields is not None and fields.disposition is None and fields.seq == 1


@pytest.mark.parametrize("members,loss", [
    ({"loss": {"packet_ins": 3, "records": 0, "by_reason": []}}, True),
    ({"chain_restart": {"records_lost": 2, "after_seq": 4}}, True),
    ({"chain_restart": {"bytes": 17, "after_seq": 4}}, False),      # a torn write: no records lost
    ({"destination": {"loss": {"packet_ins": 3}}}, False),          # nested: not npaudit's own
    ({"loss": "many"}, False),                                       # not the loss object
])
def test_a_record_that_may_state_a_loss_is_parsed_and_says_whether_it_does(members: dict[str, Any],
                                                                            loss: bool) -> None:
    record = copy.deepcopy(TEMPLATE)
    del record["npaudit"]["disposition"]
    record["npaudit"].update(members)
    (line, prev), = sealed_lines([record])
    assert read_fields(line, prev) == record_fields(json.loads(line))
    assert read_fields(line, prev).loss is loss
    if any(key in members for key in ("loss", "chain_restart")):
        assert scan_sealed(line, prev) is None  # read from the parsed record


@pytest.mark.parametrize("members", [
    {"destination": {"disposition": "Allow"}},         # nested: not the record's disposition
    {"destination": {"seq": 99}},                      # a nested seq before the real one
    {"da": "}", "db": {"seq": 1}},                     # a brace in a string, to miscount the nesting
    {"da": '"}"', "db": {"seq": 1}},                   # quotes in a string, to pair quotes wrongly
    {"destination": {'"seq': 77}},                     # a key ending in "seq
    {"cz": ["}", {"disposition": "Pass"}]},
])
def test_a_key_that_only_looks_like_npaudits_own_is_never_taken_for_it(members: dict[str, Any]) -> None:
    record = copy.deepcopy(TEMPLATE)
    del record["npaudit"]["disposition"]
    record["npaudit"].update(members)  # keys between "chain_format" and "seq": where the scan looks
    (line, prev), = sealed_lines([record], 5)
    assert scan_sealed(line, prev) in (None, record_fields(json.loads(line)))
    assert read_fields(line, prev).seq == 5 and read_fields(line, prev).disposition is None


@pytest.mark.parametrize("disposition", ["Drop", "back\\slash", "x\ty", "caf\u00e9", 'q"q', None, 7, {"a": "b"}])
def test_the_disposition_is_the_strings_value_whatever_it_holds(disposition: Any) -> None:
    record = copy.deepcopy(TEMPLATE)
    record["npaudit"]["disposition"] = disposition
    (line, prev), = sealed_lines([record])
    assert scan_sealed(line, prev) in (None, record_fields(json.loads(line)))
    assert read_fields(line, prev).disposition == (disposition if isinstance(disposition, str) else None)


def test_a_line_that_does_not_follow_the_previous_chain_is_parsed_instead() -> None:
    (line, prev), = sealed_lines([TEMPLATE])
    assert scan_sealed(line, prev) is not None
    assert scan_sealed(line, "1" * 64) is None and scan_sealed(line, None) is None
    edited = line.replace(b"postgres-0", b"postgres-1")
    assert scan_sealed(edited, prev) is None
    assert read_fields(edited, prev) == record_fields(json.loads(edited))


def test_every_torn_prefix_is_refused_by_the_scan_and_by_json_alike() -> None:
    (line, prev), = sealed_lines([TEMPLATE])
    for cut in range(len(line)):
        assert scan_sealed(line[:cut], prev) is None
        with pytest.raises(ChainError):
            read_fields(line[:cut], prev)


@given(st.binary(max_size=300) | st.builds(lambda a, b: a + b, st.sampled_from([
    b'{"@timestamp":"x","npaudit":{"chain":"' + b"a" * 64 + b'","chain_format":2,"seq":3}}', b"{}"]),
    st.binary(max_size=40)))
@settings(max_examples=300, deadline=None)
def test_any_bytes_are_a_record_for_read_fields_exactly_when_they_are_one_for_parse_line(data: bytes) -> None:
    try:
        record, _, _ = parse_line(data)
    except ChainError:
        with pytest.raises(ChainError):
            read_fields(data, GENESIS)
        return
    assert read_fields(data, GENESIS) == record_fields(record)


def test_records_sharing_their_npaudit_text_share_the_cached_reading_but_keep_their_own_seq_and_chain() -> None:
    same = [copy.deepcopy(TEMPLATE) for _ in range(3)]
    long_name = copy.deepcopy(TEMPLATE)
    long_name["npaudit"]["destination"]["pod"]["name"] = "p" * 3000  # past the cached length: read each time
    lines = sealed_lines([*same, long_name, long_name], 7)
    sealed_line._members.cache_clear()
    fields = [scan_sealed(line, prev) for line, prev in lines]
    assert fields == [record_fields(json.loads(line)) for line, _ in lines]
    assert [f.seq for f in fields if f is not None] == [7, 8, 9, 10, 11] and len({f.chain for f in fields}) == 5
    info = sealed_line._members.cache_info()
    assert (info.misses, info.hits, info.currsize) == (1, 2, 1)
