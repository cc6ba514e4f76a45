"""RFC 8785 JSON Canonicalization Scheme (JCS): the text the audit chain hashes, and its ASCII file form.

JCS (https://www.rfc-editor.org/rfc/rfc8785) writes a JSON value one way only:

- objects with members sorted by their keys as UTF-16 code units, arrays in
  order, no whitespace; ``true`` ``false`` ``null``;
- strings with the fewest escapes: ``\\"`` and ``\\\\``, control characters
  U+0000..U+001F as ``\\b \\f \\n \\r \\t`` or ``\\u00xx`` (lowercase hex);
  everything else, DEL and U+2028 included, as itself (UTF-8 once encoded);
- numbers as ECMAScript prints an IEEE 754 double: ``10.0`` -> ``10``,
  ``-0.0`` -> ``0``, ``1e21`` -> ``1e+21``, ``0.000001`` but ``1e-7``, shortest
  digits that read back the same. An integer beyond 2**53 is rounded to a double
  first (so ``2**64`` -> ``18446744073709552000``); NaN and Infinity are refused.

Any JSON tool that keeps the data model (jq, Python json, Go encoding/json,
JavaScript JSON.stringify, rsyslog's mmjsonparse) therefore yields the same JCS
text for a record as the writer hashed, whatever its own key order, escapes or
number form. `ascii_form` is the text with every character above U+007F written
as a ``\\uxxxx`` escape: what the audit files hold, pure ASCII, and JCS itself
whenever the record is.
"""

from __future__ import annotations

import json.encoder
import math
import re
from typing import Any, Callable

__all__ = ["SAFE_INTEGER", "ascii_form", "canonical", "number"]

SAFE_INTEGER = 2**53  # integers up to this size are exact as doubles, printed as they are

_string: Callable[[str], str] = json.encoder.encode_basestring  # escapes exactly what JCS escapes
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_NON_ASCII = re.compile("[^\x00-\x7f]")


def number(value: int | float) -> str:
    """The ECMAScript text of a number (ValueError for NaN, Infinity, or an integer beyond any double)."""
    if type(value) is int and -SAFE_INTEGER <= value <= SAFE_INTEGER:
        return str(value)
    try:
        x = float(value)
    except OverflowError as exc:
        raise ValueError(f"{value} is beyond the range of a JSON number") from exc
    if not math.isfinite(x):
        raise ValueError(f"{x} is not a JSON number")
    if x == 0:
        return "0"
    # repr gives the shortest digits that read back as x (what ECMAScript wants too);
    # only where the decimal point goes, and when to use an exponent, differ.
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    padded = whole + fraction
    digits = padded.lstrip("0")
    point = len(whole) + (int(exp) if exp else 0) - (len(padded) - len(digits))  # x = 0.DIGITS * 10**point
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        text = digits + "0" * (point - k)
    elif 0 < point <= 21:
        text = f"{digits[:point]}.{digits[point:]}"
    elif -6 < point <= 0:
        text = f"0.{'0' * -point}{digits}"
    else:
        e = point - 1
        text = f"{digits[0]}{'.' + digits[1:] if k > 1 else ''}e{'+' if e >= 0 else '-'}{abs(e)}"
    return "-" + text if x < 0 else text


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _write(value: Any, out: Callable[[str], Any]) -> None:
    kind = type(value)
    if kind is str:
        out(_string(value))
    elif kind is dict:
        keys = sorted(value)
        if keys and not all(type(k) is str for k in keys):
            raise TypeError("JSON object keys must be strings")
        if _ASTRAL.search("".join(keys)):  # only there does code point order differ from UTF-16 order
            keys.sort(key=_utf16)
        out("{")
        first = True
        for key in keys:
            if not first:
                out(",")
            first = False
            out(_string(key))
            out(":")
            _write(value[key], out)
        out("}")
    elif kind is list or kind is tuple:
        out("[")
        for i, item in enumerate(value):
            if i:
                out(",")
            _write(item, out)
        out("]")
    elif value is None:
        out("null")
    elif value is True:
        out("true")
    elif value is False:
        out("false")
    elif kind is int or kind is float:
        out(number(value))
    elif isinstance(value, str):
        out(_string(str(value)))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out(number(int(value) if isinstance(value, int) else float(value)))
    elif isinstance(value, dict):
        _write(dict(value), out)
    else:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")


def canonical(value: Any) -> str:
    """The JCS text of `value` (dicts, lists, tuples, str, int, float, bool, None).

    TypeError or ValueError for what JSON cannot hold. A lone surrogate is kept as
    it is: encoding the text to UTF-8 (as hashing does) raises then.
    """
    parts: list[str] = []
    _write(value, parts.append)
    return "".join(parts)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return "\\u%04x" % code
    code -= 0x10000
    return "\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF))


def ascii_form(text: str) -> str:
    """JSON text with every character above U+007F as a \\uxxxx escape (pairs above U+FFFF): same value, ASCII."""
    return text if text.isascii() else _NON_ASCII.sub(_escape, text)
