r"""Hash chain over audit records (npaudit.seq, npaudit.chain): seal a record, check a line.

Canonical form, version 1 (enough to re-implement `npaudit verify` elsewhere)
-----------------------------------------------------------------------------
Every audit record is one JSON object on one line. Its vendor object ``npaudit``
carries ``seq`` (1, 2, 3, ... with no gaps, across rotated files and agent
restarts) and ``chain`` (64 lowercase hex digits).

``encode(x)`` is Python's ``json.dumps(x, sort_keys=True, separators=(",", ":"),
ensure_ascii=True, allow_nan=False)``:

- objects ``{"k":v,...}`` with keys sorted by Unicode code point, no whitespace;
  arrays ``[a,b]``; ``true`` ``false`` ``null``; integers in decimal;
- strings: ``"`` -> ``\"``, ``\`` -> ``\\``, newline/CR/tab/backspace/formfeed
  -> ``\n \r \t \b \f``; every other character outside U+0020..U+007E ->
  ``\uXXXX`` (lowercase hex; above U+FFFF as a UTF-16 surrogate pair). So a line
  is pure ASCII and no user-controlled string can break it;
- floats as Python's ``repr`` (the shortest text that reads back the same:
  ``100.0``, ``0.5``, ``1e-05``, ``1e+16``); npaudit.priority is one. NaN and
  Infinity are refused. A lone surrogate stays a ``\udXXX`` escape (records
  built by auditlog.record carry none).

For the record with sequence number ``seq``::

    body  = encode(record with npaudit.seq = seq and WITHOUT the key npaudit.chain)
    chain = hex(SHA-256(ASCII bytes of prev_chain + "\n" + body))
    line  = encode(record with npaudit.chain = chain)   # written to the file + "\n"

``prev_chain`` is the chain of record ``seq - 1``, or GENESIS (64 "0") for seq 1.
A verifier parses each line, removes npaudit.chain, re-encodes and hashes, so
what is protected is the record's content; key order or whitespace of the stored
line does not matter.

What the chain can and cannot show: a removed, edited, reordered or truncated
record anywhere before the newest record breaks the chain. Records cut from the
very end, or the oldest files removed (which retention does anyway), leave a
shorter chain that is still valid: compare the head (last seq and chain) with a
copy held elsewhere, e.g. the records forwarded to syslog. There is no key, so
someone who can rewrite every later line can forge a consistent chain; the
forwarded copy is what makes that visible.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import json.encoder
import re
import uuid
from typing import Any, Callable, Mapping

from auditlog.errors import AuditLogError

try:
    import orjson as _orjson
except ImportError:  # the canonical encoder alone is correct, only slower
    _orjson = None

GENESIS = "0" * 64

# Kinds of ChainError (check_line) and of breaks reported by verify.
UNPARSEABLE = "unparseable"      # not JSON, not an object, or not ASCII
UNSEALED = "unsealed"            # JSON object without a valid npaudit.seq / npaudit.chain
SEQ_GAP = "seq_gap"              # seq jumps forward: records missing (or seq edited)
SEQ_REORDER = "seq_reorder"      # seq goes backwards or repeats: reordered or duplicated
CHAIN_MISMATCH = "chain_mismatch"  # seq as expected but content or chain differ: edited

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _unencodable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _make_encode() -> Callable[[Any], str]:
    # The C encoder made once, without the circular-reference check, is about
    # twice as fast as JSONEncoder.encode, which rebuilds it on every call; the
    # output is identical (a cycle ends in RecursionError instead of ValueError).
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    c_encode = make(None, _unencodable, json.encoder.encode_basestring_ascii, None,
                    ":", ",", True, False, False)
    return lambda value: "".join(c_encode(value, 0))


_json_encode = _make_encode()
# orjson writes the same text as the encoder above for sorted keys, ASCII strings,
# integers and most floats, ~8x faster (~3 us instead of ~25 us per record on
# this VM, the largest cost per record). Where the two could differ, the slow
# encoder decides: non-ASCII or DEL (json escapes them), floats printed with an
# exponent or below 1e-4 (orjson writes 0.00001 where json writes 1e-05), and
# anything orjson refuses. The canonical form is json's; orjson is only a shortcut.
# One scan for all of them: a digit before an exponent, a small fraction, DEL, null
# (orjson's NaN), or a byte outside ASCII. A false hit (e.g. "1e-5" inside a name)
# costs the slow path only, never a different text.
_MAY_DIFFER = re.compile(rb"[0-9]e[-+]|0\.0000|\x7f|null|[\x80-\xff]")


def _encode(value: Any) -> str:
    if _orjson is not None:
        try:
            out = _orjson.dumps(value, option=_orjson.OPT_SORT_KEYS)
        except (TypeError, ValueError):
            return _json_encode(value)
        if _MAY_DIFFER.search(out) is None:
            return out.decode("ascii")
    return _json_encode(value)
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ChainError(AuditLogError):
    """A line that does not continue the chain; `kind` is one of the constants above."""

    def __init__(self, kind: str, detail: str, *, expected: int | None = None,
                 found: int | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.expected = expected
        self.found = found


def encode(value: Any) -> str:
    """The canonical JSON text of `value` (see the module docstring)."""
    return _encode(value)


def _hash(prev_chain: str, body: str) -> str:
    return hashlib.sha256(f"{prev_chain}\n{body}".encode("ascii")).hexdigest()


class RecordText:
    """A record already in canonical form, with its two chain fields left open.

    The canonical text of the record with npaudit.seq = N and without npaudit.chain
    is ``head + mid + str(N) + tail``; its line adds ``"chain":"<hex>",`` between
    head and mid. So `head` ends just after npaudit's first member ("aggregate",
    which every policy record has and which sorts before "chain"), and `mid` ends
    with ``"seq":``. Sealing is then one hash and two string joins, no encoding
    (auditlog.record builds these directly; tests prove the text canonical).
    `seq` is 0 until sealed.
    """

    __slots__ = ("head", "mid", "tail", "seq")

    def __init__(self, head: str, mid: str, tail: str) -> None:
        self.head = head
        self.mid = mid
        self.tail = tail
        self.seq = 0

    def body(self, seq: int) -> str:
        """The canonical text with npaudit.seq = seq and no chain: what the chain hashes."""
        return f"{self.head}{self.mid}{seq}{self.tail}"

    def seal(self, prev_chain: str, seq: int) -> tuple[str, str]:
        """(line, chain) for this record as number `seq` after `prev_chain`."""
        head, mid, tail = self.head, self.mid, self.tail
        chain = _sha256(f"{prev_chain}\n{head}{mid}{seq}{tail}".encode("ascii")).hexdigest()
        self.seq = seq
        return f'{head}"chain":"{chain}",{mid}{seq}{tail}', chain

    def record(self) -> dict[str, Any]:
        """The record as a dict (seq as sealed, no chain): for tests and tools, not the hot path."""
        parsed: dict[str, Any] = json.loads(self.body(self.seq))
        return parsed

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RecordText:
        """The RecordText of a record given as a dict; its npaudit.seq and npaudit.chain, if any, are ignored.

        For the rare record not built by auditlog.record (the writer's chain-restart
        record). The canonical form sorts keys at every level, so the text is the
        members encoded one by one, npaudit's split around "chain" and "seq". Raises
        TypeError or ValueError for what it cannot hold (NaN, a set, a non-object npaudit).
        """
        meta = record.get("npaudit", {})
        if not isinstance(meta, dict):
            raise TypeError("record['npaudit'] must be an object")
        outer = sorted(k for k in record if k != "npaudit")
        inner = sorted(k for k in meta if k not in ("chain", "seq"))
        head = ("{" + "".join(_member(k, record[k]) + "," for k in outer if k < "npaudit") + '"npaudit":{'
                + "".join(_member(k, meta[k]) + "," for k in inner if k < "chain"))
        mid = "".join(_member(k, meta[k]) + "," for k in inner if k < "seq" and k > "chain") + '"seq":'
        tail = ("".join("," + _member(k, meta[k]) for k in inner if k > "seq") + "}"
                + "".join("," + _member(k, record[k]) for k in outer if k > "npaudit") + "}")
        return cls(head, mid, tail)


def _member(key: str, value: Any) -> str:
    return f"{_encode(key)}:{_encode(value)}"


def chain_restart_record(*, file: str, line: int, offset: int, nbytes: int, after_seq: int, now: float,
                         context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The state record that starts a new chain segment after bytes that are not a record.

    `context` adds fields every record of the node carries (observer, orchestrator).
    """
    stamp = dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="milliseconds")
    record: dict[str, Any] = copy.deepcopy(dict(context or {}))
    record.update({
        "@timestamp": stamp.replace("+00:00", "Z"),
        "event": {"id": uuid.uuid4().hex, "kind": "state", "category": ["file"], "type": ["info"],
                  "action": "chain-restart", "reason": "torn-write"},
        "message": (f"audit chain continues after {nbytes} bytes at {file} line {line} (offset {offset}) "
                    f"that are not a complete record (a write cut short); last good seq {after_seq}"),
        "npaudit": {"chain_restart": {"file": file, "line": line, "offset": offset, "bytes": nbytes,
                                      "after_seq": after_seq}},
    })
    return record


