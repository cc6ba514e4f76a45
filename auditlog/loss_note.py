"""The loss note: how many records a closing audit writer could not write, kept beside the files for the next start."""

from __future__ import annotations

import json
import logging
import os
from contextlib import suppress
from pathlib import Path
from typing import Any, Mapping

from auditlog.chain import RecordText, records_lost_record
from auditlog.compressor import FILE_MODE
from packetin.ratelimited_log import RateLimitedLog

log = logging.getLogger(__name__)

# Space taken at start, so the note can still be written at close on a disk that filled up
# meanwhile (the case it exists for). A note is a few hundred bytes; NULs fill the rest.
NOTE_BYTES = 4096


class LossNote:
    """`.<audit file name>.lost`: blank (NULs) normally; JSON {records_lost, by_reason, after_seq} after a loss."""

    def __init__(self, audit_path: Path) -> None:
        self.path = audit_path.with_name(f".{audit_path.name}.lost")
        self._fd = -1

    def open(self) -> dict[str, Any] | None:
        """Open the note, reserve its space; what a previous writer noted there, or None."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        self._fd = fd
        os.fchmod(fd, FILE_MODE)
        note = _parse(os.pread(fd, NOTE_BYTES, 0), self.path)
        if note is None:
            self.clear()
        return note

    def write(self, lost: Mapping[str, int], after_seq: int) -> None:
        """Note `lost` (records by reason) in the space reserved at open; OSError if even that fails."""
        if self._fd < 0:
            raise OSError(f"{self.path} is not open (the writer never started)")
        text = json.dumps({"records_lost": sum(lost.values()), "by_reason": dict(lost), "after_seq": after_seq},
                          sort_keys=True).encode("ascii")
        os.pwrite(self._fd, text[:NOTE_BYTES].ljust(NOTE_BYTES, b"\0"), 0)
        os.fsync(self._fd)

    def clear(self) -> None:
        """Blank the note (its loss is in the chain now) and keep its space reserved."""
        os.pwrite(self._fd, bytes(NOTE_BYTES), 0)
        with suppress(OSError):  # a file system without fallocate: the blank page written above holds
            os.posix_fallocate(self._fd, 0, NOTE_BYTES)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class CarriedLoss:
    """A writer's loss note through its life: the previous writer's loss until its record is in the file,
    and this writer's own loss noted at close."""

    def __init__(self, audit_path: Path, errors: RateLimitedLog) -> None:
        self.audit_path = audit_path
        self.note = LossNote(audit_path)
        self._errors = errors
        self._noted: dict[str, Any] | None = None  # a previous writer's loss, until its record is written
        self._record: RecordText | None = None

    def take(self, now: float, context: Mapping[str, Any] | None) -> RecordText | None:
        """Open the note; the chain-restart record of what the previous writer noted, or None (kept until written)."""
        noted = self.note.open()
        if noted is None:
            return None
        self._noted = noted
        self._record = RecordText.of(records_lost_record(
            lost=noted["by_reason"], after_seq=noted["after_seq"], now=now, context=context))
        log.warning("audit log %s: the previous writer could not write %d records (%s); a chain-restart "
                    "record says so", self.audit_path, noted["records_lost"], noted["by_reason"])
        return self._record

    def settle(self, written_seq: int) -> None:
        """After a successful write: once the loss record is in the file, blank the note."""
        record = self._record
        if record is None or not 0 < record.seq <= written_seq:
            return
        self._noted = self._record = None
        try:
            self.note.clear()
        except OSError as exc:  # the next start writes the record again: a duplicate, never a loss
            self._errors.log(logging.WARNING, "note", "audit loss note %s not cleared: %s", self.note.path, exc)

    def close(self, lost: dict[str, int], written_seq: int) -> None:
        """At close: note `lost` (and a previous loss still unrecorded) for the next start, then close the note."""
        for reason, n in (self._noted or {}).get("by_reason", {}).items():
            lost[reason] = lost.get(reason, 0) + n
        if lost:
            log.error("audit log %s: %d records were not written (%s)", self.audit_path, sum(lost.values()), lost)
            try:
                self.note.write(lost, written_seq)
            except OSError as exc:
                log.error("audit log %s: the loss note %s failed: %s", self.audit_path, self.note.path, exc)
        self.note.close()


def pending_loss(audit_path: Path) -> dict[str, Any] | None:
    """Read-only: what the note beside `audit_path` says was lost and is not in the chain yet, or None."""
    path = LossNote(audit_path).path
    try:
        with open(path, "rb") as f:
            return _parse(f.read(NOTE_BYTES), path)
    except OSError:  # no note (never a loss), or not ours to read
        return None


def _parse(data: bytes, path: Path) -> dict[str, Any] | None:
    text = data.rstrip(b"\0")
    if not text:
        return None
    try:
        note = json.loads(text)
        lost = {str(k): int(v) for k, v in note["by_reason"].items() if int(v) > 0}
        after_seq = int(note["after_seq"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("audit loss note %s is unreadable, ignored: %s", path, exc)
        return None
    return {"records_lost": sum(lost.values()), "by_reason": lost, "after_seq": after_seq} if lost else None
