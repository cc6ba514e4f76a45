"""The audit file set: names, listing, locking against a writer's renames, reading, and its tail.

audit.jsonl is the live file; audit.jsonl.1[.gz] the newest rotated one, .2 the one
before, and so on. Used by the writer (resume, retention, compression) and by verify.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import gzip
import os
import re
import time
import zlib
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Sequence, TypeVar

from auditlog.chain import ChainError, parse_line

_T = TypeVar("_T")

DEFAULT_DIR = Path("/var/log/npaudit")
DEFAULT_BASE = "audit.jsonl"
# A short or corrupt gzip stream; other OSErrors (permissions, I/O) are not the file's content.
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


_NAME = re.compile(r"(?P<base>.+?)(?:\.(?P<index>\d+))?(?:\.gz)?")


def split_name(name: str) -> tuple[str, int]:
    """(base, rotation index) of a file name: ("audit.jsonl", 2) for audit.jsonl.2.gz, 0 for the live file."""
    m = _NAME.fullmatch(name)
    if m is None:
        return name, 0
    return m["base"], int(m["index"] or 0)


def audit_files(live: Path) -> list[tuple[int, Path]]:
    """(index, path) of the live file and its rotated files that exist, oldest first, live last."""
    pattern = re.compile(re.escape(live.name) + r"(?:\.(\d+)(?:\.gz)?)?")
    found: list[tuple[int, Path]] = []
    with suppress(FileNotFoundError):
        for entry in os.scandir(live.parent):
            m = pattern.fullmatch(entry.name)
            if m and entry.is_file():
                found.append((int(m[1] or 0), Path(entry.path)))
    found.sort(key=lambda item: (item[0] == 0, -item[0], item[1].name))  # highest index is oldest
    return found


def _or_compressed(path: Path, use: Callable[[Path], _T]) -> _T:
    """use(path); if that is a plain rotated file that is gone, use(path + ".gz"): the
    running writer has usually just compressed it (the same records)."""
    try:
        return use(path)
    except FileNotFoundError:
        if split_name(path.name)[1] == 0 or path.name.endswith(".gz"):
            raise
        return use(path.with_name(path.name + ".gz"))


def _open_sniffed(path: Path | str) -> IO[bytes]:
    """A binary reader of plain or gzip content, told apart by the gzip magic bytes."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    # A GzipFile is a binary file; typeshed does not declare it an IO[bytes] (here and below).
    return gzip.open(path, "rb") if gz else open(path, "rb")  # type: ignore[return-value]


