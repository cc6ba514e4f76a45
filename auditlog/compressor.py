"""Gzip of rotated audit files in a niced thread of its own, never on the write path."""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import threading
import time
import zlib
from contextlib import suppress
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

from auditlog.fileset import audit_files, set_lock
from packetin.ratelimited_log import RateLimitedLog
from packetin.tasks import AgentThread

log = logging.getLogger(__name__)

MiB = 1 << 20
FILE_MODE = 0o640
# Level 1: faster than gzip(1)'s default 6 for a somewhat larger file, so a flood costs
# less CPU; the thread runs at nice 10 so it never competes with packet-ins.
GZIP_LEVEL = 1
COMPRESSOR_NICE = 10
_GZIP_WBITS = 31  # deflate with a gzip header and trailer (RFC 1952): what gzip(1), zcat and Python's gzip read

# Every record is compressed once, when its file rotates: that is part of a record's cost. ISA-L's
# deflate (the isal package) writes the same gzip format, and a smaller file, at a sixth to a tenth of
# zlib's CPU at level 1 (bench/gzip_codec.py: 0.6 against 3.8-6.6 µs per audit record here).
ZLIB_FALLBACK_WARNING = ("audit log: the isal package is not installed, so rotated files are gzipped with zlib, "
                         "at six to ten times the CPU per record (pip install isal)")


def gzip_codec() -> tuple[str, ModuleType]:
    """("isal", isal.isal_zlib) where the isal package imports, else ("zlib", zlib): the same
    compressobj interface and the same gzip files (npaudit_build_info's audit_gzip label)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return "zlib", zlib
    return "isal", isal_zlib


class Abandoned(Exception):
    """Compression stopped because the writer is closing (the plain file stays)."""


def gzip_file(src: BinaryIO, dst: Path, *, fsync: bool, abandon: threading.Event | None = None,
              codec: ModuleType | None = None) -> None:
    """Compress the open file `src` into `dst` (mode 0640, the source's mtime) with `codec` (a module
    with zlib's compressobj: gzip_codec()'s); `dst` is removed on failure."""
    deflate = (codec or gzip_codec()[1]).compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have narrowed it
        with os.fdopen(fd, "wb") as raw:
            fd = -1
            while chunk := src.read(MiB):
                if abandon is not None and abandon.is_set():
                    raise Abandoned(str(dst))
                raw.write(deflate.compress(chunk))  # both codecs let go of the GIL while they compress
            raw.write(deflate.flush())
            if fsync:
                raw.flush()
                os.fsync(raw.fileno())
        # The file's age is its last record's, not the compression's (age-based retention).
        st = os.fstat(src.fileno())
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with suppress(OSError):
            os.unlink(dst)
        raise


def _file_id(path: Path) -> tuple[int, int]:
    """(device, inode) of the file now at `path`, (-1, -1) if none is."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return (-1, -1)
    return st.st_dev, st.st_ino


def _temp_path(live: Path, ino: int) -> Path:
    return live.with_name(f".{live.name}.gz-{ino}.tmp")  # outside the file set's names


def remove_temporaries(live: Path) -> None:
    """Drop the half-compressed temporaries a crash mid-compression left."""
    for stale in glob.glob(glob.escape(str(live.with_name(f".{live.name}.gz-"))) + "*.tmp"):
        with suppress(FileNotFoundError):
            os.unlink(stale)


