"""Hash-chained JSONL audit file writer: bounded queue, one writer thread, size rotation, gzip, retention."""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
import time
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

from auditlog.chain import GENESIS, RecordText, records_removed_record
from auditlog.compressor import FILE_MODE, Compressor
from auditlog.fileset import set_lock
from auditlog.loss_note import CarriedLoss
from auditlog.rotation import JsonlHandler, finish_interrupted_rotation, prune_rotated
from auditlog.record_fast import seal_run
from auditlog.sealing import chunk_bounds, seal_records
from auditlog.writer_inline import InlineWrites, _WriteFailed
from auditlog.writer_resume import resume_point
from auditlog.writer_dir import DIR_MODE, AuditWriterError, prepare_directory, take_ownership  # noqa: F401
from auditlog.writer_stats import LOSS_KEYS, STAT_KEYS, WriterEvents, WriterStats  # noqa: F401 (re-exported)
from packetin.ratelimited_log import RateLimitedLog
from packetin.tasks import AgentThread

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_PATH = Path("/var/log/npaudit/audit.jsonl")
_DRAIN_MAX = 8192            # records per batch: bounds memory and time between queue checks
_MAX_CHUNK = MiB             # bytes per write; rotation is checked between writes
# A record submitted at least this long (s) after the previous one, with nothing queued and
# the thread idle, is written by the submitting thread itself: a lone record then waits for
# no thread wake-up. Closer records go through the queue and the thread, which batches them.
INLINE_GAP = 0.001


