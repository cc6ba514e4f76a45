"""Check seq and hash chain across live and rotated audit files, report the first break (the work of `npaudit verify`).

It checks copies too: records re-encoded by another JSON tool (auditlog/chain.py
says why they still verify), and files of forwarded RFC 5424 syslog messages, one
a line, whose header and structured data are stripped (auditlog/syslog/rfc5424.py).
"""

from __future__ import annotations

import time
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence, TypedDict

from auditlog.chain import CHAIN_MISMATCH, GENESIS, SEQ_GAP, ChainError, check_record, parse_line, seals
from auditlog.fileset import (DEFAULT_BASE, GZIP_ERRORS, MAX_LINE_BYTES, LineTooLong, iter_lines, open_audit_file,
                              pin_files, split_name)
from auditlog.loss_records import PACKET_INS, RECORDS, is_loss_record
from auditlog.loss_note import pending_loss
from auditlog.syslog.rfc5424 import TEST_PARAM, decode_message
from auditlog import verify_nodes
from auditlog.verify_nodes import (DEFAULT_WINDOW_BYTES, DIFFERS, DUPLICATE, NodeChain, NodeResult, NodeTable,
                                   node_label, node_of)

_LOOKAHEAD_LINES = 1_000_000   # how far to look for a record that is out of place

# Kinds of break, first match wins in this order of checks.
MISSING = "missing"              # records removed inside a file
MISSING_FILE = "missing_file"    # records missing between two files whose indexes skip one
EDITED = "edited"                # content, chain or seq of a record changed
REORDERED = "reordered"          # a record out of place, or repeated
TRUNCATED = "truncated"          # a line cut short (no newline at the end of a file) or a short gzip
UNPARSEABLE = "unparseable"      # a line that is not JSON
UNSEALED = "unsealed"            # a JSON line without npaudit.seq / npaudit.chain
OVERLONG = "overlong"            # a line longer than fileset.MAX_LINE_BYTES: not a record, and not read whole
BEYOND_WINDOW = verify_nodes.BEYOND_WINDOW  # a seq seen before, older than the duplicate window: undecidable


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
    node: str | None = None      # observer.hostname of the chain that broke

    def __str__(self) -> str:
        where = "" if self.node is None else f"node {self.node}: "
        return f"{self.kind}: {where}{self.file} line {self.line}: {self.detail}"


class _Where(TypedDict):
    """Where a Break is: its fields but kind and detail."""

    file: Path
    line: int
    expected_seq: int | None
    found_seq: int | None


@dataclass(frozen=True)
class VerifyResult:
    """What `verify` found: ok when no node's chain breaks; warnings and duplicates never make it fail.

    records / first_seq / last_seq / head_chain are those of the one node when there is
    one; with several, records is the sum and the rest is per node (`nodes`)."""

    files: tuple[Path, ...]
    records: int                 # records checked (up to the break)
    first_seq: int | None
    last_seq: int | None
    head_chain: str | None       # chain of the last good record: compare with a copy kept elsewhere
    first_break: Break | None
    warnings: tuple[str, ...] = ()
    nodes: tuple[NodeResult, ...] = ()
    breaks: tuple[Break, ...] = ()  # every node's break, in the order found (first_break is the first)

    @property
    def ok(self) -> bool:
        return self.first_break is None

    @property
    def duplicates(self) -> int:
        return sum(n.duplicates for n in self.nodes)

    def summary(self) -> str:
        seqs = f", seq {self.first_seq}..{self.last_seq}" if self.records and self.first_seq is not None else ""
        nodes = f", {len(self.nodes)} nodes" if len(self.nodes) > 1 else ""
        dups = (f", {self.duplicates} duplicates (re-sent copies of records verified before)"
                if self.duplicates else "")
        return f"OK: {self.records} records in {len(self.files)} files{nodes}{seqs}{dups}"


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


def _of_node(name: str) -> Any:
    """A read-only attribute of _Walk that is the current node's."""
    return property(lambda walk: getattr(walk.node, name))


