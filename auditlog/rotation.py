"""The live audit file's rotation: the rotating handler, retention, and a rotation a crash cut short."""

from __future__ import annotations

import glob
import logging
import os
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

from concurrent_log_handler import ConcurrentRotatingFileHandler

from auditlog.compressor import remove_temporaries
from auditlog.fileset import audit_files
from packetin.ratelimited_log import RateLimitedLog

log = logging.getLogger(__name__)


class JsonlHandler(ConcurrentRotatingFileHandler):
    """ConcurrentRotatingFileHandler that hands write errors back and leaves compression to the writer.

    With use_gzip the library shifts .N and .N.gz alike; do_gzip compresses
    nothing, so the rotated file lands as a plain .1 and the writer's Compressor
    turns it into .1.gz later, off the write path.
    """

    error: BaseException | None = None
    size: int | None = None  # bytes in the open live file after our last write; None: not known
    _opened: tuple[Any, int, int] | None = None  # (stream, inode, device) of the stream last looked at
    strayed = 0  # records the last append found out of the live file: its own (moved), or all the file held (removed)
    strayed_kept = True  # that file still had a name (moved away), or not (removed)
    strayed_moved = 0  # records written to a live file found moved away after the write, all told (`write_lines`)
    strayed_removed = 0  # records of live files found removed, every one they held: lost with them
    # (line, bytes of it and its newline written, errno): what the event loop's quiet wait wrote of the next line
    prewritten: tuple[str, int, int] | None = None

    def write_lines(self, text: str) -> None:
        """Append `text` (whole lines, the last without its newline): a plain append while it can be
        (`append`), else logging's emit, which rotates or opens the live file first. Raises what the
        write raised."""
        self.error = None
        if not self.append(text):
            self.emit(logging.LogRecord("npaudit.audit", logging.INFO, "", 0, text, None, None))
        if self.error is not None:
            raise self.error
        if self.strayed:
            if self.strayed_kept:
                self.strayed_moved += self.strayed
            else:
                self.strayed_removed += self.strayed
            if self.strayed_kept:
                log.error("audit log %s: moved away by another program: the last %d record(s) went to the file "
                          "it was, not to a live file; the next go to a new one", self.baseFilename, self.strayed)
            else:
                log.error("audit log %s: removed by another program: the %d record(s) it held, the last write's "
                          "among them, are lost with it; the next go to a new one", self.baseFilename, self.strayed)
            self.strayed = 0

    def append(self, text: str) -> bool:
        """Append `text` and a newline to the open file with one write(2), without logging's machinery
        (a LogRecord, formatting, a lock-file round trip). Only while no rotation is due; False (nothing
        written) otherwise, and `emit` then rotates or reopens. The lock file guards renames against
        readers listing the set, and an append renames nothing. Write errors raise.

        Whether the open file is still the live one is looked at after the write, not before: the stat
        is a syscall, and after a quiet spell each one costs a lone record 50-80 µs on its way to being
        readable (bench/cold_calls.py). Another program moving or removing the live file (never
        ours: the writer owns its set) so costs the one write after it: `strayed` counts its records (a
        removed file: every record it held, all lost with it), `strayed_kept` says whether the file still
        has a name, and the next append goes to emit."""
        size, stream = self.size, self.stream
        if size is None or stream is None or not self.appends():
            return False
        self.size = None  # unknown if the write fails part way
        self.do_write(text)
        try:
            live = os.stat(self.baseFilename)
            same = (live.st_ino, live.st_dev) == self._identity(stream)
        except OSError:  # no live file any more
            same = False
        if same:
            self.size = size + len(text) + len(self.terminator)  # ASCII: one byte a character
        else:
            written = text.count("\n") + 1
            try:
                self.strayed_kept = os.fstat(stream.fileno()).st_nlink > 0
            except OSError:  # cannot tell: the worse case is said
                self.strayed_kept = False
            self.strayed += written if self.strayed_kept else max(written, _lines_in(stream.fileno()))
        return True

    def appends(self) -> bool:
        """Whether `append` would append now (no rotation due, the live file open)."""
        size, stream = self.size, self.stream
        return not (size is None or (self.maxBytes > 0 and size >= self.maxBytes) or stream is None or stream.closed
                    or not self._actual_keep_log_stream_open)  # (never off on Linux: the file stays open)

    def do_write(self, msg: str) -> None:
        """`msg` and a newline straight to the file with write(2), not through the text stream and its
        buffer (every path writes here, so nothing ever waits in that buffer)."""
        if self.stream is None or self.stream.closed:
            self.stream = self.do_open()
        text = msg + self.terminator
        try:
            data = text.encode(self.encoding or "ascii")
        except UnicodeError:  # as the library does: in a form the encoding takes, by its error policy
            data = text.encode(self.encoding or "ascii", self.unicode_error_policy)
        fd, left = self.stream.fileno(), memoryview(data)
        if (pre := self.prewritten) is not None:  # the quiet wait wrote it, or part of it (AuditWriter.lone_written)
            self.prewritten = None
            if pre[0] == msg:
                left = left[pre[1]:]
            else:  # never: sealed again, it is the same line
                log.error("audit log %s: a record the event loop's wait wrote was sealed again differently: both "
                          "lines are in the file", self.baseFilename)
        while left:  # a short write (a signal, the disk's last free block) leaves the rest to write
            left = left[os.write(fd, left):]
        if not self._actual_keep_log_stream_open:
            self._close()

    def _identity(self, stream: Any) -> tuple[int, int]:
        """(inode, device) of the open `stream`: an open file's never change, so one fstat per stream
        opened, not one per append (a lone record's write is a syscall or two: each counts)."""
        known = self._opened
        if known is None or known[0] is not stream:
            st = os.fstat(stream.fileno())
            known = self._opened = (stream, st.st_ino, st.st_dev)
        return known[1], known[2]

    def emit(self, record: logging.LogRecord) -> None:
        self.size = None
        super().emit(record)
        stream = self.stream
        if self.error is None and stream is not None and not stream.closed:
            with suppress(OSError):  # unknown: the next write goes through emit again
                self.size = os.fstat(stream.fileno()).st_size

    def handleError(self, record: logging.LogRecord) -> None:
        # logging's default prints a traceback and forgets the batch; the writer
        # must know, so it can resynchronise with the disk and retry.
        self.error = sys.exc_info()[1]

    def do_gzip(self, input_filename: str) -> None:
        return


