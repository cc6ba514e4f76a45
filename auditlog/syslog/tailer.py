"""Tail the audit file set in seq order across rotation and gzip, from a checkpoint, counting what retention removed.

The writer rotates audit.jsonl to .1 (same inode), its compressor replaces .N by
.N.gz (a new inode, same uncompressed bytes) and retention deletes the oldest. So
a position is found again by file identity and offset when that file is still
there, else by seq: the newest file whose first record is not past the one
wanted. An open file is finished once the live name names another file; it is
read to its end once more after that is seen (the writer never appends to a
file it has rotated away), then the next file is the one whose first seq
follows it. fileset.py offers no "open with identity", so _open_file is here.
"""

from __future__ import annotations

import fcntl
import gzip
import io
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, NamedTuple, TypeAlias

from auditlog import record_fast
from auditlog.chain import ChainError, parse_line
from auditlog.fileset import GZIP_ERRORS, audit_files, open_audit_file, scan_tail, set_lock
from auditlog.syslog.checkpoint import Position
from auditlog.syslog.rfc5424 import RecordFields
from auditlog.syslog.sealed_line import c_parts_of, read_fields

if TYPE_CHECKING:
    from auditlog.syslog.framer import Framer

log = logging.getLogger(__name__)

_BACK_WINDOW = 1 << 20  # bytes read back from a checkpoint's offset to find the record it follows
_FIRST_SEQ_LINES = 64  # lines looked at for a file's first record (garbage at the start of a file)
# Bytes read in one call (a plain file: one system call; a .gz: one per MiB stored), whole lines kept in
# _Open.ahead until taken. Each system call lets go of the GIL, and while the pipeline is busy a thread
# that did waits a switch interval (5 ms) or more to get it back: so one read serves several batches
# when the forwarder is behind, instead of one read (and a readline) per 256 KiB (bench/syslog_throughput.py).
_READ_AHEAD = 4 << 20
_GZ_BUFFER = 1 << 20  # GzipFile reads its file 8 KiB at a time: served from a buffer this large


Split: TypeAlias = Callable[[bytes], "tuple[list[bytes], bytes]"]
_new_record = tuple.__new__  # TailRecord(...) would run a Python-level __new__, once per record


class TailRecord(NamedTuple):
    """One sealed record read from the set: its line (no newline), its header fields, the file and offset after it.

    A tuple, not a dataclass: the tailer makes one per record on the forwarder's hot path.
    """

    line: bytes
    fields: RecordFields
    identity: tuple[int, int]
    offset: int

    @property
    def seq(self) -> int:
        return self.fields.seq

    @property
    def position(self) -> Position:
        return Position(*self.identity, self.offset, self.fields.seq)


Framed: TypeAlias = "bytes | TailRecord"  # a record polled with a Framer: its frame, or itself (Batch.framed)


@dataclass(frozen=True)
class Batch:
    """What one poll read: records in seq order, records found missing (retention) and lines skipped.

    Polled with a Framer, the records are in `framed` instead: each one's frame where the framer made it, else
    its TailRecord (`slow` of them), in seq order; `last` is the position after the last one.
    """

    records: tuple[TailRecord, ...] = ()
    lost: int = 0
    skipped: int = 0
    bytes: int = 0
    framed: tuple[Framed, ...] = ()
    slow: int = 0
    last: Position | None = None

    @property
    def count(self) -> int:
        return len(self.records) + len(self.framed)

    @property
    def end(self) -> Position | None:
        if self.framed:
            return self.last
        return self.records[-1].position if self.records else None


@dataclass
class _Open:
    reader: IO[bytes]
    raw: IO[bytes]
    identity: tuple[int, int]
    gz: bool
    offset: int = 0
    first_seq: int | None = None
    finished_seen: bool = False
    ahead: list[bytes] = field(default_factory=list)  # whole lines read and not taken yet, the next one last
    tail: bytes = b""  # read after them: the start of a line not ended (yet), completed by the next read
    one_by_one: bool = False  # after a gzip error: the lines before the damage are read one at a time