@dataclass
class _Walk:
    files: list[Path]
    opener: Callable[[Path], IO[bytes]] = open_audit_file
    growing: Callable[[Path, int], bool] = lambda path, size: False  # has the file grown past size?
    sleep: Callable[[float], None] = time.sleep  # between looks at a live file being written
    pending: _Damage | None = None
    warnings: list[str] = field(default_factory=list)
    syslog: bool | None = None  # lines are RFC 5424 messages: True all, None those starting with "<"
    stated_losses: list[int] = field(default_factory=lambda: [0, 0, 0])  # loss records, packet-ins, records
    window_bytes: int = DEFAULT_WINDOW_BYTES  # per node, for telling re-sends (verify_nodes.py)
    table: NodeTable = field(init=False)  # each node's own chain
    set_of: list[str] = field(init=False)  # the file set (its live file) of each file
    node: NodeChain = field(default_factory=lambda: NodeChain(("", None)))  # the node of the record at hand
    breaks: list[Break] = field(default_factory=list)  # each broken node's break, in the order found

    def __post_init__(self) -> None:
        self.table = NodeTable(self.window_bytes)
        self.set_of = [str(p.with_name(split_name(p.name)[0])) for p in self.files]

    # The chain state the checks below read is the current node's (verify_nodes.NodeChain).
    prev_seq, prev_chain, prev_pos = _of_node("prev_seq"), _of_node("prev_chain"), _of_node("prev_pos")
    records, first_seq, first = _of_node("records"), _of_node("first_seq"), _of_node("first")

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
            except LineTooLong as exc:  # read no further: its bytes are never held whole
                if self.pending is not None:
                    return self._damage_break(self.pending)
                return Break(OVERLONG, file=path, line=exc.line,
                             detail=f"a line longer than {MAX_LINE_BYTES} bytes (at byte {exc.offset}): not an "
                                    "audit record; the files are not read past it")
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
            if self.breaks:
                return None  # after a break, bytes that are not a record belong to no node's chain
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
                                 f"write, or lost, before seq {seq}: {record.get('message', '')}")
        elif _is_restart(record):
            self.warnings.append(f"{self.files[fi]} line {lineno}: chain-restart record (seq {seq}) "
                                 "without the damaged bytes it names before it")
        self.node = node = self.table.node(self.set_of[fi], record, seq, text)
        if node.brk is not None:
            return None  # this node's chain ended at its break; the other nodes go on
        brk = self._forwarded(fi, lineno, record, params) if params is not None else None
        if brk is None and node.prev_seq is not None and seq <= node.prev_seq:
            verdict = node.repeat(seq, chain, record, text)
            if verdict == DUPLICATE:  # an at-least-once re-send: counted by the node, not a record of its own
                node.duplicates += 1
                return None
            brk = self._repeat_break(verdict, fi, lineno, seq)  # None: lower than any seq seen, judged below
        if brk is None and params and "original_bytes" in params and self.prev_seq in (None, seq - 1):
            self.warnings.append(f"{self.files[fi]} line {lineno}: seq {seq} was shortened to fit a UDP datagram "
                                 f"({params['original_bytes']} bytes): its content is not checked here")
        elif brk is None:
            try:
                check_record(record, self.prev_chain, self.prev_seq, text)
            except ChainError as exc:
                brk = self._classify(exc, fi, lineno, record, seq, chain)
        if brk is not None:
            node.brk = brk = replace(brk, node=node.name)
            self.breaks.append(brk)
            return None
        node.accepted(fi, lineno, record, seq, chain, len(raw))
        if is_loss_record(record):
            loss = record["npaudit"].get("loss")
            loss = loss if isinstance(loss, dict) else {}
            self.stated_losses[0] += 1
            for i, unit in ((1, PACKET_INS), (2, RECORDS)):
                self.stated_losses[i] += loss[unit] if type(loss.get(unit)) is int else 0
        return None

    def _repeat_break(self, verdict: str, fi: int, lineno: int, seq: int) -> Break | None:
        """The break for a seq this node has passed that is not a duplicate (verify_nodes.RecentChains.judge)."""
        node = self.node
        last = node.prev_seq if node.prev_seq is not None else seq
        if verdict == DIFFERS:
            detail = (f"seq {seq} appears again after seq {last} but differs from the seq {seq} "
                      "verified before (content or npaudit.chain): not a re-sent copy")
            kind = EDITED
        elif verdict == BEYOND_WINDOW:
            detail = (f"seq {seq} appears again after seq {last}, older than the duplicate window (seq "
                      f"{node.recent.first}..{last}, {self.window_bytes} bytes of records): whether it is a "
                      "re-sent copy cannot be told; verify again with a larger --duplicate-window")
            kind = BEYOND_WINDOW
        else:
            return None
        return Break(kind, file=self.files[fi], line=lineno, detail=detail, expected_seq=last + 1, found_seq=seq)

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

    def _lines_after(self, fi: int, lineno: int, file_set: str) -> Iterator[tuple[Path, int, bytes]]:
        for index in range(fi, len(self.files)):
            if self.set_of[index] != file_set:
                continue
            with suppress(*GZIP_ERRORS, LineTooLong):
                for _, n, raw in iter_lines(self.files[index], self.opener):
                    if index > fi or n > lineno:
                        yield self.files[index], n, raw

    def _node_records_after(self, fi: int, lineno: int) -> Iterator[tuple[Path, int, Any]]:
        """(path, line, parsed) of the lines after (fi, lineno) in the current node's file set that are its
        records, or that are no record at all (parsed None); at most _LOOKAHEAD_LINES lines are looked at."""
        set_key, name = self.node.key
        for count, (path, n, raw) in enumerate(self._lines_after(fi, lineno, set_key)):
            if count >= _LOOKAHEAD_LINES:
                return
            try:
                parsed = self._parse(raw.rstrip(b"\n"))
            except ChainError:
                yield path, n, None
                continue
            if parsed is not None and node_of(parsed[0]) == name:
                yield path, n, parsed

    def _find_seq(self, seq: int, fi: int, lineno: int) -> tuple[Path, int] | None:
        for path, n, parsed in self._node_records_after(fi, lineno):
            if parsed is not None and parsed[1] == seq:
                return path, n
        return None

    def _next_follows(self, fi: int, lineno: int, seq: int, chain: str, *, strict: bool = False) -> bool:
        """Does the node's record after (fi, lineno) continue from (seq, chain)? Without one: not strict."""
        for _, _, parsed in self._node_records_after(fi, lineno):
            if parsed is None:
                return not strict
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