_sha256 = hashlib.sha256


def digest(prev_chain: str, record: dict[str, Any]) -> str:
    """The chain value `record` must carry if it follows `prev_chain` (its own chain ignored)."""
    meta = record["npaudit"]
    unchained = dict(record)
    unchained["npaudit"] = {k: v for k, v in meta.items() if k != "chain"}
    return _hash(prev_chain, _encode(unchained))


def parse_line(line: str | bytes) -> tuple[dict[str, Any], int, str]:
    """(record, seq, chain) of one line; ChainError unparseable/unsealed otherwise."""
    try:
        if isinstance(line, bytes):
            line = line.decode("ascii")
        record = json.loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ChainError(UNPARSEABLE, f"not a JSON line ({exc})") from exc
    if not isinstance(record, dict):
        raise ChainError(UNPARSEABLE, "not a JSON object")
    meta = record.get("npaudit")
    if not isinstance(meta, dict):
        raise ChainError(UNSEALED, "no npaudit object")
    seq, chain = meta.get("seq"), meta.get("chain")
    if type(seq) is not int or seq < 1:
        raise ChainError(UNSEALED, f"npaudit.seq is {seq!r}, not a positive integer")
    if not isinstance(chain, str) or not _HEX64.fullmatch(chain):
        raise ChainError(UNSEALED, f"npaudit.chain is {chain!r}, not 64 hex digits", found=seq)
    return record, seq, chain