class AuditWriter(InlineWrites):
    """Seals records into the hash chain and appends them to a rotating JSONL file from one thread.

    `submit` never blocks: a full queue returns False and counts. The thread takes
    everything queued (up to 8192 records), seals it and writes it in as few
    writes as the rotation size allows, so a lone record reaches the file at once
    and a flood is written in large batches. Call `start` before records can be
    written; `close` drains the queue. Only one writer may own a file set.

    At a low rate (`inline_gap`: the previous record came at least that long ago), an idle
    writer with an empty queue seals and appends the record in `submit` itself, on the
    caller's thread, and never wakes the thread for it; anything that can take
    long (a rotation due, fsync, a failed write's retries, a busy writer) stays with the
    thread. Either way records are sealed and written in submission order under one lock.
    `inline_gap=None`: every record goes through the thread.

    Between `hold()` and `release()` (the caller's thread: the event loop, around one read's
    packet-ins) submitted records are collected and `release` hands them over as one batch:
    sealed and appended in one write by the caller itself when the writer is idle (as above),
    else queued with one wake-up of the thread.

    Defaults: rotate at 100 MiB, keep 10 gzip files and nothing older than 28
    days (Antrea keeps 500 MB x 3 for 28 days); a 100k-record queue.
    """

    def __init__(self, path: Path = DEFAULT_PATH, *, max_bytes: int = 100 * MiB, backup_count: int = 10,
                 max_age_days: float = 28, queue_size: int = 100_000, compress: bool = True,
                 fsync: bool = False, clock: Callable[[], float] = time.time,
                 state_fields: Mapping[str, Any] | None = None, inline_gap: float | None = INLINE_GAP,
                 monotonic: Callable[[], float] = time.monotonic,
                 on_written: Callable[[list[RecordText], float], None] | None = None) -> None:
        for name, value, low in (("max_bytes", max_bytes, 0), ("backup_count", backup_count, 1),
                                 ("max_age_days", max_age_days, 0), ("queue_size", queue_size, 1)):
            if value < low:
                raise ValueError(f"audit writer: {name} must be >= {low}, got {value!r}")
        self.path = Path(path)
        self.max_bytes = max_bytes          # 0: never rotate
        self.backup_count = backup_count    # rotated files kept (at least 1)
        self.max_age_days = max_age_days    # 0: no age limit
        self.queue_size = queue_size
        self.compress = compress
        self.fsync = fsync
        self.state_fields = state_fields  # e.g. observer, orchestrator: put into the writer's own records
        self._clock = clock
        self._inline_gap = inline_gap
        self._monotonic = monotonic
        # Told of each chunk once it is in the file (auditlog.verdicts.VerdictTally.written), under _io_lock.
        self._on_written = on_written
        self._last_submit = float("-inf")  # monotonic() of the previous submit
        self._holding = 0  # hold() depth: while > 0, submit collects into _pending
        self._pending: list[RecordText] = []  # submitted while held, not yet queued or written
        self._inline_from = float("-inf")  # no inline write before (monotonic): after a slow one
        # Held while records are taken off the queue, sealed and written: by the thread, or by
        # a submit writing inline (which never waits for it: a busy writer means the queue).
        self._io_lock = threading.Lock()
        self._seal_run = seal_run()  # sealing in C (None: in Python), as the records are built
        self._held: list[RecordText] = []  # sealed by an inline write that failed: the thread retries them
        self._held_cause: BaseException | None = None
        self._chunk_bytes = min(_MAX_CHUNK, max(1, max_bytes // 16)) if max_bytes else _MAX_CHUNK
        self._counts: dict[str, int] = dict.fromkeys(STAT_KEYS[:-2], 0)  # the compressor counts the last two
        self._queue: collections.deque[RecordText | threading.Event] = collections.deque()
        self._wake = threading.Event()
        self._abandon = threading.Event()
        self._count_lock = threading.Lock()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._thread_running = False  # from start until _run ends: Thread.is_alive without its call per write
        self._handler: JsonlHandler | None = None
        self._owner_fd = -1
        self._seq, self._chain = 0, GENESIS
        self._restart: RecordText | None = None  # the latest chain-restart record made
        self._written_seq = 0  # the newest seq known to be in the file (self._seq may be sealed only)
        self._stated_removed = 0  # strayed_removed records a records-lost record in the trail already says
        self._errors = RateLimitedLog(log, 10.0)
        self._carried = CarriedLoss(self.path, self._errors)
        # Renames in the file set (rotation, retention, a compressed file put in place)
        # happen under this lock, so the compressor never races a rotation.
        self._files_lock = threading.Lock()
        self._compressor = Compressor(self.path, self._files_lock, fsync=fsync, errors=self._errors)

    # --- producer side (any thread) ---

    def queue_fill(self) -> float:
        """How full the queue is, 0.0 .. 1.0 (the audit overload mode watches it)."""
        return (len(self._queue) + len(self._pending)) / self.queue_size

    def submit(self, record: RecordText) -> bool:
        """Queue `record` (the writer now owns it and sets npaudit.seq/chain); False if full or closed."""
        if self._closing:
            self._count("dropped_closed")
            return False
        if len(self._queue) + len(self._pending) >= self.queue_size:
            self._count("dropped_queue_full")
            return False
        if self._holding:
            self._pending.append(record)
            return True
        gap = self._inline_gap
        if gap is not None:
            now = self._monotonic()
            last, self._last_submit = self._last_submit, now
            idle = now - last >= gap and now >= self._inline_from and not self._queue
            if idle and self._write_inline([record]):
                return True
        self._queue.append(record)
        # Append before looking at the flag: the thread clears it before it drains.
        if not self._wake.is_set():
            self._wake.set()
        return True

    def submit_many(self, records: list[RecordText]) -> int:
        """While a batch is held (`hold`), submit the first of `records` as `submit` would, as many as the queue has
        room for now: how many (the rest, not tried, the caller submits one by one; the room only grows, as the
        writer's thread drains, so one by one would have taken these too). Outside a batch: 0."""
        if self._closing or not self._holding:
            return 0
        k = min(len(records), self.queue_size - len(self._queue) - len(self._pending))
        if k <= 0:
            return 0
        self._pending.extend(records if k == len(records) else records[:k])
        return k

    def hold(self) -> None:
        """Collect what `submit` is given until the matching `release` (calls nest; one thread only)."""
        self._holding += 1

    def release(self) -> int:
        """End a `hold`: the records submitted since go out as one batch (written inline when the
        writer is idle and inline writes are on, else queued with one wake-up). How many."""
        self._holding = max(0, self._holding - 1)
        pending = self._pending
        if self._holding or not pending:
            return 0
        self._pending = []
        if self.write_now(pending):
            return len(pending)
        self._queue.extend(pending)
        if not self._wake.is_set():
            self._wake.set()
        return len(pending)

    def flush_wait(self, timeout: float = 5.0) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        done = threading.Event()
        self._queue.append(done)
        self._wake.set()
        return done.wait(timeout)

    def wait_compressed(self, timeout: float = 30.0) -> bool:
        """Wait until no rotated file waits for compression; False on timeout (or compress off)."""
        return self.compress and self._compressor.wait_idle(timeout)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def head(self) -> tuple[int, str]:
        """(seq, chain) of the last record sealed."""
        return self._seq, self._chain

    def snapshot(self) -> WriterStats:
        c = self._compressor
        events = WriterEvents(**self._counts, compressed=c.compressed, compress_errors=c.errors)
        return WriterStats(events=events, queued=len(self._queue), seq=self._seq)

    @property
    def stats(self) -> dict[str, int]:
        """Every counter by name, STAT_KEYS in order."""
        return asdict(self.snapshot().events)

    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:  # producers on several threads
            self._counts[key] += n

    # --- lifecycle ---

    def start(self) -> None:
        """Create the directory, finish an interrupted rotation, prune, resume the chain, start the thread."""
        if self._thread is not None:
            return
        try:
            prepare_directory(self.path)
            self._owner_fd = take_ownership(self.path)
            finish_interrupted_rotation(self.path)
            self._prune()
            restart = self._resync()
            loss_record = self._carried.take(self._clock(), self.state_fields)
            if loss_record is not None:
                self._queue.appendleft(loss_record)
            if restart is not None:
                self._queue.appendleft(restart)  # before anything submitted already
            self._handler = self._new_handler()
            if self._queue:  # the writer's own records go in now, not when the next record comes
                self._wake.set()
        except OSError as exc:
            self._carried.note.close()
            self._release_ownership()
            raise AuditWriterError(f"audit log {self.path}: {exc}") from exc
        self._thread = AgentThread(target=self._run, name="npaudit-audit-writer", daemon=True)
        self._thread.start()
        self._thread_running = True
        if self.compress:
            self._compressor.start()

    def close(self, timeout: float = 10.0) -> bool:
        """Write what is queued, then stop; True if everything submitted was written.

        Rotated files still being compressed are finished within the same timeout;
        past it they stay plain (verify reads them; the next start compresses them).
        """
        deadline = time.monotonic() + timeout
        self._queue.extend(self._pending)  # a hold never released: written like the rest
        self._pending, self._holding = [], 0
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._abandon.set()  # stop retrying a failing disk
                self._compressor.abandon()
                self._thread.join(5.0)
        if not self._compressor.stop(deadline - time.monotonic()):
            log.info("audit log %s: compression stopped at close; rotated files left plain are "
                     "compressed at the next start", self.path)
        left = sum(1 for item in self._queue if not isinstance(item, threading.Event)) + len(self._held)
        if left:
            self._count("dropped_closed", left)
        stuck = [t.name for t in (self._thread, self._compressor.thread) if t is not None and t.is_alive()]
        if stuck:
            # Closing the file under a thread still in a write (a hung disk) could tear a
            # record; the file and the ownership lock go with the process instead.
            log.error("audit log %s: %s still busy after close; %d queued records not written",
                      self.path, " and ".join(stuck), left)
            return False
        self._close_handler()
        lost = self.snapshot().lost()
        if lost.get("strayed_removed", 0) <= self._stated_removed:  # in the trail already (_emit_records)
            lost.pop("strayed_removed", None)
        else:
            lost["strayed_removed"] -= self._stated_removed
        self._carried.close(lost, self._written_seq)
        self._release_ownership()
        return not left and not self._counts["lost_write_error"]

    def __enter__(self) -> AuditWriter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _release_ownership(self) -> None:
        if self._owner_fd >= 0:
            os.close(self._owner_fd)  # closing releases the lock
            self._owner_fd = -1

    def _new_handler(self) -> JsonlHandler:
        handler = JsonlHandler(str(self.path), maxBytes=self.max_bytes, backupCount=self.backup_count,
                                encoding="ascii", use_gzip=self.compress, chmod=FILE_MODE, newline="")
        return handler

    def _close_handler(self) -> None:
        if self._handler is not None:
            with suppress(Exception):  # after a failed write the flush in close fails too
                self._handler.close()
            self._handler = None

    # --- the writer thread ---

    def _run(self) -> None:
        try:
            while not self._abandon.is_set():
                self._wake.wait()
                self._wake.clear()  # before draining: a record queued from now on sets it again
                with self._io_lock:
                    if self._held:  # an inline write failed: those come first
                        held, self._held = self._held, []
                        self._write(held, failed=self._held_cause)
                    while self._queue and not self._abandon.is_set():
                        records, done = self._take()
                        if records:
                            self._write(records)
                        for event in done:
                            event.set()
                    if self._closing and not self._queue:
                        return  # under the lock: no inline write starts after this (it sees _closing)
        except Exception:
            log.critical("audit writer thread failed; records now queue up and are dropped", exc_info=True)
        finally:
            self._thread_running = False

    def _take(self) -> tuple[list[RecordText], list[threading.Event]]:
        records: list[RecordText] = []
        done: list[threading.Event] = []
        queue = self._queue
        while queue and len(records) < _DRAIN_MAX:
            item = queue.popleft()
            if isinstance(item, threading.Event):
                done.append(item)
            else:
                records.append(item)
        return records, done

    def _write(self, records: list[RecordText], failed: BaseException | None = None) -> None:
        """Write `records`; on a failed write resynchronise with the disk and retry until closed.
        `failed`: why their first write (an inline one) failed, so retry at once."""
        delay, cause = 0.05, failed
        if cause is None:
            records, cause = self._attempt(records, resync=False)
        while records:  # the last attempt failed with `cause`
            self._counts["write_errors"] += 1
            self._errors.log(logging.ERROR, "write", "audit log %s: write failed, %d records held, retrying: %s",
                             self.path, len(records), cause)
            if self._abandon.wait(delay):
                self._counts["lost_write_error"] += len(records)
                return
            delay = min(delay * 2, 5.0)
            records, cause = self._attempt(records, resync=True)

    def _attempt(self, records: list[RecordText], resync: bool) -> tuple[list[RecordText], BaseException | None]:
        """One try at writing `records`, first resynchronising with the disk if `resync`:
        ([], None) once written, else the records still to write and why."""
        try:
            if resync:
                self._close_handler()
                stale = self._restart  # superseded: a new one names the damage as it is now
                restart = self._resync()
                # Records up to the seq on disk made it in full; the rest are sealed again.
                records = [r for r in records if r is not stale and r.seq > self._seq]
                if restart is not None:
                    records.insert(0, restart)
                self._handler = self._new_handler()
            self._emit_records(records)
        except _WriteFailed as failed:
            return failed.unwritten, failed.__cause__
        except OSError as exc:  # the resynchronisation itself failed
            return records, exc
        self._carried.settle(self._written_seq)
        return [], None

    def _emit_records(self, records: list[RecordText]) -> None:
        sealed, lines, self._seq, self._chain = seal_records(records, self._seq, self._chain, self._unencodable,
                                                             self._seal_run)
        removed_through = 0  # the last seq of a chunk that went to a live file another program removed
        for start, end, size in chunk_bounds(lines, self._chunk_bytes):
            removed = self._counts["strayed_removed"]
            try:
                self._emit(lines[0] if end == 1 else "\n".join(lines[start:end]))
            except Exception as exc:
                raise _WriteFailed(sealed[start:], exc) from exc
            if self._counts["strayed_removed"] != removed:
                removed_through = sealed[end - 1].seq
            self._counts["written"] += end - start
            self._written_seq = sealed[end - 1].seq
            self._counts["batches"] += 1
            self._counts["bytes"] += size
            if self._on_written is not None:
                try:
                    self._on_written(sealed[start:end], self._clock())
                except Exception:  # metrics only: never a reason to hold or lose a record
                    self._errors.log(logging.ERROR, "on-written", "audit log %s: counting written records failed",
                                     self.path, exc_info=True)
        if removed_through:  # said in the trail now, first in the new live file, not only at the next start
            gone = self._counts["strayed_removed"] - self._stated_removed
            self._stated_removed += gone
            self._emit_records([RecordText.of(records_removed_record(
                removed=gone, through_seq=removed_through, now=self._clock(), context=self.state_fields))])

    def _unencodable(self, exc: Exception) -> None:
        self._counts["unencodable"] += 1
        self._errors.log(logging.WARNING, "encode", "audit record skipped, not encodable: %s", exc)

    def _emit(self, text: str) -> None:
        handler = self._handler
        if handler is None:
            raise OSError("audit writer is not started")
        rotations, moved, removed = handler.num_rollovers, handler.strayed_moved, handler.strayed_removed
        with self._files_lock:
            handler.write_lines(text)  # one chunk a write: the handler rotates before a write, never inside one
        if handler.strayed_moved != moved or handler.strayed_removed != removed:  # another program's doing
            self._counts["strayed_moved"] += handler.strayed_moved - moved
            self._counts["strayed_removed"] += handler.strayed_removed - removed
        if self.fsync and handler.stream is not None:
            os.fsync(handler.stream.fileno())
        if handler.num_rollovers != rotations:
            self._counts["rotations"] += handler.num_rollovers - rotations
            self._prune()
            self._compressor.wake()

    # --- disk state: resume, repair, retention ---

    def _resync(self) -> RecordText | None:
        """Take seq/chain from the newest record on disk; a chain-restart record if damage follows it."""
        self._seq, self._chain, restart = resume_point(self.path, self.state_fields, self._clock)
        self._written_seq = self._seq
        self._restart = RecordText.of(restart) if restart is not None else None
        if restart is not None:
            log.warning("audit log %s: %s", self.path, restart["message"])
            self._counts["chain_restarts"] += 1
        return self._restart

    def _prune(self) -> None:
        # The set's file lock too: `npaudit verify` lists the set under it.
        with self._files_lock, set_lock(self.path, fcntl.LOCK_EX):
            pruned = prune_rotated(self.path, self.backup_count, self.max_age_days, self._clock(), self._errors)
        self._counts["pruned"] += pruned
