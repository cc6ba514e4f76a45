"""The byte work of the forwarder's scan in C (auditlog/_scan_fast.c through sealed_line.c_parts_of): the parts
the Python (sealed_line._parts_of) finds, on lines built to pass the digest so every later check is reached, on
the writer's own lines and on lines that fail early; and the fields scan_sealed gives either way."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditlog import record_fast
from auditlog.chain import CHAIN_KEY, FORMAT_MEMBER, GENESIS, SEQ_KEY, TIMESTAMP_KEY, RecordText
from auditlog.syslog import sealed_line
from auditlog.syslog.sealed_line import c_parts_of, read_fields, scan_sealed

TK, CK, FM, SK = (k.encode("ascii") for k in (TIMESTAMP_KEY, CHAIN_KEY, FORMAT_MEMBER, SEQ_KEY))

# What the checks look at, so that drawn text trips each of them: quotes, escapes, terminators, digits (a
# leading 0, 16 and 17 of them), keys (a second chain key, a seq key before the member), a byte past ASCII.
TOKENS = [b'"', b"\\", b",", b"}", b"{", b":", b"0", b"1", b"9", b"a", b"seq", SK, SK + b"1", SK + b"0,",
          SK + b"7,", SK + b"42}", SK + b"1234567890123456,", SK + b"12345678901234567,", b'"chain_format":3,',
          b'"disposition":"Drop",', b'"disposition":"Al\\"low",', b'"loss":{}']
RARE = [CK, FM, b"\x80", b"\xff", b"\n"]  # each ends most lines' scan early: drawn into a few lines only


@st.composite
def pieces(draw: st.DrawFn) -> bytes:
    out = draw(st.lists(st.sampled_from(TOKENS), max_size=8))
    if draw(st.integers(0, 9)) == 0:
        out.insert(draw(st.integers(0, len(out))), draw(st.sampled_from(RARE)))
    return b"".join(out)


chains = st.one_of(st.sampled_from([GENESIS, "0" * 64, "f" * 64, ""]), st.text(alphabet="0123456789abcdefX", max_size=70))


def _c() -> Any:
    parts_of = c_parts_of()
    assert parts_of is not None, "auditlog._record_fast is not built: `make setup` compiles it"
    return parts_of


@st.composite
def hashed_lines(draw: st.DrawFn) -> tuple[bytes, str]:
    """(line, prev_chain): a line with a chain member whose 64 characters are (mostly) the right digest of the
    rest after prev_chain, whatever the rest holds."""
    prev = draw(chains)
    # The passing choice drawn most often, so most lines get past the early checks and reach the later ones.
    head = draw(st.sampled_from([TK] * 4 + [TK[:-1], b"", b'{"@timestamp":"2026-11-30T11:53:17.202Z"'])) + draw(pieces())
    member_end = draw(st.sampled_from([b'",' + FM] * 6 + [b'",' + FM[:-1], b'"' + FM, b'",', b'",' + FM + FM]))
    tail = draw(pieces()) + draw(st.sampled_from([t for t in TOKENS if t.startswith(SK)] + [b""])) + draw(pieces())
    body = head + member_end[2:] + tail if member_end.startswith(b'",') else head + member_end[1:] + tail
    digest = hashlib.sha256(prev.encode("ascii") + b"\n" + head + body[len(head):]).hexdigest()
    chain = draw(st.sampled_from([digest] * 6 + [digest.upper(), digest[:-1] + "0", "g" * 64, digest[:63]]))
    return head + CK + chain.encode("ascii") + member_end + tail, prev


@settings(max_examples=3000, deadline=None)
@given(hashed_lines())
def test_the_c_parts_are_the_python_parts_on_lines_that_reach_every_check(case: tuple[bytes, str]) -> None:
    line, prev = case
    assert _c()(line, prev) == sealed_line._parts_of(line, prev)
    assert scan_sealed(line, prev, _c()) == scan_sealed(line, prev)


def test_the_drawn_lines_reach_the_end_both_ways() -> None:
    """The strategy is not vacuous: lines it can draw pass every check, in C as in Python."""
    prev = GENESIS
    head = TK + b'2026-11-30T11:53:17.202Z","npaudit":{'
    rest = FM + b'"disposition":"Drop",' + SK + b"1234567890123456," + b'"x":1}}'
    digest = hashlib.sha256(prev.encode() + b"\n" + head + rest).hexdigest()
    line = head + CK + digest.encode() + b'",' + rest
    expected = (digest, FM + b'"disposition":"Drop","', 1234567890123456, b"2026-11-30T11:53:17.202Z")
    assert _c()(line, prev) == sealed_line._parts_of(line, prev) == expected
    assert scan_sealed(line, prev, _c()).disposition == "Drop"  # type: ignore[union-attr]
    too_long = line.replace(b"1234567890123456,", b"12345678901234567,")  # a 17th digit: no seq
    digest2 = hashlib.sha256(prev.encode() + b"\n" + head + rest.replace(b"456,", b"4567,")).hexdigest()
    too_long = too_long.replace(digest.encode(), digest2.encode())
    assert _c()(too_long, prev) is None and sealed_line._parts_of(too_long, prev) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a\"b", "x]y", "back\\slash", "café", '"seq":5,', "}}}", "{{[", "z" * 3000, "pod-0"]),
                min_size=1, max_size=6))
def test_the_writers_own_lines_give_the_same_fields_in_c_and_in_python(names: list[str]) -> None:
    prev = GENESIS
    for seq, name in enumerate(names, 1):
        record = {"@timestamp": "2026-11-30T11:53:17.202Z", "npaudit": {"disposition": "Drop", "pod": name},
                  "rule": {"name": name}}
        text, chain = RecordText.of(record).seal(prev, seq)
        line = text.encode("utf-8")
        assert _c()(line, prev) == sealed_line._parts_of(line, prev)
        assert read_fields(line, prev, _c()) == read_fields(line, prev)
        prev = chain


def test_what_c_does_not_take_goes_the_python_way() -> None:
    prev = GENESIS
    text, _ = RecordText.of({"@timestamp": "2026-11-30T11:53:17.202Z", "npaudit": {"disposition": "Allow"}}).seal(
        prev, 1)
    line = text.encode("ascii")
    fields = scan_sealed(line, prev)
    assert fields is not None and fields.seq == 1
    assert scan_sealed(line, prev, _c()) == fields
    with pytest.raises(UnicodeEncodeError):  # a chain not ASCII: Python, which raises as it always did
        scan_sealed(line, "é" * 64, _c())
    with pytest.raises(TypeError):
        record_fast.sealed_parts()(bytearray(line), prev, TK, CK, FM, SK)  # type: ignore[misc]
    with pytest.raises(ValueError):
        record_fast.sealed_parts()(line, "é", TK, CK, FM, SK)  # type: ignore[misc]


def test_pure_python_mode_has_no_c_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")
    assert c_parts_of() is None