def check_line(line: str | bytes, prev_chain: str, prev_seq: int | None) -> tuple[int, str]:
    """(seq, chain) of `line` if it continues the chain at (prev_seq, prev_chain).

    prev_seq None means no predecessor is known (the oldest file present): seq 1
    must then chain from GENESIS; a later seq is accepted as the anchor, because
    retention removes old files. Raises ChainError otherwise.
    """
    return check_record(parse_line(line)[0], prev_chain, prev_seq)


def check_record(record: dict[str, Any], prev_chain: str, prev_seq: int | None) -> tuple[int, str]:
    """check_line for a record `parse_line` has already accepted."""
    seq, chain = record["npaudit"]["seq"], record["npaudit"]["chain"]
    if prev_seq is None:
        if seq == 1 and digest(GENESIS, record) != chain:
            raise ChainError(CHAIN_MISMATCH, "seq 1 does not chain from GENESIS",
                             expected=1, found=1)
        return seq, chain
    expected = prev_seq + 1
    if seq > expected:
        raise ChainError(SEQ_GAP, f"expected seq {expected}, found {seq}",
                         expected=expected, found=seq)
    if seq < expected:
        raise ChainError(SEQ_REORDER, f"expected seq {expected}, found {seq}",
                         expected=expected, found=seq)
    if digest(prev_chain, record) != chain:
        raise ChainError(CHAIN_MISMATCH, f"seq {seq}: content or chain differs from what was sealed",
                         expected=expected, found=seq)
    return seq, chain
