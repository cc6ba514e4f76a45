"""Reading audit file sets for `npaudit logs`: every line in order, or only the last N matches.

The files are pinned (fileset.pin_files) so a writer rotating meanwhile makes a file
neither read twice nor skipped. Within a set lines come in file order, which is seq
order; several sets (copies from several nodes) are merged by @timestamp. A SIEM
copy reads the same: forwarded RFC 5424 messages are unwrapped and re-sent
duplicates dropped (auditlog.copy_lines).
"""

from __future__ import annotations

import collections
import heapq
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Sequence

from auditlog.chain import SEQ_KEY
from auditlog.copy_lines import CopyLines
from auditlog.fileset import DEFAULT_BASE, GZIP_ERRORS, MAX_LINE_BYTES, pin_files, set_lock_path, split_name
from auditlog.query import Match, Query, record_time

__all__ = ["BLOCK_BYTES", "LogReader", "Position", "line_blocks", "line_seq"]

BLOCK_BYTES = 1 << 20  # read size: large enough that per-block work is negligible
_SEQ = re.compile(re.escape(SEQ_KEY.encode("ascii")) + rb"(\d+)")


def line_seq(raw: bytes) -> int | None:
    """npaudit.seq of a record line, without parsing it (no other member is called "seq")."""
    m = _SEQ.search(raw)
    return int(m[1]) if m else None


@dataclass
class Position:
    """Where a reader of the live file stands: the open file, the partial line read after the
    last complete one, and the seq of the last complete record (None if none was seen)."""

    file: IO[bytes] | None
    pending: bytes
    seq: int | None


class _Blocks:
    """Runs of complete lines (each ending in b"\\n") of one open file; the partial line after
    the last newline is kept in `pending`, and `last_seq` is that of the last complete line.
    A line longer than MAX_LINE_BYTES is skipped as it is read, never held: `overlong` counts
    them and `overlong_lines` has the line numbers of the first few."""

    def __init__(self, f: IO[bytes]) -> None:
        self.file = f
        self.pending = b""
        self.last_seq: int | None = None
        self.truncated = False
        self.overlong = 0
        self.overlong_lines: list[int] = []
        self._lines = 0  # complete lines read so far, over-long ones included

    def __iter__(self) -> Iterator[bytes]:
        f = self.file
        parts: list[bytes] = []  # the line being read, while it is not complete
        held, skipping = 0, False
        try:
            while chunk := f.read(BLOCK_BYTES):
                first = chunk.find(b"\n")
                if skipping or (first < 0 and held + len(chunk) > MAX_LINE_BYTES) \
                        or (first >= 0 and held + first > MAX_LINE_BYTES):
                    if not skipping:  # the line being read is over-long: drop what is held of it
                        skipping, parts, held = True, [], 0
                        self._overlong(self._lines + 1)
                    if first < 0:
                        continue
                    skipping = False
                    self._lines += 1
                    chunk, first = chunk[first + 1:], 0
                    if not chunk:
                        continue
                cut = chunk.rfind(b"\n")
                if cut < 0:
                    parts.append(chunk)
                    held += len(chunk)
                    continue
                block = b"".join([*parts, chunk[:cut + 1]])
                parts, held = [chunk[cut + 1:]], len(chunk) - cut - 1
                self._lines += block.count(b"\n")
                start = block.rfind(b"\n", 0, len(block) - 1) + 1
                self.last_seq = line_seq(block[start:]) or self.last_seq
                self.pending = parts[0]
                yield block
        except GZIP_ERRORS:
            self.truncated = True  # a short gzip stream: what was read is what there is
        self.pending = b"" if skipping else b"".join(parts)

    def _overlong(self, line: int) -> None:
        self.overlong += 1
        if len(self.overlong_lines) < 5:
            self.overlong_lines.append(line)


def line_blocks(f: IO[bytes]) -> Iterator[bytes]:
    """Runs of complete lines of `f`; a last line without b"\\n" (torn, or being written) is left out."""
    return iter(_Blocks(f))


class LogReader:
    """The audit files under `paths` (directories and/or files), pinned until close."""

    def __init__(self, paths: Sequence[Path], base: str = DEFAULT_BASE) -> None:
        files, self.notes, self._pinned = pin_files(paths, base)  # FileNotFoundError: a bad path
        self.files: list[Path] = files
        sets: dict[Path, list[Path]] = {}
        for path in files:  # pin_files lists them oldest first
            sets.setdefault(path.with_name(split_name(path.name)[0]), []).append(path)
        self.sets = sets
        # Per set: forwarded lines unwrapped, re-sends dropped (not searched for in a writer's own set).
        self._copies = {live: CopyLines(dedup=not set_lock_path(live).exists()) for live in sets}
        self.end: Position | None = None  # of a single set's live file, once it has been read
        self._seen_seq: int | None = None  # of the last line of the files read before it

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._pinned.close()

    def select(self, query: Query, last: int | None = None) -> Iterator[Match]:
        """The matching lines, oldest first; with `last`, only the newest `last` of them."""
        if last is not None:
            last = min(last, sys.maxsize)  # more than any file holds: all of them (a deque takes no more)
        if len(self.sets) == 1:
            files = next(iter(self.sets.values()))
            if last is None:
                yield from self._select_files(files, query)
            else:
                yield from self._last_of_set(files, query, last)
            return
        merged = heapq.merge(*(self._select_files(files, query) for files in self.sets.values()),
                             key=lambda match: record_time(*match) or "")
        if last is None:
            yield from merged
        elif last > 0:
            yield from collections.deque(merged, maxlen=last)

    def _select_files(self, files: Sequence[Path], query: Query) -> Iterator[Match]:
        for path in files:
            yield from query.select(self._blocks(path))

    def _last_of_set(self, files: Sequence[Path], query: Query, last: int) -> Iterator[Match]:
        # Newest file first, stopping once `last` matches are found: --last 20 over a
        # large set reads the live file only.
        found: list[list[Match]] = []
        total = 0
        for path in reversed(files):
            if total >= last:
                break
            newest = collections.deque(query.select(self._blocks(path)), maxlen=last - total)
            found.append(list(newest))
            total += len(newest)
        for matches in reversed(found):
            yield from matches

    def _blocks(self, path: Path) -> Iterator[bytes]:
        live = split_name(path.name)[1] == 0 and len(self.sets) == 1
        f = self._pinned.open(path)
        blocks = _Blocks(f)
        copy = self._copies[path.with_name(split_name(path.name)[0])]
        before = copy.duplicates, copy.test_messages
        try:
            for block in blocks:
                block = copy.block(block)
                if block:
                    yield block
        except BaseException:
            f.close()
            raise
        if (copy.duplicates, copy.test_messages) != before:
            self.notes.append(f"{path}: skipped {copy.duplicates - before[0]} re-sent duplicate records and "
                              f"{copy.test_messages - before[1]} `npaudit syslog test` messages")
        if blocks.truncated:
            self.notes.append(f"{path}: gzip stream cut short; read what it holds")
        if blocks.overlong:
            lines = ", ".join(map(str, blocks.overlong_lines)) + (", ..." if blocks.overlong > 5 else "")
            self.notes.append(f"{path}: skipped {blocks.overlong} lines longer than {MAX_LINE_BYTES} bytes "
                              f"(line {lines}): not audit records")
        if live:
            # Kept open for --follow: it continues from here, even if the file is renamed meanwhile.
            self.end = Position(f, blocks.pending, blocks.last_seq or self._seen_seq)
        else:
            self._seen_seq = blocks.last_seq or self._seen_seq
            f.close()