def open_audit_file(path: Path) -> IO[bytes]:
    """A binary reader of a live, rotated or gzip-rotated audit file (a plain rotated
    file the writer has just compressed is read from its .gz)."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return _or_compressed(path, _open_sniffed)


# The longest line a reader takes (without its newline). The writer's records are a few KiB (the longest,
# an aggregate with every rule name and peer at their caps, well under 1 MiB); a longer line is not the
# writer's, and holding it whole would let a small gzip that inflates to a GiB without a newline take
# that much memory.
MAX_LINE_BYTES = 4 << 20


class LineTooLong(Exception):
    """A line longer than MAX_LINE_BYTES: where it starts (line number, uncompressed offset)."""

    def __init__(self, path: Path, line: int, offset: int) -> None:
        super().__init__(f"{path} line {line}: longer than {MAX_LINE_BYTES} bytes")
        self.path, self.line, self.offset = path, line, offset


def iter_lines(path: Path, opener: Callable[[Path], IO[bytes]] = open_audit_file
               ) -> Iterator[tuple[int, int, bytes]]:
    """(offset, line number, raw bytes including its b"\\n") of each line; offsets are uncompressed.
    LineTooLong at a line longer than MAX_LINE_BYTES, read no further than that."""
    offset, lineno = 0, 0
    with opener(path) as f:
        while raw := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise LineTooLong(path, lineno, offset)
            yield offset, lineno, raw
            offset += len(raw)


class _Moved(Exception):
    """A listed name no longer names the file that was opened for it."""


class PinnedFiles:
    """The files of one verify run, each opened once right after listing.

    A running writer renames files while verify reads (rotation shifts .1 to .2,
    the compressor replaces .N by .N.gz): reading by name could then read a file
    twice or not at all. Every read goes through the descriptor opened for the
    name listed (reopened via /proc/self/fd for an offset of its own), and the
    listing is accepted only if every name still names what was opened.
    """

    def __init__(self, files: Sequence[Path]) -> None:
        self._fds: dict[Path, int] = {}
        try:
            for path in files:
                self._fds[path] = self._open(path)
            for path, fd in self._fds.items():
                st = os.fstat(fd)
                if _identity(self._current(path)) != (st.st_dev, st.st_ino):
                    raise _Moved(str(path))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open(path: Path) -> int:
        return _or_compressed(path, lambda p: os.open(p, os.O_RDONLY))

    @staticmethod
    def _current(path: Path) -> os.stat_result:
        return _or_compressed(path, os.stat)

    def open(self, path: Path) -> IO[bytes]:
        """A new reader of what `path` named when it was pinned (gzip or plain, by content)."""
        fd = self._fds.get(path)
        if fd is None:
            return open_audit_file(path)
        return _open_sniffed(f"/proc/self/fd/{fd}")

    def size(self, path: Path) -> int:
        """The size of the pinned file now (a live file grows while a writer appends)."""
        return os.fstat(self._fds[path]).st_size

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def set_lock_path(live: Path) -> Path:
    """The lock file a writer holds while it renames files of the set (concurrent-log-handler's name)."""
    return live.with_name(f".__{live.name}.lock")


@contextlib.contextmanager
def set_lock(live: Path, operation: int) -> Iterator[bool]:
    """flock the file set's lock (LOCK_SH to read a still set, LOCK_EX to rename in it);
    yields False when there is no lock file to take (no writer ever ran there, or no access)."""
    try:
        fd = os.open(set_lock_path(live), os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, operation)
        yield True
    finally:
        os.close(fd)  # releases the lock


def pin_files(paths: Sequence[Path], base: str = DEFAULT_BASE, attempts: int = 20
              ) -> tuple[list[Path], list[str], PinnedFiles]:
    """collect_files, then PinnedFiles, while holding the set's lock shared so that a
    running writer renames nothing meanwhile (a directory listing is not atomic: a
    rename during it can hide a file under both its names). Listed again if a name
    moved anyway (no lock file, or files given by name from several sets)."""
    for attempt in range(attempts):
        lives = {p / base if p.is_dir() else p.with_name(split_name(p.name)[0]) for p in paths}
        with contextlib.ExitStack() as locks:
            for live in sorted(lives):
                locks.enter_context(set_lock(live, fcntl.LOCK_SH))
            files, notes = collect_files(paths, base)
            try:
                return files, notes, PinnedFiles(files)
            except (FileNotFoundError, _Moved):
                if attempt == attempts - 1:
                    raise
        time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")


def node_sets(directory: Path, base: str = DEFAULT_BASE) -> list[Path]:
    """The `base` sets in the subdirectories of `directory` (a receiver writes each node's copy into a
    directory of its own: <dir>/<node>/audit.jsonl), each oldest first, subdirectories by name."""
    files: list[Path] = []
    with suppress(OSError):
        for sub in sorted(os.scandir(directory), key=lambda entry: entry.name):
            if sub.is_dir():
                files += [p for _, p in audit_files(Path(sub.path) / base)]
    return files


def collect_files(paths: Sequence[Path], base: str = DEFAULT_BASE) -> tuple[list[Path], list[str]]:
    """Files to check, oldest first, and notes on files ignored; a directory means its `base`* set."""
    files: list[Path] = []
    notes: list[str] = []
    for path in paths:
        if path.is_dir():
            found = [p for _, p in audit_files(path / base)]
            if not found:
                # The file name is configurable: accept one other *.jsonl set in the directory.
                bases = {split_name(n)[0] for n in os.listdir(path) if split_name(n)[0].endswith(".jsonl")}
                nodes = [] if bases else node_sets(path, base)
                if nodes:  # a receiver's copy, one directory per node (config/syslog/)
                    files += nodes
                    continue
                if len(bases) != 1:
                    raise FileNotFoundError(f"no {base} files in {path}"
                                            + (f" (found {', '.join(sorted(bases))}: pass --base)" if bases else ""))
                base = bases.pop()
                found = [p for _, p in audit_files(path / base)]
            names = {p.name for p in found}
            notes += [f"ignored {path / n}: not a live or rotated audit file name"
                      for n in sorted(os.listdir(path)) if n.startswith(base) and n not in names]
            files += found
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    unique = list(dict.fromkeys(files))
    # Explicit files are put in rotation order too: highest index first, the live file last.
    unique.sort(key=lambda p: -split_name(p.name)[1])
    return unique, notes


# --- where the chain stands at the end of a file (the writer resumes from it) ---

_TAIL_BLOCK = 256 * 1024  # bytes read from the end of a plain file
_TAIL_LINES = 256         # lines kept from the end of a gzip file


@dataclass(frozen=True)
class Tail:
    """The end of one file, as the writer needs it to continue the chain."""

    last: tuple[int, str] | None     # (seq, chain) of the last complete record
    damage: tuple[int, int] | None   # (offset, line) of the first bytes after it that are not a record
    size: int
    ends_with_newline: bool


def _parses(raw: bytes) -> tuple[int, str] | None:
    try:
        _, seq, chain = parse_line(raw.rstrip(b"\n"))
    except ChainError:
        return None
    return seq, chain


def _line_number(path: Path, offset: int) -> int:
    count, pos = 1, 0
    with open_audit_file(path) as f:
        while pos < offset:
            block = f.read(min(1 << 20, offset - pos))
            if not block:
                break
            count += block.count(b"\n")
            pos += len(block)
    return count


def _window(path: Path) -> tuple[list[tuple[int, bytes]], bool, int, bool]:
    """The last lines of `path` as (offset, raw); whether they start the file; size; ends with b"\n"."""
    if path.name.endswith(".gz"):
        lines: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=_TAIL_LINES)
        size = 0
        with suppress(*GZIP_ERRORS, LineTooLong):  # a short gzip stream: what was read is what there is
            for offset, _, raw in iter_lines(path):
                lines.append((offset, raw))
                size = offset + len(raw)
        ends_nl = not lines or lines[-1][1].endswith(b"\n")
        return list(lines), not lines or lines[0][0] == 0, size, ends_nl
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - _TAIL_BLOCK)
        f.seek(start)
        block = f.read()
    pieces = block.split(b"\n")
    out, pos = [], start
    for i, piece in enumerate(pieces):
        raw = piece + b"\n" if i < len(pieces) - 1 else piece
        if raw and not (i == 0 and start > 0):  # the first piece of a mid-file block is partial
            out.append((pos, raw))
        pos += len(raw)
    return out, start == 0, size, size == 0 or block.endswith(b"\n")


def scan_tail(path: Path) -> Tail:
    """Where the chain stands at the end of one file, and what follows its last complete record."""
    lines, whole, size, ends_nl = _window(path)
    last, damage_offset = None, None
    for i in range(len(lines) - 1, -1, -1):
        last = _parses(lines[i][1])
        if last is not None:
            end = lines[i][0] + len(lines[i][1])
            damage_offset = end if end < size else None
            break
    if last is None and not whole:
        # No record in the window (a long run of garbage): read the whole file.
        with suppress(*GZIP_ERRORS, LineTooLong):
            for offset, _, raw in iter_lines(path):
                if (found := _parses(raw)) is not None:
                    last, damage_offset = found, offset + len(raw)
        if damage_offset is not None and damage_offset >= size:
            damage_offset = None
    if last is None and size:
        damage_offset = 0
    damage = None if damage_offset is None else (damage_offset, _line_number(path, damage_offset))
    return Tail(last, damage, size, ends_nl)
