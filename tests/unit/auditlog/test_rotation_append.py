"""auditlog.rotation.JsonlHandler.append: a plain append only while the open file is still the live one."""

from __future__ import annotations

import logging
from pathlib import Path

from auditlog.rotation import JsonlHandler


def handler_for(live: Path) -> JsonlHandler:
    handler = JsonlHandler(str(live), maxBytes=1 << 20, backupCount=2, encoding="ascii", use_gzip=False,
                           newline="")
    handler.emit(logging.LogRecord("t", logging.INFO, "", 0, "first", None, None))  # opens it, learns its size
    return handler


def test_appends_go_to_the_live_file_until_it_is_replaced_then_to_the_new_one(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    handler = handler_for(live)
    try:
        assert handler.append("second") and handler.append("third")
        assert live.read_text() == "first\nsecond\nthird\n"
        live.rename(tmp_path / "audit.jsonl.1")  # replaced under the handler (moved away, a new one made)
        live.write_text("")
        assert not handler.append("fourth")  # the open file is no longer the live one: nothing written
        handler.emit(logging.LogRecord("t", logging.INFO, "", 0, "fourth", None, None))  # reopens the live file
        assert handler.append("fifth")
        assert live.read_text() == "fourth\nfifth\n"
        assert (tmp_path / "audit.jsonl.1").read_text() == "first\nsecond\nthird\n"
        live.unlink()  # gone: the next append leaves it to emit
        assert not handler.append("sixth")
    finally:
        handler.close()
