"""auditlog.rotation.JsonlHandler.append: a plain append to the open file; once the live file is no longer
it (another program moved or removed it), the write that found out is counted as strayed (a removed file:
every record it held, all lost with it) and the next go through emit, which opens a new live file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from auditlog.rotation import JsonlHandler


def handler_for(live: Path) -> JsonlHandler:
    handler = JsonlHandler(str(live), maxBytes=1 << 20, backupCount=2, encoding="ascii", use_gzip=False,
                           newline="")
    handler.emit(logging.LogRecord("t", logging.INFO, "", 0, "first", None, None))  # opens it, learns its size
    return handler


def test_appends_go_to_the_live_file_and_a_moved_one_takes_one_write(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    handler = handler_for(live)
    try:
        assert handler.append("second") and handler.append("third\nthird-b")
        assert live.read_text() == "first\nsecond\nthird\nthird-b\n"
        assert handler.strayed == 0
        live.rename(tmp_path / "audit.jsonl.1")  # moved away under the handler, a new live file made
        live.write_text("")
        assert handler.append("fourth\nfourth-b")  # written, to the moved file: found out after the write
        assert (handler.strayed, handler.strayed_kept) == (2, True)
        assert not handler.append("fifth")  # nothing written: emit's to do
        handler.emit(logging.LogRecord("t", logging.INFO, "", 0, "fifth", None, None))  # opens the live file
        assert handler.append("sixth")
        assert live.read_text() == "fifth\nsixth\n"
        assert (tmp_path / "audit.jsonl.1").read_text() == "first\nsecond\nthird\nthird-b\nfourth\nfourth-b\n"
    finally:
        handler.close()


def test_a_removed_live_file_takes_one_write_and_every_record_it_held_is_said_lost(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    handler = handler_for(live)
    try:
        assert handler.append("second")
        handler.strayed = 0
        live.unlink()
        assert handler.append("third\nthird-b")
        assert (handler.strayed, handler.strayed_kept) == (4, False)  # first, second, and the write's two
        assert not handler.append("fourth")
    finally:
        handler.close()


@pytest.mark.parametrize("remove", [False, True])
def test_write_lines_says_where_strayed_records_went_and_goes_on_in_a_new_live_file(
        tmp_path: Path, remove: bool, caplog: pytest.LogCaptureFixture) -> None:
    live = tmp_path / "audit.jsonl"
    handler = handler_for(live)
    try:
        if remove:
            live.unlink()
        else:
            live.rename(tmp_path / "elsewhere.jsonl")
        with caplog.at_level(logging.ERROR, logger="auditlog.rotation"):
            handler.write_lines("second\nthird")
            handler.write_lines("fourth")
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors
        if remove:  # "first" went with it too
            assert "removed by another program: the 3 record(s) it held" in errors[0] and "lost" in errors[0]
        else:  # "first" is in the moved file, where it was
            assert "moved away by another program: the last 2 record(s)" in errors[0]
        assert handler.strayed == 0
        assert live.read_text() == "fourth\n"
    finally:
        handler.close()


def test_an_append_finishes_a_short_write_and_keeps_the_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    live = tmp_path / "audit.jsonl"
    handler = handler_for(live)
    real_write = os.write
    calls = []

    def short_write(fd: int, data: bytes) -> int:  # as write(2) may, on a signal or a full disk's edge
        calls.append(len(data))
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr("auditlog.rotation.os.write", short_write)
    try:
        assert handler.append("second-line\nthird")
        monkeypatch.undo()
        assert live.read_text() == "first\nsecond-line\nthird\n"
        assert handler.size == live.stat().st_size and len(calls) == 3
    finally:
        handler.close()
