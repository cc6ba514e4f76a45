r"""Hash chain over audit records (npaudit.seq, npaudit.chain): seal a record, check a line.

The chain, format 2 (enough to re-implement `npaudit verify` elsewhere)
---------------------------------------------------------------------
Every audit record is one JSON object on one line. Its vendor object ``npaudit``
carries ``seq`` (1, 2, 3, ... with no gaps, across rotated files and agent
restarts), ``chain`` (64 lowercase hex digits) and ``chain_format`` (2).

``jcs(x)`` is the RFC 8785 canonical JSON text of x (auditlog.jcs: keys sorted
by UTF-16 code units, ECMAScript numbers, minimal escapes, UTF-8). For the record
with sequence number ``seq``::

    body  = jcs(record with npaudit.seq = seq and WITHOUT the key npaudit.chain)
    chain = hex(SHA-256(UTF-8 bytes of prev_chain + "\n" + body))

``prev_chain`` is the chain of record ``seq - 1``, or GENESIS (64 "0") for seq 1.
The line written to the file is jcs(record with npaudit.chain) with every
character above U+007F escaped as ``\uxxxx`` (pure ASCII, so no user-controlled
string can break a line or a syslog header); for an ASCII record that is JCS itself.

A verifier parses a line, removes npaudit.chain, takes jcs() and hashes. Only the
JSON data model counts, so a copy that jq -c, Python json, Go encoding/json,
JavaScript or rsyslog's mmjsonparse re-encoded (other key order, escapes,
whitespace, ``10`` for ``10.0``) still verifies. (Shortcut, equally sound: if
the line with the text ``"chain":"<hex>",`` removed hashes to <hex>, it is the
sealed body.)

Format 1 (files written before chain_format existed; records without it) hashed
``json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``
instead of jcs(x) (floats as Python's repr: ``10.0``), ASCII bytes. A verifier
checks each record in the format it names, so a file set that spans the upgrade
verifies; only format-2 records survive re-encoding.

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
import re
import uuid
from typing import Any, Mapping

from auditlog.errors import AuditLogError
from auditlog.jcs import ascii_form, canonical

GENESIS = "0" * 64
FORMAT = 2                                  # npaudit.chain_format of every record written now

# The text layout of a line the writer seals (RecordText.seal), owned here; the record
# encoder builds it and the syslog forwarder's fast reader (syslog/sealed_line.py) reads it:
#   line = head + CHAIN_KEY + <64 hex> + '",' + mid + str(seq) + tail
# head starts with TIMESTAMP_KEY (JCS sorts "@timestamp" first) and ends inside the npaudit
# object just before "chain"; mid starts with FORMAT_MEMBER and ends with SEQ_KEY.
TIMESTAMP_KEY = '{"@timestamp":"'
CHAIN_KEY = '"chain":"'
FORMAT_MEMBER = f'"chain_format":{FORMAT},'  # the first npaudit member after "chain"
SEQ_KEY = '"seq":'
CHAIN_MEMBER_LEN = len(CHAIN_KEY) + 64 + 2  # CHAIN_KEY, 64 hex digits, '",'
_CHAIN_KEY_B, _FORMAT_MEMBER_B = CHAIN_KEY.encode("ascii"), FORMAT_MEMBER.encode("ascii")
ECS_VERSION = "8.11.0"                      # ecs.version of every record
DATASET = "npaudit.audit"                   # event.dataset of every record

# Kinds of ChainError (check_line) and of breaks reported by verify.
UNPARSEABLE = "unparseable"      # not JSON (UTF-8), or not an object
UNSEALED = "unsealed"            # JSON object without a valid npaudit.seq / npaudit.chain / chain_format
SEQ_GAP = "seq_gap"              # seq jumps forward: records missing (or seq edited)
SEQ_REORDER = "seq_reorder"      # seq goes backwards or repeats: reordered or duplicated
CHAIN_MISMATCH = "chain_mismatch"  # seq as expected but content or chain differ: edited

_V1_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_sha256 = hashlib.sha256
try:  # CPython's own SHA-256: the same digest, for a lone record (RecordText.seal)
    from _sha256 import sha256 as _sha256_lone  # type: ignore[import-not-found]  # CPython 3.11, no stub
except ImportError:  # not built in (or renamed, as in 3.12): OpenSSL's
    _sha256_lone = hashlib.sha256


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
    """`value` as the audit files write JSON: its JCS text, ASCII-escaped (see the module docstring)."""
    return ascii_form(canonical(value))


# observer of every record kind (policy records, loss records, the writer's chain restarts): the
# switch that matched the packets; the vendor is who makes the record.
OBSERVER = {"product": "Open vSwitch", "type": "switch", "vendor": "npaudit project"}


class RecordText:
    """A record already in canonical (JCS) form, with its seq and chain left open.

    The JCS text of the record with npaudit.seq = N and without npaudit.chain is
    ``head + mid + str(N) + tail``; its line adds ``"chain":"<hex>",`` between
    head and mid. So `head` ends just after npaudit's first member ("aggregate",
    which every policy record has and which sorts before "chain"), and `mid`
    starts with FORMAT_MEMBER and ends with ``"seq":``. Sealing is then one hash
    and two string joins, no encoding (auditlog.record builds these directly;
    tests prove the text canonical). `seq` is 0 until sealed.

    Two facts ride along for the metrics, outside the text: `verdict`
    (disposition, direction, tier) of a policy record, None for the writer's own
    records; `received`, the wall-clock time of the packet-in a record was written
    for at once (first packet of a flow, an Allow), 0.0 for records that waited for
    an aggregation window.
    """

    __slots__ = ("head", "mid", "tail", "seq", "verdict", "received")

    def __init__(self, head: str, mid: str, tail: str) -> None:
        self.head = head
        self.mid = mid
        self.tail = tail
        self.seq = 0
        self.verdict: tuple[str, str, str] | None = None
        self.received = 0.0

    def body(self, seq: int) -> str:
        """The JCS text with npaudit.seq = seq and no chain: what the chain hashes."""
        return f"{self.head}{self.mid}{seq}{self.tail}"

    def seal(self, prev_chain: str, seq: int, lone: bool = False) -> tuple[str, str]:
        """(line, chain) for this record as number `seq` after `prev_chain`. `lone`: the record is
        written alone (after a quiet spell, as a rule), and its digest is taken with CPython's own
        SHA-256 rather than OpenSSL's: 0.4-1.4 µs slower on a warm CPU, 30-40 µs faster on a cold one
        (OpenSSL's digest set-up is the larger code path; bench/cold_calls.py), on its way to the file.

        UnicodeEncodeError (a ValueError) for text that is not valid Unicode (a lone surrogate).
        """
        head, mid, tail = self.head, self.mid, self.tail
        data = f"{prev_chain}\n{head}{mid}{seq}{tail}".encode("utf-8")
        chain = (_sha256_lone if lone else _sha256)(data).hexdigest()
        self.seq = seq
        line = f'{head}{CHAIN_KEY}{chain}",{mid}{seq}{tail}'
        return (line if line.isascii() else ascii_form(line)), chain

    def record(self) -> dict[str, Any]:
        """The record as a dict (seq as sealed, no chain): for tests and tools, not the hot path."""
        parsed: dict[str, Any] = json.loads(self.body(self.seq))
        return parsed

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RecordText:
        """The RecordText of a record given as a dict; its npaudit.seq, .chain and .chain_format are ignored.

        For the rare record not built by auditlog.record (the writer's chain-restart
        record). JCS sorts keys at every level, so the text is the members encoded
        one by one, npaudit's split around "chain" and "seq". Raises TypeError or
        ValueError for what it cannot hold (NaN, a set, a non-object npaudit).
        """
        meta = record.get("npaudit", {})
        if not isinstance(meta, dict):
            raise TypeError("record['npaudit'] must be an object")
        meta = {k: v for k, v in meta.items() if k not in ("chain", "seq")}
        meta["chain_format"] = FORMAT
        outer = _sorted(k for k in record if k != "npaudit")
        inner = _sorted(meta)
        head = ("{" + "".join(_member(k, record[k]) + "," for k in outer if _utf16(k) < _NPAUDIT) + '"npaudit":{'
                + "".join(_member(k, meta[k]) + "," for k in inner if _utf16(k) < _CHAIN))
        mid = "".join(_member(k, meta[k]) + "," for k in inner if _CHAIN < _utf16(k) < _SEQ) + SEQ_KEY
        tail = ("".join("," + _member(k, meta[k]) for k in inner if _utf16(k) > _SEQ) + "}"
                + "".join("," + _member(k, record[k]) for k in outer if _utf16(k) > _NPAUDIT) + "}")
        return cls(head, mid, tail)


def _utf16(key: str) -> bytes:
    if not isinstance(key, str):
        raise TypeError("JSON object keys must be strings")
    return key.encode("utf-16-be", "surrogatepass")


_NPAUDIT, _CHAIN, _SEQ = _utf16("npaudit"), _utf16("chain"), _utf16("seq")


def _sorted(keys: Any) -> list[str]:
    return sorted(keys, key=_utf16)


def _member(key: str, value: Any) -> str:
    return f"{canonical(key)}:{canonical(value)}"


def chain_restart_record(*, file: str, line: int, offset: int, nbytes: int, after_seq: int, now: float,
                         context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The state record that starts a new chain segment after bytes that are not a record.

    `context` adds fields every record of the node carries (observer, orchestrator).
    """
    return _restart("torn-write", now, context,
                    f"audit chain continues after {nbytes} bytes at {file} line {line} (offset {offset}) "
                    f"that are not a complete record (a write cut short); last good seq {after_seq}",
                    {"file": file, "line": line, "offset": offset, "bytes": nbytes, "after_seq": after_seq})


def records_lost_record(*, lost: Mapping[str, int], after_seq: int, now: float,
                        context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The state record naming records a previous writer lost (its loss note).

    `lost` counts them by reason (the writer's counter names). Most were never sealed, so the
    chain has no gap: this record is the only trace of them in the files. strayed_removed are
    sealed records another program removed with the live file: the gap they leave stays a break
    for `npaudit verify`, and this record says how many went.
    """
    total = sum(lost.values())
    removed = lost.get("strayed_removed", 0)
    unwritten = {reason: n for reason, n in sorted(lost.items()) if reason != "strayed_removed"}
    parts = []
    if unwritten:
        reasons = ", ".join(f"{reason} {n}" for reason, n in unwritten.items())
        parts.append(f"{sum(unwritten.values())} audit records that were never written ({reasons})")
    if removed:
        parts.append(_removed(removed))
    return _restart("records-lost", now, context,
                    f"audit chain continues after {' and '.join(parts) or '0 audit records'} when the writer "
                    f"stopped after seq {after_seq}",
                    {"after_seq": after_seq, "records_lost": total, "lost_by_reason": dict(sorted(lost.items()))})


def records_removed_record(*, removed: int, through_seq: int, now: float,
                           context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The state record a running writer puts first in a new live file after another program removed the
    one it wrote to: `removed` sealed records, the last of them seq `through_seq`, are gone with it."""
    return _restart("records-lost", now, context,
                    f"audit chain continues after {_removed(removed)}, the last of them seq {through_seq}",
                    {"after_seq": through_seq, "records_lost": removed, "lost_by_reason": {"strayed_removed": removed}})


def _removed(n: int) -> str:
    return f"{n} written audit records another program removed with the live file (strayed_removed {n})"


def utc_stamp(t: float) -> str:
    """Epoch seconds `t` as records write times: UTC, milliseconds, Z."""
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _restart(reason: str, now: float, context: Mapping[str, Any] | None, message: str,
             detail: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = copy.deepcopy(dict(context or {}))
    record["observer"] = {**record.get("observer", {}), **OBSERVER}
    record.update({
        "@timestamp": utc_stamp(now),
        "ecs": {"version": ECS_VERSION},
        "event": {"id": uuid.uuid4().hex, "kind": "state", "category": ["file"], "type": ["info"],
                  "action": "chain-restart", "reason": reason, "dataset": DATASET},
        "message": message,
        "npaudit": {"chain_restart": detail},
    })
    return record


def chain_member_at(line: bytes) -> int:
    """Where the chain member of `line` starts if the line has the sealed layout around it
    (CHAIN_KEY, 64 characters, '",' and FORMAT_MEMBER), else -1. The digits are not checked:
    `sealed_chain` proves them."""
    at = line.find(_CHAIN_KEY_B)
    end = at + CHAIN_MEMBER_LEN
    if at < 0 or line[end - 2:end] != b'",' or not line.startswith(_FORMAT_MEMBER_B, end):
        return -1
    return at


def sealed_chain(prev_chain: str, line: bytes, at: int) -> str | None:
    """The chain value of `line` (its chain member at `at`: chain_member_at) if the line without
    that member hashes to it after `prev_chain`, i.e. it is byte for byte a sealed body; else None."""
    chain = line[at + len(_CHAIN_KEY_B):at + CHAIN_MEMBER_LEN - 2]
    digest = _sha256(prev_chain.encode("ascii"))
    digest.update(b"\n")
    digest.update(line[:at])
    digest.update(line[at + CHAIN_MEMBER_LEN:])
    found = digest.hexdigest()
    return found if found.encode("ascii") == chain else None


def _hash(prev_chain: str, body: str | bytes) -> str:
    data = body if isinstance(body, bytes) else body.encode("utf-8")
    return _sha256(prev_chain.encode("ascii") + b"\n" + data).hexdigest()


def digest(prev_chain: str, record: dict[str, Any], line: str | bytes | None = None) -> str:
    """The chain value `record` must carry if it follows `prev_chain` (its own chain ignored).

    `line`, the text `record` was parsed from, allows the shortcut of the module
    docstring; the answer is the same without it. ValueError if the record cannot
    be put in its format's canonical form (a lone surrogate, a non-finite number).
    """
    meta = record["npaudit"]
    chain = meta.get("chain")
    if line is not None and isinstance(chain, str):
        member = f'{CHAIN_KEY}{chain}",'
        raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
        stripped = raw.replace(member.encode("ascii"), b"", 1)
        if len(stripped) < len(raw) and _hash(prev_chain, stripped) == chain:
            return chain
    unchained = dict(record)
    unchained["npaudit"] = {k: v for k, v in meta.items() if k != "chain"}
    if meta.get("chain_format") == FORMAT:
        return _hash(prev_chain, canonical(unchained))
    return _hash(prev_chain, _V1_ENCODER.encode(unchained))


def parse_line(line: str | bytes) -> tuple[dict[str, Any], int, str]:
    """(record, seq, chain) of one line; ChainError unparseable/unsealed otherwise."""
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ChainError(UNPARSEABLE, f"not a JSON line ({exc})") from exc
    except RecursionError as exc:  # no record nests more than a few levels
        raise ChainError(UNPARSEABLE, "not an audit record (JSON nested too deeply to read)") from exc
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
    fmt = meta.get("chain_format", 1)
    if fmt not in (1, FORMAT) or type(fmt) is bool:  # 2.0 from a re-encoder is 2
        raise ChainError(UNSEALED, f"npaudit.chain_format is {fmt!r}, not one this verifier knows (1 or "
                         f"{FORMAT})", found=seq)
    return record, seq, chain


def check_line(line: str | bytes, prev_chain: str, prev_seq: int | None) -> tuple[int, str]:
    """(seq, chain) of `line` if it continues the chain at (prev_seq, prev_chain).

    prev_seq None means no predecessor is known (the oldest file present): seq 1
    must then chain from GENESIS; a later seq is accepted as the anchor, because
    retention removes old files. Raises ChainError otherwise.
    """
    return check_record(parse_line(line)[0], prev_chain, prev_seq, line)


def check_record(record: dict[str, Any], prev_chain: str, prev_seq: int | None,
                 line: str | bytes | None = None) -> tuple[int, str]:
    """check_line for a record `parse_line` has already accepted (from `line`, if given)."""
    seq, chain = record["npaudit"]["seq"], record["npaudit"]["chain"]
    if prev_seq is None:
        if seq == 1 and not seals(GENESIS, record, line):
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
    if not seals(prev_chain, record, line):
        raise ChainError(CHAIN_MISMATCH, f"seq {seq}: content or chain differs from what was sealed",
                         expected=expected, found=seq)
    return seq, chain


def seals(prev_chain: str, record: dict[str, Any], line: str | bytes | None = None) -> bool:
    """Does `record` carry the chain value it must have after `prev_chain`?"""
    try:
        return digest(prev_chain, record, line) == record["npaudit"].get("chain")
    except ValueError:  # no canonical form (a lone surrogate from a \ud800 escape, NaN): not what was sealed
        return False
