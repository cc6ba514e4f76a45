"""Check seq and hash chain across live and rotated audit files, report the first break (the work of `npaudit verify`).

It checks copies too: records re-encoded by another JSON tool (auditlog/chain.py
says why they still verify), and files of forwarded RFC 5424 syslog messages, one
a line, whose header and structured data are stripped (auditlog/syslog/rfc5424.py).
"""

from __future__ import annotations

import json
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence, TypedDict

from auditlog.chain import CHAIN_MISMATCH, GENESIS, SEQ_GAP, ChainError, check_record, parse_line, seals
from auditlog.fileset import (DEFAULT_BASE, GZIP_ERRORS, iter_lines, open_audit_file, pin_files,
                              split_name)
from auditlog.loss_records import PACKET_INS, RECORDS, is_loss_record
from auditlog.loss_note import pending_loss
from auditlog.syslog.rfc5424 import TEST_PARAM, decode_message

_LOOKAHEAD_LINES = 1_000_000   # how far to look for a record that is out of place

# Kinds of break, first match wins in this order of checks.
MISSING = "missing"              # records removed inside a file
MISSING_FILE = "missing_file"    # records missing between two files whose indexes skip one
EDITED = "edited"                # content, chain or seq of a record changed
REORDERED = "reordered"          # a record out of place, or repeated
TRUNCATED = "truncated"          # a line cut short (no newline at the end of a file) or a short gzip
UNPARSEABLE = "unparseable"      # a line that is not JSON
UNSEALED = "unsealed"            # a JSON line without npaudit.seq / npaudit.chain


# --- results ---

@dataclass(frozen=True)
class Break:
    """The first place where the files stop being one unbroken chain."""

    kind: str
    file: Path
    line: int
    detail: str
    expected_seq: int | None = None
    found_seq: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.file} line {self.line}: {self.detail}"


class _Where(TypedDict):
    """Where a Break is: its fields but kind and detail."""

    file: Path
    line: int
    expected_seq: int | None
    found_seq: int | None


@dataclass(frozen=True)
class VerifyResult:
    """What `verify` found: ok when there is no break; warnings never make it fail."""

    files: tuple[Path, ...]
    records: int                 # records checked (up to the break)
    first_seq: int | None
    last_seq: int | None
    head_chain: str | None       # chain of the last good record: compare with a copy kept elsewhere
    first_break: Break | None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.first_break is None

    def summary(self) -> str:
        seqs = f", seq {self.first_seq}..{self.last_seq}" if self.records else ""
        return f"OK: {self.records} records in {len(self.files)} files{seqs}"


# --- forwarded copies: one RFC 5424 message a line ---

# <PRI>VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID, then STRUCTURED-DATA.
# --- the walk ---

@dataclass
class _Damage:
    file_index: int
    line: int
    offset: int
    kind: str    # TRUNCATED (no newline at the end of a file, short gzip), UNPARSEABLE, UNSEALED
    detail: str


def _sealed_with_seq(record: dict[str, Any], prev_chain: str, seq: int) -> bool:
    """Would `record` verify if its npaudit.seq were `seq`? (Then only the seq was edited.)"""
    original = dict(record)
    original["npaudit"] = dict(record["npaudit"], seq=seq)
    return seals(prev_chain, original)


def _is_restart(record: dict[str, Any]) -> bool:
    event = record.get("event")
    return isinstance(event, dict) and event.get("kind") == "state" and event.get("action") == "chain-restart"


