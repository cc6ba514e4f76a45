"""User data as text that prints as itself: every control, format and line/paragraph-separator character shown as
an escape (\\x1b, \\n, \\u202e), so no value can move the cursor, colour the terminal or forge a line. Its own
module: the verbs that print an agent's answers use it without loading the audit query machinery."""

from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["safe_text"]

_UNSAFE = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(value: Any) -> str:
    """`value` as text that prints as itself: control and invisible characters escaped."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escape(ch) if ch != " " and unicodedata.category(ch) in _UNSAFE else ch for ch in text)
