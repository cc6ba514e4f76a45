"""What the audit writer cannot write is counted, noted beside the file at close, and put into the chain at the next start."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from auditlog import rotation as rotation_mod
from auditlog.chain import records_lost_record
from auditlog.verify import verify
from policy_agent.cli.main import main as npaudit
from auditlog.writer import AuditWriter, AuditWriterError
from tests.support.audit_writer import lines_of, live, make_writer, record  # noqa: F401 (fixtures)


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(self: Any, msg: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(rotation_mod.JsonlHandler, "do_write", no_space)


def _write_then_lose(live: Path, monkeypatch: pytest.MonkeyPatch, kept: int, lost: int) -> AuditWriter:
    """A writer that writes `kept` records, then meets a full disk for `lost` more and is closed."""
    w = AuditWriter(live)
    w.start()
    for i in range(kept):
        w.submit(record(i))
    assert w.flush_wait(5)
    with monkeypatch.context() as patch:
        _disk_full(patch)
        for i in range(kept, kept + lost):
            w.submit(record(i))
        assert not w.close(timeout=0.5)
    return w


def _note(live: Path) -> Path:
    return live.with_name(f".{live.name}.lost")


def test_records_a_full_disk_never_took_are_counted_by_reason(live: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _write_then_lose(live, monkeypatch, kept=3, lost=5)
    lost = w.snapshot().lost()
    assert sum(lost.values()) == 5 and set(lost) <= {"lost_write_error", "dropped_closed"}, lost
    assert w.stats["written"] == 3


def test_the_loss_is_noted_at_close_and_becomes_a_chain_record_at_the_next_start(
        live: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _write_then_lose(live, monkeypatch, kept=3, lost=5)
    note = json.loads(_note(live).read_bytes().rstrip(b"\0"))
    assert note["records_lost"] == 5 and note["after_seq"] == 3 and note["by_reason"] == first.snapshot().lost()
    assert stat.S_IMODE(_note(live).stat().st_mode) == 0o640

    second = AuditWriter(live)
    second.start()
    second.submit(record(100))
    assert second.flush_wait(5)
    second.close()
    got = lines_of(live)
    assert [r["npaudit"]["seq"] for r in got] == [1, 2, 3, 4, 5]
    restart = got[3]
    assert restart["event"]["action"] == "chain-restart" and restart["event"]["reason"] == "records-lost"
    assert restart["npaudit"]["chain_restart"]["records_lost"] == 5
    assert restart["npaudit"]["chain_restart"]["after_seq"] == 3
    assert "5 audit records" in restart["message"]
    assert got[4]["event"]["id"] == "e100"
    assert _note(live).read_bytes().strip(b"\0") == b""  # consumed: the next start adds nothing
    result = verify([live])
    assert result.ok and result.last_seq == 5, result
    # verify names the loss (not "damaged bytes" that are not there).
    assert [w for w in result.warnings if "could not write" in w and "5 audit records" in w], result.warnings
    assert not [w for w in result.warnings if "damaged bytes" in w]
    assert npaudit(["verify", str(live.parent)]) == 0

    third = AuditWriter(live)
    third.start()
    third.close()
    assert len(lines_of(live)) == 5


def test_a_clean_close_leaves_no_note(live: Path) -> None:
    w = AuditWriter(live)
    w.start()
    w.submit(record(0))
    assert w.close()
    assert w.snapshot().lost() == {}
    assert not _note(live).exists() or _note(live).read_bytes().strip(b"\0") == b""
    again = AuditWriter(live)
    again.start()
    again.close()
    assert len(lines_of(live)) == 1


def test_an_existing_world_writable_directory_is_tightened_once(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "audit"
    directory.mkdir()
    directory.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="auditlog.writer"):
        for _ in range(2):
            w = AuditWriter(directory / "audit.jsonl")
            w.start()
            w.close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o750
    tightened = [r.getMessage() for r in caplog.records if "0777" in r.getMessage()]
    assert len(tightened) == 1 and str(directory) in tightened[0], caplog.text


def test_a_shared_sticky_directory_is_refused_not_tightened(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o1777)
    with pytest.raises(AuditWriterError, match=f"{directory}: mode 1777 lets others"):
        AuditWriter(directory / "audit.jsonl").start()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o1777
    assert not os.listdir(directory)


def test_the_notes_space_is_taken_at_start_so_a_disk_that_fills_later_can_still_hold_it(live: Path) -> None:
    from auditlog.loss_note import NOTE_BYTES

    w = AuditWriter(live)
    w.start()
    try:
        info = _note(live).stat()
        assert info.st_size == NOTE_BYTES and info.st_blocks * 512 >= NOTE_BYTES
    finally:
        w.close()


def test_the_next_start_writes_the_loss_record_at_once_without_waiting_for_a_record(
        live: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_then_lose(live, monkeypatch, kept=2, lost=4)
    second = AuditWriter(live)
    second.start()
    try:
        deadline = time.monotonic() + 5
        while len(lines_of(live)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        got = lines_of(live)
        assert len(got) == 3 and got[2]["npaudit"]["chain_restart"]["records_lost"] == 4, got
    finally:
        second.close()


def test_verify_names_a_loss_the_note_holds_before_the_next_start(live: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_then_lose(live, monkeypatch, kept=3, lost=5)
    result = verify([live.parent])
    assert result.ok and result.last_seq == 3, result
    assert [w for w in result.warnings if "could not write 5 audit records after seq 3" in w], result.warnings


@pytest.mark.parametrize("remove", [False, True])
def test_records_that_went_to_a_live_file_another_program_moved_or_removed_are_counted(
        live: Path, remove: bool) -> None:
    """The write after another program moved the live file away (or removed it) goes with that file: its
    records are counted as strayed_moved (kept there, not a loss), or, the file removed, every record it
    held as strayed_removed: a loss, said at once by a records-lost record first in the new live file (so
    not noted again at close); the records after it go to that new live file."""
    w = AuditWriter(live)
    w.start()
    w.submit(record(0))
    assert w.flush_wait(5)
    if remove:
        live.unlink()
    else:
        live.rename(live.with_name("moved.jsonl"))
    w.submit(record(1))  # written to the moved (or removed) file, found out after the write
    assert w.flush_wait(5)
    w.submit(record(2))  # a new live file
    assert w.flush_wait(5)
    events = w.snapshot().events
    assert (events.strayed_moved, events.strayed_removed) == ((0, 2) if remove else (1, 0))  # removed: e0 too
    assert w.snapshot().lost() == ({"strayed_removed": 2} if remove else {})
    if remove:
        said, after = lines_of(live)
        assert said["event"]["reason"] == "records-lost" and said["npaudit"]["seq"] == 3
        assert said["npaudit"]["chain_restart"] == {"after_seq": 2, "records_lost": 2,
                                                    "lost_by_reason": {"strayed_removed": 2}}
        assert "after 2 written audit records another program removed with the live file" in said["message"]
        assert after["event"]["id"] == "e2"
        result = verify([live.parent])
        assert result.ok and [x for x in result.warnings if "could not write, or lost, before seq 3" in x]
    else:
        assert [r["event"]["id"] for r in lines_of(live)] == ["e2"]
        assert [r["event"]["id"] for r in lines_of(live.with_name("moved.jsonl"))] == ["e0", "e1"]
    w.close()
    assert _note(live).read_bytes().strip(b"\0") == b""  # nothing left to say at the next start
    again = AuditWriter(live)
    again.start()
    again.close()
    assert [r["event"]["id"] for r in lines_of(live)][-1] == "e2"


def test_a_loss_note_tells_records_never_written_from_written_ones_another_program_removed() -> None:
    said = records_lost_record(lost={"dropped_closed": 3, "strayed_removed": 2}, after_seq=9, now=0.0)
    assert said["message"] == ("audit chain continues after 3 audit records that were never written "
                               "(dropped_closed 3) and 2 written audit records another program removed with "
                               "the live file (strayed_removed 2) when the writer stopped after seq 9")
    assert said["npaudit"]["chain_restart"]["records_lost"] == 5