@dataclass
class _Walk:
    files: list[Path]
    opener: Callable[[Path], IO[bytes]] = open_audit_file
    growing: Callable[[Path, int], bool] = lambda path, size: False  # has the file grown past size?
    sleep: Callable[[float], None] = time.sleep  # between looks at a live file being written
    prev_seq: int | None = None
    prev_chain: str = GENESIS
    prev_pos: tuple[int, int] = (0, 0)       # (file index, line) of the last good record
    records: int = 0
    first_seq: int | None = None
    first: tuple[int, int, dict[str, Any]] | None = None  # file index, line, record of the anchor
    pending: _Damage | None = None
    warnings: list[str] = field(default_factory=list)
    syslog: bool | None = None  # lines are RFC 5424 messages: True all, None those starting with "<"
    stated_losses: list[int] = field(default_factory=lambda: [0, 0, 0])  # loss records, packet-ins, records

    def _parse(self, text: bytes) -> tuple[dict[str, Any], int, str, bytes, dict[str, str] | None] | None:
        """(record, seq, chain, JSON text, syslog params or None) of one line without its newline;
        None for a forwarded `npaudit syslog test` message (outside the chain)."""
        params = None
        if self.syslog or (self.syslog is None and text.startswith(b"<")):
            try:
                text, params = decode_message(text)
            except ValueError as exc:
                raise ChainError(UNPARSEABLE, f"not an RFC 5424 message ({exc})") from exc
            if params.get(TEST_PARAM) == "true":
                return None
        record, seq, chain = parse_line(text)
        return record, seq, chain, text, params

    def run(self) -> Break | None:
        offset = 0
        for fi, path in enumerate(self.files):
            offset, lineno = 0, 0
            try:
                for offset, lineno, raw in iter_lines(path, self.opener):
                    brk = self._line(fi, lineno, offset, raw)
                    if brk is not None:
                        return brk
                    offset += len(raw)
            except GZIP_ERRORS as exc:
                if self.pending is None:
                    self.pending = _Damage(fi, lineno + 1, offset, TRUNCATED,
                                           f"the gzip data ends early or is corrupt ({exc})")
        d = self.pending
        if d is not None and self._being_written(d, offset):
            self.warnings.append(f"{self.files[d.file_index]} line {d.line}: the live file is being written; "
                                 "its last line was incomplete when read and is not checked")
            return None
        return self._damage_break(d) if d else None

    def _being_written(self, d: _Damage, end: int) -> bool:
        """A cut-short last line of the live file that a writer is still appending to."""
        path = self.files[-1]
        if d.kind != TRUNCATED or d.file_index != len(self.files) - 1 or split_name(path.name)[1] != 0:
            return False
        for _ in range(10):  # a batch write lands within milliseconds
            if self.growing(path, end):
                return True
            self.sleep(0.02)
        return False

    def _line(self, fi: int, lineno: int, offset: int, raw: bytes) -> Break | None:
        torn = not raw.endswith(b"\n")
        try:
            parsed = self._parse(raw if torn else raw[:-1])
        except ChainError as exc:
            if self.pending is None and torn:
                self.pending = _Damage(fi, lineno, offset, TRUNCATED, f"the last line is cut short ({exc.detail})")
            elif self.pending is None:
                self.pending = _Damage(fi, lineno, offset, exc.kind, exc.detail)
            return None
        if parsed is None:
            self.warnings.append(f"{self.files[fi]} line {lineno}: an `npaudit syslog test` message, "
                                 "not an audit record: skipped")
            return None
        record, seq, chain, text, params = parsed
        if self.pending is not None:
            if not (_is_restart(record) and self._explains(record, self.pending)):
                return self._damage_break(self.pending)
            d = self.pending
            self.warnings.append(
                f"{self.files[d.file_index]} line {d.line}: bytes that are not a record (a write cut "
                f"short), explained by the chain-restart record at {self.files[fi]} line {lineno} "
                f"(seq {seq})")
            self.pending = None
        elif _is_restart(record) and record["event"].get("reason") == "records-lost":
            self.warnings.append(f"{self.files[fi]} line {lineno}: the writer reports records it could not "
                                 f"write before seq {seq}: {record.get('message', '')}")
        elif _is_restart(record):
            self.warnings.append(f"{self.files[fi]} line {lineno}: chain-restart record (seq {seq}) "
                                 "without the damaged bytes it names before it")
        if params is not None:
            brk = self._forwarded(fi, lineno, record, params)
            if brk is not None:
                return brk
        if params and "original_bytes" in params and self.prev_seq in (None, seq - 1):
            self.warnings.append(f"{self.files[fi]} line {lineno}: seq {seq} was shortened to fit a UDP datagram "
                                 f"({params['original_bytes']} bytes): its content is not checked here")
        else:
            try:
                check_record(record, self.prev_chain, self.prev_seq, text)
            except ChainError as exc:
                return self._classify(exc, fi, lineno, record, seq, chain)
        if self.first is None:
            self.first, self.first_seq = (fi, lineno, record), seq
        self.prev_seq, self.prev_chain, self.prev_pos = seq, chain, (fi, lineno)
        self.records += 1
        if is_loss_record(record):
            loss = record["npaudit"].get("loss")
            loss = loss if isinstance(loss, dict) else {}
            self.stated_losses[0] += 1
            for i, unit in ((1, PACKET_INS), (2, RECORDS)):
                self.stated_losses[i] += loss[unit] if type(loss.get(unit)) is int else 0
        return None

    def _forwarded(self, fi: int, lineno: int, record: dict[str, Any], params: dict[str, str]) -> Break | None:
        """A message whose structured data names another seq or chain than its record: one of them was edited."""
        meta = record["npaudit"]
        sd = {k: params[k] for k in ("seq", "chain") if k in params}
        if sd == {k: str(meta[k]) for k in sd}:
            return None
        expected = None if self.prev_seq is None else self.prev_seq + 1
        return Break(EDITED, self.files[fi], lineno, f"the message's structured data says "
                     f"{' '.join(f'{k}={v}' for k, v in sd.items())} but its record has seq {meta['seq']} "
                     f"chain {meta['chain']}", expected, meta["seq"])

    def _explains(self, record: dict[str, Any], damage: _Damage) -> bool:
        named = record.get("npaudit", {}).get("chain_restart")
        return (isinstance(named, dict) and named.get("offset") == damage.offset
                and named.get("line") == damage.line)

    def _damage_break(self, d: _Damage) -> Break:
        next_seq = None if self.prev_seq is None else self.prev_seq + 1
        return Break(d.kind, self.files[d.file_index], d.line, d.detail, next_seq)

    def _classify(self, exc: ChainError, fi: int, lineno: int, record: dict[str, Any], seq: int,
                  chain: str) -> Break:
        path, expected = self.files[fi], exc.expected
        here: _Where = {"file": path, "line": lineno, "expected_seq": expected, "found_seq": seq}
        if exc.kind == CHAIN_MISMATCH:
            return Break(EDITED, detail=f"record seq {seq} does not match its chain value: its content "
                         "or npaudit.chain was changed", **here)
        if expected is not None and _sealed_with_seq(record, self.prev_chain, expected):
            return Break(EDITED, detail=f"npaudit.seq was changed from {expected} to {seq}", **here)
        if exc.kind == SEQ_GAP and expected is not None:
            found = self._find_seq(expected, fi, lineno)
            if found is not None:
                return Break(REORDERED, detail=f"expected seq {expected}, found seq {seq}; seq {expected} "
                             f"comes later, at {found[0]} line {found[1]}", **here)
            if not self._next_follows(fi, lineno, seq, chain):
                return Break(EDITED, detail=f"expected seq {expected}, found seq {seq}, and the next record "
                             f"does not follow seq {seq}: npaudit.seq was changed", **here)
            span = f"seq {expected}" if seq == expected + 1 else f"seq {expected}..{seq - 1}"
            prev_fi, prev_line = self.prev_pos
            if prev_fi == fi:
                return Break(MISSING, detail=f"record(s) {span} missing ({seq - expected}): expected seq "
                             f"{expected}, found seq {seq}", **here)
            prev = self.files[prev_fi]
            text = (f"record(s) {span} missing ({seq - expected}) between {prev} (ends with seq "
                    f"{expected - 1} at line {prev_line}) and {path} (continues with seq {seq})")
            present = {p.name for p in self.files}
            absent = [n for n in _absent_between(prev, path) if n not in present and n[:-3] not in present]
            if absent:
                return Break(MISSING_FILE, detail=f"{text}; {', '.join(absent)} absent: a rotated file "
                             "was removed", **here)
            return Break(MISSING, detail=text, **here)
        if self.records == 1 and self.first is not None and self.first_seq != 1:
            return self._misplaced_anchor(fi, lineno, record, seq, chain)
        return Break(REORDERED, detail=f"expected seq {expected}, found seq {seq}: a record out of order "
                     "or repeated", **here)

    def _misplaced_anchor(self, fi: int, lineno: int, record: dict[str, Any], seq: int,
                          chain: str) -> Break:
        """The oldest record (taken on trust) is followed by a lower seq: which one is out of place?"""
        if self.first is None or self.first_seq is None:
            raise RuntimeError("no anchor record")  # the caller checks; this keeps the types honest
        afi, aline, anchor = self.first
        at_anchor: _Where = {"file": self.files[afi], "line": aline, "expected_seq": None, "found_seq": self.first_seq}
        if _sealed_with_seq(anchor, GENESIS, 1):
            return Break(EDITED, detail=f"npaudit.seq of the first record was changed from 1 to "
                         f"{self.first_seq}", **at_anchor)
        genuine_first = seq == 1 and seals(GENESIS, record)
        if not genuine_first and self._next_follows(fi, lineno, self.first_seq, self.prev_chain, strict=True):
            return Break(REORDERED, detail=f"seq {seq} follows seq {self.first_seq}: a record out of order "
                         "or repeated", file=self.files[fi], line=lineno,
                         expected_seq=self.first_seq + 1, found_seq=seq)
        return Break(REORDERED, detail=f"the first record has seq {self.first_seq} but seq {seq} follows it "
                     f"at {self.files[fi]} line {lineno}: the first record is out of place", **at_anchor)

    def _lines_after(self, fi: int, lineno: int) -> Iterator[tuple[Path, int, bytes]]:
        for index in range(fi, len(self.files)):
            with suppress(*GZIP_ERRORS):
                for _, n, raw in iter_lines(self.files[index], self.opener):
                    if index > fi or n > lineno:
                        yield self.files[index], n, raw

    def _find_seq(self, seq: int, fi: int, lineno: int) -> tuple[Path, int] | None:
        for count, (path, n, raw) in enumerate(self._lines_after(fi, lineno)):
            if count >= _LOOKAHEAD_LINES:
                break
            with suppress(ChainError):
                parsed = self._parse(raw.rstrip(b"\n"))
                if parsed is not None and parsed[1] == seq:
                    return path, n
        return None

    def _next_follows(self, fi: int, lineno: int, seq: int, chain: str, *, strict: bool = False) -> bool:
        """Does the record after (fi, lineno) continue from (seq, chain)? Without one: not strict."""
        for _, _, raw in self._lines_after(fi, lineno):
            try:
                parsed = self._parse(raw.rstrip(b"\n"))
            except ChainError:
                return not strict
            if parsed is None:  # a forwarded test message: outside the chain
                continue
            record, nseq, _, text, _ = parsed
            return nseq == seq + 1 and seals(chain, record, text)
        return not strict


