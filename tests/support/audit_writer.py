"""An AuditWriter in a temporary directory and readers of what it wrote, for the writer's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from auditlog.chain import RecordText
from auditlog.fileset import audit_files, iter_lines
from auditlog.writer import AuditWriter


def record(i: int) -> RecordText:
    return RecordText.of(record_fields(i))


def record_fields(i: int) -> dict[str, Any]:
    return {"@timestamp": "2024-05-01T02:14:03.512Z", "event": {"action": "dropped", "id": f"e{i}"},
            "source": {"ip": "10.0.0.5", "port": 40000 + i % 20000}, "destination": {"ip": "10.0.1.7", "port": 80},
            "rule": {"name": 'deny "all"\nnext-line \u2028 é'}, "npaudit": {"disposition": "Drop"}}


def lines_of(path: Path) -> list[dict[str, Any]]:
    """Every record in the writer's file set, oldest first."""
    out = []
    for _, p in audit_files(path):
        for _, _, raw in iter_lines(p):
            out.append(json.loads(raw))
    return out


def whole_records(path: Path) -> list[dict[str, Any]]:
    """The records of one file, skipping lines a failed write cut short."""
    got = []
    for _, _, raw in iter_lines(path):
        try:
            got.append(json.loads(raw))
        except ValueError:
            continue  # a half line
    return got


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return tmp_path / "var" / "log" / "npaudit" / "audit.jsonl"


@pytest.fixture
def make_writer() -> Iterator[Callable[..., AuditWriter]]:
    made: list[AuditWriter] = []

    def make(path: Path, *, start: bool = True, **kw: Any) -> AuditWriter:
        w = AuditWriter(path, **kw)
        made.append(w)
        if start:
            w.start()
        return w

    yield make
    for w in made:
        w.close(timeout=10)
