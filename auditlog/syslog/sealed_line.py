"""A sealed line's seq, chain, disposition and @timestamp without parsing its JSON, when its chain proves its form.

The writer's line has the layout auditlog.chain defines (RecordText, CHAIN_KEY ...
SEQ_KEY): canonical JCS in ASCII form, npaudit.chain right before
``"chain_format":2,``, and everything up to ``"seq":`` inside the npaudit object.
`scan_sealed` trusts that layout only once chain.sealed_chain proves the line,
with its chain member cut out, hashes to that chain after the previous record's
chain (the shortcut of the auditlog.chain docstring), i.e. it is byte for byte
what the writer sealed: a torn line, a line some other tool wrote or an edited one
fails that test. Even then it reads only what it can prove in that text:

- no ``\\"`` between ``"chain_format"`` and ``"seq":``, so every quote there
  delimits a string and a key can be told from text inside a value;
- the brackets outside strings before ``"seq":`` (and ``"disposition":``)
  balance, so the key is npaudit's own and not one in a nested object;
- string values without a backslash, so the bytes are the value;
- no ``loss`` or ``chain_restart`` member: the rare records that may state a loss
  (RecordFields.loss) are parsed.

Anything else returns None and `read_fields` parses the JSON instead
(chain.parse_line); both ways give the same fields.

The forwarder reads every line through here (bench/syslog_throughput.py), so the
byte work (layout, digest, seq) is one call in C where it is built (c_parts_of,
auditlog/_scan_fast.c; _parts_of is the same in Python), and what the npaudit text
between ``"chain_format"`` and ``"seq"`` says is cached by those bytes, which
depend on the rule and the Pods, not on the packet.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Literal, TypeAlias

from auditlog import record_fast
from auditlog.chain import (CHAIN_KEY, CHAIN_MEMBER_LEN, FORMAT_MEMBER, SEQ_KEY, TIMESTAMP_KEY, chain_member_at,
                            parse_line, sealed_chain)
from auditlog.syslog.rfc5424 import RecordFields, record_fields, valid_timestamp

__all__ = ["CACHED_SEGMENT", "CHAIN_KEY_BYTES", "FORMAT_MEMBER_BYTES", "PartsOf", "SEQ_KEY_BYTES",
           "TIMESTAMP_KEY_BYTES", "c_parts_of", "members_of", "read_fields", "scan_sealed", "timestamp_of"]

Parts: TypeAlias = tuple[str, bytes, int, bytes]  # chain, npaudit text up to "seq", seq, @timestamp text
PartsOf: TypeAlias = Callable[[bytes, str], "Parts | None"]

TIMESTAMP_KEY_BYTES = TIMESTAMP_KEY.encode("ascii")
SEQ_KEY_BYTES = SEQ_KEY.encode("ascii")
CHAIN_KEY_BYTES, FORMAT_MEMBER_BYTES = CHAIN_KEY.encode("ascii"), FORMAT_MEMBER.encode("ascii")
_DISPOSITION = b"disposition"
_PARSED_KEYS = (b"loss", b"chain_restart")  # npaudit members whose records are parsed (rfc5424.states_loss)
_SEQ_VALUE = re.compile(rb"[1-9][0-9]{0,15}(?=[,}])")  # JCS writes integers below 2**53 as plain digits
CACHED_SEGMENT = 1024  # longer segments (hostile Pod names, say) are not kept in the cache


def scan_sealed(line: bytes, prev_chain: str | None, parts_of: PartsOf | None = None) -> RecordFields | None:
    """The fields of `line` (no newline) if it is the writer's sealed text following `prev_chain`, else None.
    `parts_of`: what finds the line's parts (c_parts_of(), the same parts in C), else this module's Python."""
    if prev_chain is None:
        return None
    parts = (parts_of or _parts_of)(line, prev_chain)
    if parts is None:
        return None
    chain, segment, seq, stamp_text = parts
    disposition = (_members if len(segment) <= CACHED_SEGMENT else members_of)(segment)
    if disposition is False:
        return None
    stamp = timestamp_of(stamp_text)
    if stamp is None:
        return None
    return RecordFields(seq, chain, disposition, stamp)


def _parts_of(line: bytes, prev_chain: str) -> Parts | None:
    """The line's chain (proved: chain.sealed_chain), the npaudit text from after its chain member up to and
    including the quote that opens "seq", its seq and the text of its @timestamp; None if the line does not
    have the sealed layout or does not follow `prev_chain`."""
    if not line.startswith(TIMESTAMP_KEY_BYTES) or not line.isascii():
        return None  # the writer's lines are ASCII; a raw UTF-8 copy is left to the JSON parser
    at = chain_member_at(line)
    if at < 0:
        return None
    chain = sealed_chain(prev_chain, line, at)
    if chain is None:
        return None  # not what the writer sealed after prev_chain (the digest also proves the chain is hex)
    member_end = at + CHAIN_MEMBER_LEN
    seq_at = line.find(SEQ_KEY_BYTES, member_end)
    if seq_at < 0:
        return None
    seq = _SEQ_VALUE.match(line, seq_at + len(SEQ_KEY_BYTES))
    if seq is None:
        return None
    # Up to and including the quote that opens "seq": a \" ending there counts too.
    segment = line[member_end:seq_at + 1]
    return chain, segment, int(seq.group()), line[len(TIMESTAMP_KEY_BYTES):line.find(b'"', len(TIMESTAMP_KEY_BYTES))]


def c_parts_of() -> PartsOf | None:
    """_parts_of in C (auditlog/_scan_fast.c: one call, no copies of the line) where records are built in C
    here (auditlog.record_fast.mode()), else None. A line that is not bytes, or a chain that is not ASCII,
    goes the Python way."""
    sealed_parts = record_fast.sealed_parts()
    if sealed_parts is None:
        return None

    def parts_of(line: bytes, prev_chain: str) -> Parts | None:
        if type(line) is bytes and prev_chain.isascii():
            return sealed_parts(line, prev_chain, TIMESTAMP_KEY_BYTES, CHAIN_KEY_BYTES, FORMAT_MEMBER_BYTES,
                                SEQ_KEY_BYTES)
        return _parts_of(line, prev_chain)
    return parts_of


def members_of(segment: bytes) -> str | None | Literal[False]:
    """npaudit's disposition (see _string_member) in the text from after "chain_format" to the quote that opens
    "seq", if "seq" there is npaudit's own member; False if unsure (an escaped quote, nesting not closed).

    It depends on those bytes alone, and the writer's records share a few of them (one per rule and
    destination Pod, say), so `_members` caches it: most records then cost one dictionary look-up here."""
    if segment.find(b'\\"') >= 0:
        return False
    parts = segment[:-1].split(b'"')  # odd items: the strings (keys and values) in npaudit
    if len(parts) % 2 == 0 or not _object_level(parts, len(parts)):
        return False
    if any(_key_index(parts, key) is not None for key in _PARSED_KEYS):
        return False  # it may state a loss (rfc5424.states_loss): read from the parsed record
    return _string_member(parts, _DISPOSITION)


_members = functools.lru_cache(maxsize=512)(members_of)


@functools.lru_cache(maxsize=64)
def timestamp_of(text: bytes) -> str | None:
    """valid_timestamp of a string's bytes (None if it has an escape); records of one burst share a few stamps."""
    return None if b"\\" in text else valid_timestamp(text.decode("ascii"))