@dataclass
class _Poll:
    records: list[Any] = field(default_factory=list)  # TailRecords, and with a Framer frames (bytes) too
    lost: int = 0
    skipped: int = 0
    bytes: int = 0
    framed: bool = False
    slow: int = 0  # with a Framer: the TailRecords among `records`
    run_end: Position | None = None  # after the framer's last run

    def batch(self) -> Batch:
        if not self.framed:
            return Batch(tuple(self.records), self.lost, self.skipped, self.bytes)
        last = self.run_end
        if self.records and type(self.records[-1]) is TailRecord:
            last = self.records[-1].position
        return Batch((), self.lost, self.skipped, self.bytes, tuple(self.records), self.slow, last)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _open_file(path: Path) -> _Open:
    raw = open(path, "rb", buffering=0)  # a read is one system call
    try:
        st = os.fstat(raw.fileno())
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        # A GzipFile is a binary file; typeshed does not declare it an IO[bytes].
        reader: IO[bytes] = gzip.GzipFile(  # type: ignore[assignment]
            fileobj=io.BufferedReader(raw, _GZ_BUFFER), mode="rb") if gz else raw
    except BaseException:
        raw.close()
        raise
    return _Open(reader, raw, (st.st_dev, st.st_ino), gz)


def _seq_ending_at(reader: IO[bytes], offset: int) -> int | None:
    """The seq of the record whose line ends at `offset` (None if none does); leaves `reader` at `offset`."""
    begin = max(0, offset - _BACK_WINDOW)
    reader.seek(begin)
    block = reader.read(offset - begin)
    if len(block) != offset - begin or not block.endswith(b"\n"):
        return None
    start = block.rfind(b"\n", 0, len(block) - 1) + 1
    if start == 0 and begin > 0:
        return None  # a line longer than the window: not a line we wrote
    try:
        return parse_line(block[start:-1])[1]
    except ChainError:
        return None


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """(the lines of `data` without their newlines, the next one last; the text after the last newline): what
    record_fast.lines_reversed() does in C, where built."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" after a newline
    lines.reverse()
    return lines, tail


def _next_line(cur: _Open, size: int = _READ_AHEAD, split: Split = split_lines) -> tuple[bytes, bool]:
    """(the next line of `cur` without its newline, True), or (a line not ended yet or b"" at the end for now, False).

    Lines are read a block of _READ_AHEAD bytes at a time (one read, one split, not a readline per line)
    and kept in `cur.ahead`; the unended line at the end of
    a block is completed by the next read. A gzip error inside a block would lose the good lines before it:
    the file is then read again from `cur.offset` one line at a time, so exactly the lines before the damage
    are read."""
    if cur.ahead:
        return cur.ahead.pop(), True
    if cur.one_by_one:
        raw = cur.reader.readline()
        return (raw[:-1], True) if raw.endswith(b"\n") else (raw, False)
    try:
        data = cur.reader.read(max(size, _READ_AHEAD))
    except GZIP_ERRORS:
        cur.one_by_one, cur.tail = True, b""
        cur.reader.seek(cur.offset)
        return _next_line(cur, size, split)
    if cur.tail:
        data, cur.tail = cur.tail + data, b""
    lines, tail = split(data)
    if not lines:
        return tail, False  # the reader is past it: the caller seeks back to cur.offset, or skips a torn end
    cur.tail = tail
    cur.ahead = lines
    return lines.pop(), True


def first_seq(path: Path) -> int | None:
    """The seq of the first record in `path` (None for a file without one in its first lines)."""
    try:
        with open_audit_file(path) as f:
            for _, raw in zip(range(_FIRST_SEQ_LINES), f):
                if raw.endswith(b"\n"):
                    try:
                        return parse_line(raw[:-1])[1]
                    except ChainError:
                        continue
    except (FileNotFoundError, *GZIP_ERRORS):
        return None
    return None


class Tailer:
    """Reads sealed records from the set of `live` in seq order, from `start` (None: the oldest on disk).

    `poll` never blocks or sleeps: it returns what is there now. The caller
    persists a record's position only once it has delivered it.
    """

    def __init__(self, live: Path, start: Position | None = None) -> None:
        self.live = Path(live)
        self._start = start
        self._want: int | None = None if start is None else start.seq + 1
        self._resuming = start is not None  # records before `_want` are skipped only while resuming
        self._cur: _Open | None = None
        self._prev_chain: str | None = None  # of the last record read: lets read_fields skip the JSON parse
        self._parts_of = c_parts_of()  # its byte work in C, where built
        self._split = record_fast.lines_reversed() or split_lines  # a read block into lines, in C where built

    @property
    def next_seq(self) -> int | None:
        """The seq expected next (None before the first record is read)."""
        return self._want

    def close(self) -> None:
        if self._cur is not None:
            self._cur.reader.close()
            self._cur.raw.close()
            self._cur = None

    def poll(self, max_records: int = 500, max_bytes: int = 1 << 20, framer: Framer | None = None) -> Batch:
        """Up to `max_records` records (about `max_bytes` of lines) that follow the last one read; with `framer`,
        as frames where it can make them (Batch.framed)."""
        out = _Poll(framed=framer is not None)
        if self._cur is None and not self._reopen():
            return Batch()
        while len(out.records) < max_records and out.bytes < max_bytes:
            cur = self._cur
            if cur is None:
                break
            if cur.ahead and framer is not None and self._take_run(cur, framer, out, max_records, max_bytes):
                continue
            if cur.ahead:  # _next_line's first case, without the call: most lines are taken here
                raw = cur.ahead.pop()
                cur.offset += len(raw) + 1
                self._take(cur, raw, out)
                continue
            try:
                raw, whole = _next_line(cur, split=self._split)
            except GZIP_ERRORS as exc:  # a damaged .gz: its remaining records are lost
                log.warning("syslog tailer: %s ends early: %s", self.live, exc)
                raw, whole = b"", False
                cur.finished_seen = True
            if whole:
                cur.offset += len(raw) + 1
                self._take(cur, raw, out)
                continue
            if raw and (cur.gz or cur.finished_seen):
                cur.offset += len(raw)  # a torn last line of a finished file: the writer restarted the chain
                out.skipped += 1
                continue
            if raw:
                cur.reader.seek(cur.offset)  # the writer is in the middle of this line
                break
            if not cur.finished_seen:
                if cur.gz or _identity(self.live) != cur.identity:
                    cur.finished_seen = True
                    continue  # read once more: lines written just before the rotation
                break
            if not self._next_file():
                break
        return out.batch()

    def _take_run(self, cur: _Open, framer: Framer, out: _Poll, max_records: int, max_bytes: int) -> bool:
        """The frames of the read-ahead lines `framer` takes in one go; False if it takes none (the next line is
        taken the Python way: _take). Only in the middle of a file, past a resume and after a record read."""
        want, prev = self._want, self._prev_chain
        if want is None or prev is None or self._resuming or cur.first_seq is None:
            return False
        taken, line_bytes, chain = framer.take(cur.ahead, out.records, prev, want, max_records - len(out.records),
                                               max_bytes - out.bytes)
        if not taken:
            return False
        self._want, self._prev_chain = want + taken, chain
        cur.offset += line_bytes + taken  # and their newlines
        out.bytes += line_bytes
        out.run_end = Position(*cur.identity, cur.offset, want + taken - 1)
        return True

    def _take(self, cur: _Open, line: bytes, out: _Poll) -> None:
        try:
            fields = read_fields(line, self._prev_chain, self._parts_of)
        except ChainError:
            out.skipped += 1
            return
        seq = fields.seq
        self._prev_chain = fields.chain
        if cur.first_seq is None:
            cur.first_seq = seq
        want = self._want
        if want is not None and seq < want:
            if self._resuming:
                return  # before the checkpoint: delivered already
            # Seq went back outside a resume: the file set was started anew (logs removed).
            log.warning("syslog tailer: %s: seq went back from %d to %d; the audit log was started anew",
                        self.live, want - 1, seq)
        elif want is not None and seq > want:
            out.lost += seq - want
            log.warning("syslog tailer: %s: records %d..%d were removed before they were forwarded",
                        self.live, want, seq - 1)
        self._resuming = False
        self._want = seq + 1
        out.slow += out.framed
        out.records.append(_new_record(TailRecord, (line, fields, cur.identity, cur.offset)))
        out.bytes += len(line)

    # --- choosing a file ---

    def _listing(self) -> list[tuple[Path, int | None]]:
        return [(path, first_seq(path)) for _, path in audit_files(self.live)]

    def _open_chosen(self, pick: Path, after: Position | None = None) -> bool:
        """Open `pick`, at `after` if given and the record before it there is after.seq."""
        try:
            cur = _open_file(pick)
        except FileNotFoundError:
            return False
        if after is not None:
            # An inode freed by the compressor or retention is soon reused by a newer
            # file: the identity alone does not prove it is the checkpoint's file.
            try:
                ok = _seq_ending_at(cur.reader, after.offset) == after.seq
            except (OSError, *GZIP_ERRORS):
                ok = False
            if not ok:
                cur.reader.close()
                cur.raw.close()
                return False
            cur.offset = after.offset
        self.close()
        self._cur = cur
        return True

    def _reopen(self) -> bool:
        """Open the file to continue from (the checkpoint's, else the one holding the seq wanted)."""
        with set_lock(self.live, fcntl.LOCK_SH):
            start, self._start = self._start, None
            if start is not None:
                for _, path in audit_files(self.live):
                    if _identity(path) == start.identity and self._open_chosen(path, start):
                        return True
            listing = self._listing()
            if self._want is not None and self._disk_head(listing) < self._want - 1:
                log.warning("syslog tailer: %s: newest record on disk is before seq %d: starting anew",
                            self.live, self._want - 1)
                self._want, self._resuming = None, False
            with_records = [(path, seq) for path, seq in listing if seq is not None]
            if not with_records:
                return self._open_chosen(self.live) if self.live.exists() else False
            want = self._want
            at_or_before = [path for path, seq in with_records if want is None or seq <= want]
            pick = at_or_before[-1] if want is not None and at_or_before else with_records[0][0]
            return self._open_chosen(pick)

    def _disk_head(self, listing: list[tuple[Path, int | None]]) -> int:
        for path, seq in reversed(listing):
            if seq is not None:
                last = scan_tail(path).last
                return last[0] if last is not None else seq
        return 0

    def _next_file(self) -> bool:
        """Move from the finished file to the one after it; False if there is none yet."""
        cur = self._cur
        if cur is None:
            return False
        after = cur.first_seq if cur.first_seq is not None else (self._want or 1) - 1
        with set_lock(self.live, fcntl.LOCK_SH):
            newer = [(seq, path) for path, seq in self._listing() if seq is not None and seq > after]
            if newer:
                return self._open_chosen(min(newer)[1])
            live = _identity(self.live)
            if live is not None and live != cur.identity:
                return self._open_chosen(self.live)  # a fresh live file without records yet
        return False

    def backlog_bytes(self) -> int:
        """Bytes on disk not read yet: the rest of the open file and every newer file (gzip files as stored)."""
        cur = self._cur
        if cur is None:
            return sum(path.stat().st_size for _, path in audit_files(self.live) if path.exists())
        total = 0 if cur.gz else max(0, os.fstat(cur.raw.fileno()).st_size - cur.offset)
        after = cur.first_seq if cur.first_seq is not None else 0
        for path, seq in self._listing():
            ident = _identity(path)
            if ident is not None and ident != cur.identity and (seq is None or seq > after):
                total += path.stat().st_size
        return total
