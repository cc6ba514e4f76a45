"""The audit writer's writes on the caller's thread: a lone record sealed and appended at once, and the record the
event loop's quiet wait wrote (packetin/quiet.py) finished here. AuditWriter's, in a module of its own."""

from __future__ import annotations

import collections
import logging
import threading
from pathlib import Path
from typing import Any, Callable

from auditlog.chain import CHAIN_KEY, RecordText
from auditlog.loss_note import CarriedLoss
from auditlog.rotation import JsonlHandler
from packetin.ratelimited_log import RateLimitedLog

# An inline write that took longer than this (s; the disk throttling dirty pages, say: longer
# than a preemption on a busy node, which is not the disk's doing) leaves
# the writing to the thread for INLINE_BACKOFF seconds: the submitting thread is the event loop.
INLINE_SLOW, INLINE_BACKOFF = 0.01, 1.0


class _WriteFailed(Exception):
    def __init__(self, unwritten: list[RecordText], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.unwritten = unwritten


class InlineWrites:
    """write_now, and the quiet wait's lone_arm / lone_written, over AuditWriter's state (set in its __init__)."""

    path: Path
    fsync: bool
    max_bytes: int
    queue_size: int
    _inline_gap: float | None
    _holding: int
    _pending: list[RecordText]
    _queue: collections.deque[RecordText | threading.Event]
    _monotonic: Callable[[], float]
    _last_submit: float
    _inline_from: float
    _handler: JsonlHandler | None
    _held: list[RecordText]
    _held_cause: BaseException | None
    _files_lock: threading.Lock
    _io_lock: threading.Lock
    _closing: bool
    _thread_running: bool
    _counts: dict[str, int]
    _errors: RateLimitedLog
    _wake: threading.Event
    _carried: CarriedLoss
    _written_seq: int
    _seq: int
    _chain: str
    _seal_run: Callable[..., tuple[int, int, str]] | None

    def _emit_records(self, records: list[RecordText]) -> None:
        raise NotImplementedError

    def write_now(self, records: list[RecordText]) -> bool:
        """Write `records` inline as release writes a held batch (release calls this): True once written (or handed
        to the thread by a failed write), else False, nothing done but the submit time noted. A lone packet-in's
        record comes here first (AuditPipeline.lone), its write before its read's bookkeeping."""
        if self._inline_gap is None or self._holding or self._pending or len(records) > self.queue_size:
            return False
        now = self._monotonic()
        self._last_submit = now
        return now >= self._inline_from and not self._queue and self._write_inline(records)

    def _appendable(self) -> JsonlHandler | None:
        """The handler, when an inline write now would be a plain append (no rotation due, no fsync, nothing held
        from a failed write, the file set not being renamed); else None."""
        handler = self._handler
        if (handler is None or self.fsync or self._held or handler.size is None
                or 0 < self.max_bytes <= handler.size or self._files_lock.locked()):
            return None
        return handler

    def _write_inline(self, records: list[RecordText]) -> bool:
        """Seal and append `records` now, on the caller's thread; False (nothing done) unless the
        writer is running and idle, nothing is queued or held, and the write is a plain append
        (no rotation due, no fsync). A failed write goes to the thread, which resynchronises
        with the disk and retries it as it does its own."""
        if self._appendable() is None:
            return False
        if not self._io_lock.acquire(blocking=False):
            return False  # the thread is writing: the record queues behind what it holds
        try:
            # Checked under the lock: the thread takes records and exits only while holding it.
            if self._queue or self._closing or not self._thread_running:
                return False
            return self._inline_locked(records)
        finally:
            self._io_lock.release()

    def _inline_locked(self, records: list[RecordText]) -> bool:
        start = self._monotonic()
        try:
            self._emit_records(records)
            if (took := self._monotonic() - start) > INLINE_SLOW:
                self._inline_from = start + took + INLINE_BACKOFF
                self._counts["inline_backoffs"] += 1
                self._errors.log(logging.INFO, "inline-slow", "audit log %s: a write took %.1f ms; records "
                                 "go through the writer thread for %.0f s", self.path, took * 1000, INLINE_BACKOFF)
        except _WriteFailed as failed:
            self._held = failed.unwritten
            self._held_cause = failed.__cause__
            self._wake.set()
            return True
        self._carried.settle(self._written_seq)
        return True

    def lone_arm(self) -> tuple[Any, ...] | None:
        """What the event loop's quiet wait needs to seal and append a lone record itself (packetin/_quiet_fast.c):
        (the writer's lock, the writer, seq and chain now, the live file's descriptor, the C sealer, the chain's key,
        the queue, the handler and its stream),
        when write_now would write a record inline now, the lock aside; else None. The wait takes the lock without
        waiting and checks the queue, the seq, the handler and its stream again under it."""
        handler = self._appendable()
        stream = handler.stream if handler is not None else None
        if handler is None or stream is None or self._seal_run is None or self._inline_gap is None \
                or self._holding or self._pending or self._queue or self._closing or not self._thread_running \
                or self._monotonic() < self._inline_from or not handler.appends():
            return None
        return (self._io_lock, self, self._seq, self._chain, stream.fileno(), self._seal_run, CHAIN_KEY, self._queue,
                handler, stream)

    def lone_written(self, records: list[RecordText], line: str, written: int, errno: int) -> bool:
        """The quiet wait sealed records[0] as `line` and appended `written` bytes of it and its newline (`errno`:
        why no more), holding the writer's lock: the write finished here as write_now finishes its own (sealed
        again, the same line; the bytes the wait wrote not written twice, the rest written now; the counts, the
        chain head, a failed write handed to the thread), and the lock let go. True, as write_now."""
        handler = self._handler
        try:
            self._last_submit = self._monotonic()
            if handler is None:  # never: lone_arm saw one, and only the lock's holder changes it
                return False
            handler.prewritten = (line, written, errno)
            return self._inline_locked(records)
        finally:
            if handler is not None:
                handler.prewritten = None
            self._io_lock.release()