def _absent_between(older: Path, newer: Path) -> list[str]:
    """Rotated file names missing between two neighbours (audit.jsonl.3.gz, audit.jsonl.1.gz -> .2.gz)."""
    base, old_index = split_name(older.name)
    new_base, new_index = split_name(newer.name)
    if base != new_base or old_index - new_index <= 1:
        return []
    suffix = ".gz" if older.name.endswith(".gz") else ""
    return [f"{base}.{i}{suffix}" for i in range(old_index - 1, new_index, -1)]


def verify(paths: Sequence[Path], *, base: str = DEFAULT_BASE, syslog: bool | None = None) -> VerifyResult:
    """Check the files (or directories of files) as one chain; FileNotFoundError if there are none.

    `syslog`: True if every line is an RFC 5424 message carrying a record, None
    (the default) to take lines that start with "<" as such messages, False for none.
    """
    files, notes, pinned = pin_files([Path(p) for p in paths], base)
    try:
        walk = _Walk(files, pinned.open, lambda path, size: pinned.size(path) > size, warnings=list(notes),
                     syslog=syslog)
        brk = walk.run()
    finally:
        pinned.close()
    n, packet_ins, records = walk.stated_losses
    if n:
        walk.warnings.append(f"{n} loss records state that {packet_ins} packet-ins and {records} records never "
                             "became records (meter, OVS queue, admission or writer drops; `npaudit logs` "
                             "shows them as LOSS)")
    lives = {p / base if p.is_dir() else p.with_name(split_name(p.name)[0]) for p in map(Path, paths)}
    for live in sorted(lives):
        note = pending_loss(live)
        if note is not None:
            walk.warnings.append(f"{live}: the writer that stopped last could not write {note['records_lost']} "
                                 f"audit records after seq {note['after_seq']} ({note['by_reason']}); the next "
                                 "start puts a chain-restart record saying so into the chain")
    if walk.first_seq not in (None, 1) and brk is None:
        walk.warnings.append(f"the chain is checked from seq {walk.first_seq}: older records are not "
                             "here (removed by retention, or by someone)")
    return VerifyResult(tuple(files), walk.records, walk.first_seq, walk.prev_seq,
                        walk.prev_chain if walk.records else None, brk, tuple(walk.warnings))


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The result as `npaudit verify --json` prints it."""
    brk = result.first_break
    return {
        "ok": result.ok, "files": [str(p) for p in result.files], "records": result.records,
        "first_seq": result.first_seq, "last_seq": result.last_seq, "head_chain": result.head_chain,
        "warnings": list(result.warnings),
        "break": None if brk is None else {
            "kind": brk.kind, "file": str(brk.file), "line": brk.line, "detail": brk.detail,
            "expected_seq": brk.expected_seq, "found_seq": brk.found_seq},
    }


def report(result: VerifyResult, out: IO[str], *, as_json: bool = False) -> int:
    """Print the result (text, or one JSON object); the exit status: 0 intact, 1 at a break."""
    if as_json:
        print(json.dumps(to_json(result), sort_keys=True), file=out)
        return 0 if result.ok else 1
    for warning in result.warnings:
        print(f"WARNING: {warning}", file=out)
    if result.first_break is not None:
        print(f"BREAK: {result.first_break}", file=out)
        print(f"{result.records} records intact before it, in {len(result.files)} files", file=out)
        return 1
    print(result.summary(), file=out)
    if result.head_chain:
        print(f"head: seq {result.last_seq} chain {result.head_chain}", file=out)
    return 0