def _lines_in(fd: int) -> int:
    """Lines in the open file `fd` (write-only), read through /proc/self/fd (a removed file has no other
    name to open); 0 if it cannot be read. Only when another program removed the live file: rare, and
    the file is at most audit.max_bytes."""
    lines, offset = 0, 0
    try:
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        while chunk := os.pread(reader, 1 << 20, offset):
            lines += chunk.count(b"\n")
            offset += len(chunk)
    except OSError:
        return 0
    finally:
        os.close(reader)
    return lines


def prune_rotated(live: Path, backup_count: int, max_age_days: float, now: float, errors: RateLimitedLog) -> int:
    """Remove rotated files past `backup_count` or older than `max_age_days` (0: no age limit) at `now`.

    Returns how many were removed. The caller holds the locks that keep renames out.
    """
    horizon = now - max_age_days * 86400 if max_age_days else None
    removed = 0
    for index, path in audit_files(live):
        if index == 0:
            continue
        try:
            if index > backup_count or (horizon is not None and path.stat().st_mtime < horizon):
                path.unlink()
                removed += 1
                log.info("audit log: removed %s (retention: %d files, %s days)", path, backup_count, max_age_days)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.log(logging.WARNING, "prune", "audit log: cannot remove %s: %s", path, exc)
    return removed


def finish_interrupted_rotation(live: Path) -> None:
    """Put a file left as audit.jsonl.rotate.N[.gz] by a crash mid-rotation in place as .1[.gz]
    (the compressor gzips a plain one), and drop half-compressed temporaries."""
    remove_temporaries(live)
    pattern = glob.escape(str(live)) + ".rotate.*"
    for name in sorted(glob.glob(pattern), key=os.path.getmtime):
        src = Path(name)
        if not src.exists():
            continue
        if src.name.endswith(".gz"):
            if Path(name[:-3]).exists():
                src.unlink()  # a half-written .gz next to its whole source
                continue
        _shift_rotated(live)
        suffix = ".gz" if src.name.endswith(".gz") else ""
        dest = live.with_name(f"{live.name}.1{suffix}")
        os.replace(src, dest)
        log.warning("audit log: finished a rotation interrupted by a crash: %s -> %s", name, dest.name)


def _shift_rotated(live: Path) -> None:
    # As the library does: move the contiguous run .1, .2, ... up by one, oldest first.
    existing = {index: path for index, path in audit_files(live) if index}
    run = 0
    while run + 1 in existing:
        run += 1
    for index in range(run, 0, -1):
        src = existing[index]
        suffix = ".gz" if src.name.endswith(".gz") else ""
        os.replace(src, live.with_name(f"{live.name}.{index + 1}{suffix}"))