class Compressor:
    """Turns each plain rotated file of the set of `live` into .gz, newest first.

    Renames happen under `files_lock` (shared with the writer's rotation and
    retention) and the set's file lock, so a rotation never races a replacement.
    `wake` after each rotation; `writer_done` once no rotation can come any more
    (the thread then ends when nothing is left); `stop` joins it, abandoning a
    compression still running past the timeout.
    """

    def __init__(self, live: Path, files_lock: threading.Lock, *, fsync: bool = False,
                 errors: RateLimitedLog | None = None) -> None:
        self._live = live
        self._files_lock = files_lock
        self._fsync = fsync
        self._errors = errors if errors is not None else RateLimitedLog(log, 10.0)
        self._wake = threading.Event()
        self._abandon = threading.Event()
        self._writer_done = threading.Event()
        self._thread: threading.Thread | None = None
        self.codec, self._codec = gzip_codec()
        self.compressed = 0
        self.errors = 0

    def start(self) -> None:
        if self.codec == "zlib":
            log.warning(ZLIB_FALLBACK_WARNING)
        self._thread = AgentThread(target=self._loop, name="npaudit-audit-gzip", daemon=True)
        self._thread.start()
        self._wake.set()  # plain rotated files a previous run left

    def wake(self) -> None:
        self._wake.set()

    def abandon(self) -> None:
        """Stop at the next chunk; the file being compressed stays plain."""
        self._abandon.set()
        self._wake.set()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def writer_done(self) -> None:
        self._writer_done.set()
        self._wake.set()

    def stop(self, timeout: float) -> bool:
        """Let the thread finish within `timeout`, then abandon it; True if it ended by itself."""
        self.writer_done()
        thread = self._thread
        if thread is None:
            return True
        thread.join(max(0.0, timeout))
        if not thread.is_alive():
            return True
        self.abandon()
        thread.join(5.0)
        return False

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no rotated file waits for compression; False on timeout or if the thread ended."""
        deadline = time.monotonic() + timeout
        thread = self._thread
        while thread is not None:
            with self._files_lock:
                idle = self.next_plain_rotated() is None
            if idle:
                return True
            if time.monotonic() >= deadline or not thread.is_alive():
                return False
            self._wake.set()
            time.sleep(0.01)  # a thread-to-thread wait, not logic: real time
        return False

    def _loop(self) -> None:
        with suppress(OSError):  # Linux: a thread is a task with a nice value of its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPRESSOR_NICE)
        while not self._abandon.is_set():
            self._wake.wait()
            self._wake.clear()
            failed = False
            while not self._abandon.is_set() and (path := self.next_plain_rotated()) is not None:
                try:
                    self._compress_one(path)
                except Abandoned:
                    return
                except Exception as exc:  # a disk error (or a bug) must not end compression for good
                    self.errors += 1
                    self._errors.log(logging.WARNING, "gzip", "audit log: cannot gzip %s, keeping it plain: %s",
                                     path, exc)
                    failed = True
                    break  # try again at the next rotation, not in a loop
            if self._writer_done.is_set() and (failed or self.next_plain_rotated() is None):
                return  # no rotation can come any more: the next start tries what is left

    def next_plain_rotated(self) -> Path | None:
        plain = [path for index, path in audit_files(self._live) if index and not path.name.endswith(".gz")]
        return plain[-1] if plain else None  # the newest first: the oldest may be pruned anyway

    def _compress_one(self, path: Path) -> None:
        try:
            src = open(path, "rb")
        except FileNotFoundError:
            return
        with src:
            # The file id of what is read, not of the name: a rotation may move the name
            # on. The file stays open until it is replaced, so its inode number cannot be
            # freed and reused by a newer file meanwhile (which would then be the one
            # "found" and overwritten).
            st = os.fstat(src.fileno())
            read_id = (st.st_dev, st.st_ino)
            tmp = _temp_path(self._live, st.st_ino)
            gzip_file(src, tmp, fsync=self._fsync, abandon=self._abandon, codec=self._codec)
            with self._files_lock, set_lock(self._live, fcntl.LOCK_EX):
                now_at = next((p for index, p in audit_files(self._live)
                               if index and not p.name.endswith(".gz") and _file_id(p) == read_id), None)
                if now_at is None:  # pruned meanwhile
                    tmp.unlink()
                    return
                os.replace(tmp, now_at.with_name(now_at.name + ".gz"))
                now_at.unlink()
                self.compressed += 1  # under the lock: wait_idle never sees the file gone but uncounted