def verify(paths: Sequence[Path], *, base: str = DEFAULT_BASE, syslog: bool | None = None,
           duplicate_window: int = DEFAULT_WINDOW_BYTES) -> VerifyResult:
    """Check the files (or directories of files); FileNotFoundError if there are none.

    Each node's records (observer.hostname, within one file set) form a chain of
    their own, checked on its own, so a SIEM copy merging many nodes verifies;
    exact re-sent copies are counted as duplicates (auditlog.verify_nodes, which
    also says what `duplicate_window` bounds). `syslog`: True if every line is an
    RFC 5424 message carrying a record, None (the default) to take lines that
    start with "<" as such messages, False for none.
    """
    files, notes, pinned = pin_files([Path(p) for p in paths], base)
    try:
        walk = _Walk(files, pinned.open, lambda path, size: pinned.size(path) > size, warnings=list(notes),
                     syslog=syslog, window_bytes=duplicate_window)
        damage = walk.run()
    finally:
        pinned.close()
    breaks = [*walk.breaks, *([damage] if damage is not None else [])]
    brk = breaks[0] if breaks else None
    nodes = tuple(n.result() for n in walk.table.nodes.values())
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
    for node in nodes:
        if node.first_seq not in (None, 1) and node.brk is None:
            whose = "" if len(nodes) == 1 else f"node {node_label(node.node)}: "
            walk.warnings.append(f"{whose}the chain is checked from seq {node.first_seq}: older records are not "
                                 "here (removed by retention, or by someone)")
    records = sum(n.records for n in nodes)
    if len(nodes) == 1:
        one = nodes[0]
        return VerifyResult(tuple(files), records, one.first_seq, one.last_seq, one.head_chain, brk,
                            tuple(walk.warnings), nodes, tuple(breaks))
    return VerifyResult(tuple(files), records, None, None, None, brk, tuple(walk.warnings), nodes, tuple(breaks))
