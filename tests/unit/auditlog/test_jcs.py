"""auditlog.jcs: RFC 8785 text, checked against the RFC's number vectors and a plain reference written here."""

from __future__ import annotations

import json
import math
import struct
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditlog.jcs import ascii_form, canonical, number

# RFC 8785 Appendix B: IEEE 754 bit patterns and their ECMAScript text.
RFC8785_NUMBERS = {
    0x0000000000000000: "0", 0x8000000000000000: "0", 0x0000000000000001: "5e-324",
    0x8000000000000001: "-5e-324", 0x7fefffffffffffff: "1.7976931348623157e+308",
    0xffefffffffffffff: "-1.7976931348623157e+308", 0x4340000000000000: "9007199254740992",
    0xc340000000000000: "-9007199254740992", 0x4430000000000000: "295147905179352830000",
    0x44b52d02c7e14af5: "9.999999999999997e+22", 0x44b52d02c7e14af6: "1e+23",
    0x44b52d02c7e14af7: "1.0000000000000001e+23", 0x444b1ae4d6e2ef4e: "999999999999999700000",
    0x444b1ae4d6e2ef4f: "999999999999999900000", 0x444b1ae4d6e2ef50: "1e+21",
    0x3eb0c6f7a0b5ed8c: "9.999999999999997e-7", 0x3eb0c6f7a0b5ed8d: "0.000001",
    0x41b3de4355555553: "333333333.3333332", 0x41b3de4355555554: "333333333.33333325",
    0x41b3de4355555555: "333333333.3333333", 0x41b3de4355555556: "333333333.3333334",
    0x41b3de4355555557: "333333333.33333343", 0xbecbf647612f3696: "-0.0000033333333333333333",
    0x43143ff3c1cb0959: "1424953923781206.2",
}


def _double(bits: int) -> float:
    value: float = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
    return value


@pytest.mark.parametrize("bits, text", RFC8785_NUMBERS.items(), ids=[f"{b:016x}" for b in RFC8785_NUMBERS])
def test_numbers_are_written_as_rfc8785_shows(bits: int, text: str) -> None:
    assert number(_double(bits)) == text


def test_what_python_and_ecmascript_print_differently_is_written_the_ecmascript_way() -> None:
    assert [number(x) for x in (10.0, -0.0, 1e21, 1e-7, 1e-5, 1e16, 5.5, 2**64)] == [
        "10", "0", "1e+21", "1e-7", "0.00001", "10000000000000000", "5.5", "18446744073709552000"]
    assert number(2**53) == "9007199254740992" and number(2**53 + 1) == "9007199254740992"  # as a double


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 10**400])
def test_what_json_cannot_hold_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError):
        canonical({"x": bad})


# --- a plain reference, written from the RFC's words, for generated values ---

def ref_number(x: float) -> str:
    """ECMA-262 Number::toString: the fewest digits that read back as x, the closest if several (even on a tie)."""
    if x == 0:
        return "0"
    if x < 0:
        return "-" + ref_number(-x)
    exact = Decimal(x)
    for precision in range(1, 18):
        quantum = Decimal(1).scaleb(exact.adjusted() - precision + 1)
        found = [c for c in {exact.quantize(quantum, ROUND_FLOOR), exact.quantize(quantum, ROUND_CEILING)}
                 if float(c) == x]
        if found:
            best = min(found, key=lambda c: (abs(c - exact), int(c.as_tuple().digits[-1]) % 2))
            break
    text = f"{best:e}"
    mantissa, exponent = text.split("e")
    digits = mantissa.replace(".", "").rstrip("0")
    k, n = len(digits), int(exponent) + 1
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    sign = "+" if n - 1 >= 0 else "-"
    return digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + sign + str(abs(n - 1))


ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def ref_string(s: str) -> str:
    return '"' + "".join(ESCAPES.get(c, f"\\u{ord(c):04x}" if ord(c) < 0x20 else c) for c in s) + '"'


def reference(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value) if abs(value) <= 2**53 else ref_number(float(value))
    if isinstance(value, float):
        return ref_number(value)
    if isinstance(value, str):
        return ref_string(value)
    if isinstance(value, list):
        return "[" + ",".join(reference(v) for v in value) + "]"
    keys = sorted(value, key=lambda k: [int.from_bytes(k.encode("utf-16-be")[i:i + 2], "big")
                                        for i in range(0, len(k.encode("utf-16-be")), 2)])
    return "{" + ",".join(ref_string(k) + ":" + reference(value[k]) for k in keys) + "}"


floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [10.0, -0.0, 1e21, 1e-7, 1e-6, 0.1, 5.5, 1e300, 5e-324, 123456789012345.6])
leaves = st.none() | st.booleans() | st.integers(-2**70, 2**70) | floats | st.text(
    st.characters(exclude_categories=["Cs"]), max_size=12)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=4), inner, max_size=5), max_leaves=25)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_canonical_agrees_with_the_reference(value: Any) -> None:
    text = canonical(value)
    assert text == reference(value)
    # Parsed back and written again: the same text (the property the chain relies on).
    assert canonical(json.loads(text)) == text
    assert json.loads(ascii_form(text)) == json.loads(text) and ascii_form(text).isascii()


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_double_reads_back_from_its_text(x: float) -> None:
    assert float(number(x)) == x and number(x) == ref_number(x)


def test_keys_sort_by_utf16_code_units_not_code_points() -> None:
    # U+1F600 is D83D DE00 in UTF-16: before U+FFFF there, after it by code point.
    assert canonical({"\uffff": 1, "\U0001F600": 2, "a": 3}) == '{"a":3,"\U0001F600":2,"\uffff":1}'


def test_only_quote_backslash_and_controls_are_escaped() -> None:
    assert canonical("\"\\/\x7f\u2028é\x1f\b") == '"\\"\\\\/\x7f\u2028é\\u001f\\b"'
    assert ascii_form('"é\U0001F600"') == '"\\u00e9\\ud83d\\ude00"'