def _object_level(parts: list[bytes], end: int) -> bool:
    """Whether the text outside strings in parts[:end] closes every object it opens.

    Only objects count: a key is always directly in an object, so at object
    depth 0 it is npaudit's own, whatever arrays came before.
    """
    outside = b"".join(parts[0:end:2])
    return outside.count(b"{") == outside.count(b"}")


def _key_index(parts: list[bytes], key: bytes) -> int | None:
    """Where npaudit's own member `key` is among `parts` (the index of its name), None if it has none."""
    index = 0
    while True:
        try:
            index = parts.index(key, index + 1)
        except ValueError:
            return None
        if index % 2 == 0 or not parts[index + 1].startswith(b":") or not _object_level(parts, index):
            continue  # text outside a string, a value, or a key of a nested object
        return index


def _string_member(parts: list[bytes], key: bytes) -> str | None | Literal[False]:
    """npaudit's member `key` among `parts`: its string value, None if absent or no string, False if unsure."""
    index = _key_index(parts, key)
    if index is None:
        return None
    if parts[index + 1] != b":":
        return None  # npaudit's member, but its value is no string
    value = parts[index + 2]
    return False if b"\\" in value else value.decode("ascii")


def read_fields(line: bytes, prev_chain: str | None, parts_of: PartsOf | None = None) -> RecordFields:
    """The fields of one line: `scan_sealed`, else from its parsed JSON; ChainError if it is no sealed record."""
    fields = scan_sealed(line, prev_chain, parts_of)
    if fields is not None:
        return fields
    record, _, _ = parse_line(line)
    return record_fields(record)
