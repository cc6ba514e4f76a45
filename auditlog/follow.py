"""`npaudit logs --follow`: new records of the live audit file as they are written, across rotation and gzip.

The follower holds the live file open. When the name audit.jsonl stops naming that
file (the writer renamed it to .1; the compressor may already have replaced .1 by
.1.gz and unlinked it), the open file is read to its end, and the new live file is
opened. If npaudit.seq shows records missing between the two (several rotations
between two polls), they are read from the rotated files, which are pinned for it
like everything `npaudit logs` reads.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO, Callable

from auditlog.fileset import MAX_LINE_BYTES, PinnedFiles, pin_files
from auditlog.logread import BLOCK_BYTES, Position, line_blocks, line_seq
from auditlog.query import Match, Query

__all__ = ["Follower", "position_at_end"]

POLL_SECONDS = 0.2  # how often an idle follower looks at the file: tail -F's order of magnitude
_TAIL_BYTES = 64 * 1024


def _identity(f: IO[bytes]) -> tuple[int, int]:
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino


def position_at_end(live: Path) -> Position:
    """A position at the end of the live file's complete lines (nothing read if it does not exist yet)."""
    try:
        f = open(live, "rb")
    except FileNotFoundError:
        return Position(None, b"", None)
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - _TAIL_BYTES))
    tail = f.read()
    cut = tail.rfind(b"\n")
    start = tail.rfind(b"\n", 0, cut) + 1 if cut >= 0 else 0
    return Position(f, tail[cut + 1:], line_seq(tail[start:cut + 1]) if cut >= 0 else None)


class Follower:
    """Follows the file set whose live file is `live` from `start`; `poll` returns what matched since."""

    def __init__(self, live: Path, query: Query, start: Position) -> None:
        self.live = live
        self._query = query
        self._file = start.file
        self._pending = start.pending
        self._skipping = False  # in a line longer than MAX_LINE_BYTES: its bytes are dropped up to its newline
        self._seq = start.seq
        self.notes: list[str] = []  # records that were gone before they could be read

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def run(self, emit: Callable[[list[Match]], None], stop: threading.Event,
            interval: float = POLL_SECONDS) -> None:
        """emit(matches) after each poll that found some, until `stop` is set."""
        while not stop.is_set():
            found = self.poll()
            if found:
                emit(found)
            else:
                stop.wait(interval)

    def poll(self) -> list[Match]:
        """The matching records written since the last poll."""
        if self._file is None:
            return self._reopen(None)
        out = self._read_new(self._file)
        if not self._moved():
            return out
        # Renamed away: nothing writes to it any more, so what is left in it is all there is.
        out += self._read_new(self._file)
        drained = _identity(self._file)
        self._file.close()
        self._file, self._pending, self._skipping = None, b"", False
        return out + self._reopen(drained)

    def _moved(self) -> bool:
        try:
            st = os.stat(self.live)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != _identity(self._file) if self._file is not None else True

    def _read_new(self, f: IO[bytes], skip_seen: bool = False) -> list[Match]:
        """Matches among the complete lines of `f` from where it stands to its end."""
        out: list[Match] = []
        while chunk := f.read(BLOCK_BYTES):
            if self._skipping:
                first = chunk.find(b"\n")
                if first < 0:
                    continue
                self._skipping, chunk = False, chunk[first + 1:]
            data = self._pending + chunk
            cut = data.rfind(b"\n")
            self._pending = data[cut + 1:]
            if cut >= 0:
                out += self._take(data[:cut + 1], skip_seen)
            if len(self._pending) > MAX_LINE_BYTES:  # not a record: never held whole
                self._pending, self._skipping = b"", True
                self.notes.append(f"skipped a line longer than {MAX_LINE_BYTES} bytes: not an audit record")
        return out

    def _take(self, block: bytes, skip_seen: bool) -> list[Match]:
        """Matches of the complete lines in `block`; with skip_seen, lines at or below the last seq seen
        (and lines without one) are left out."""
        out: list[Match] = []
        match = self._query.match
        for line in block.split(b"\n")[:-1]:
            seq = line_seq(line)
            if skip_seen and (seq is None or (self._seq is not None and seq <= self._seq)):
                continue
            if seq is not None:
                self._seq = seq
            shown, record = match(line)
            if shown:
                out.append((line, record))
        return out

    def _reopen(self, drained: tuple[int, int] | None) -> list[Match]:
        """Open the live file anew; first read the rotated files holding records after the last seq
        seen that are not in `drained` (the file just read to its end)."""
        try:
            files, _, pinned = pin_files([self.live.parent], self.live.name)
        except FileNotFoundError:
            return []  # no file yet (a node before its first record, or mid-rotation)
        out: list[Match] = []
        try:
            live = files[-1] if files and files[-1] == self.live else None
            rotated = files[:-1] if live is not None else files
            # Nothing seen yet and no file when following began: every record in the set is new,
            # including those a rotation moved away before this first look.
            unread = (self._unread(pinned, rotated, self._seq, drained) if self._seq is not None
                      else rotated if drained is None else [])
            for path in unread:
                with pinned.open(path) as f:
                    for block in line_blocks(f):
                        out += self._take(block, skip_seen=True)
            if live is not None:
                f = pinned.open(live)
                if not rotated and line_seq(f.readline(MAX_LINE_BYTES)) == 1:
                    self._seq = None  # a new chain in a new set (the old files were removed)
                f.seek(0)
                self._file, self._pending, self._skipping = f, b"", False
                out += self._read_new(f, skip_seen=self._seq is not None)
        finally:
            pinned.close()
        return out

    def _unread(self, pinned: PinnedFiles, rotated: list[Path], seq: int,
                drained: tuple[int, int] | None) -> list[Path]:
        """The rotated files, oldest first, that may hold records after `seq` not read yet."""
        wanted: list[Path] = []
        first: int | None = None
        for path in reversed(rotated):
            with pinned.open(path) as f:
                if _identity(f) == drained:
                    return wanted[::-1]
                first = line_seq(f.readline(MAX_LINE_BYTES))
            wanted.append(path)
            if first is not None and first <= seq + 1:
                return wanted[::-1]
        if wanted:
            gone = f"{seq + 1}-{first - 1}" if first is not None else f"after {seq}"
            self.notes.append(f"records {gone} were removed (retention) before they could be read")
        return wanted[::-1]
