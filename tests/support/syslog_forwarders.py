"""Forwarders (in a thread or a child process) over an audit file written with hostile names, for
the tests against real receivers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from auditlog.chain import RecordText
from auditlog.syslog.destination import make_destination
from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.process import ProcessForwarder
from auditlog.writer import AuditWriter

NODE = "node-a.example"
HOSTILE = ['web "quoted"', "x]y[z", "new\nline\r\n", "back\\slash", "café ☕ 名前", "tab\tend",
           '[npaudit@32473 seq="1"]', "\u2028", "k" * 10_000]


def record(i: int) -> dict[str, Any]:
    name = HOSTILE[i % len(HOSTILE)]
    return {"@timestamp": "2026-11-30T02:14:03.512Z",
            "event": {"action": ("allowed", "dropped", "rejected", "passed")[i % 4], "id": f"ev{i}"},
            "labels": {"log_label": HOSTILE[(i + 3) % len(HOSTILE)]},
            "npaudit": {"disposition": ("Allow", "Drop", "Reject", "Pass")[i % 4], "priority": 10.0,
                        "source": {"pod": {"name": name, "namespace": "ns-\u00e9"}}},
            "source": {"ip": "10.244.0.2", "port": 40000 + i}}


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return tmp_path / "log" / "audit.jsonl"


@pytest.fixture
def forwarders(request: pytest.FixtureRequest) -> Iterator[Callable[..., Forwarder]]:
    """Started forwarders, stopped at the end: threads, or (parametrized indirectly with "child") each in a child
    process as the agent runs them by default (auditlog.syslog.process)."""
    made: list[Any] = []
    kind = ProcessForwarder if getattr(request, "param", "thread") == "child" else Forwarder

    def make(url: str, live: Path, checkpoint: Path, **kw: Any) -> Forwarder:
        tls = kw.pop("tls", None)
        dest = make_destination(url, node_name=kw.pop("node_name", NODE), tls=tls,
                                batch_records=kw.pop("batch_records", 50))
        fwd = kind(dest, live=live, checkpoint=checkpoint, poll_interval=0.05, backoff_base=0.1,
                   backoff_cap=0.5, **kw)
        made.append(fwd)
        fwd.start()
        return fwd

    yield make
    for fwd in made:
        fwd.stop()


def write_records(live: Path, first: int, count: int, per_second: float = 0.0,
                  submitted: list[int] | None = None) -> None:
    """Write records through the real writer (rotating every 64 KiB, gzip); paced if per_second.
    `submitted`: its one element counts the records handed to the writer so far."""
    with AuditWriter(live, max_bytes=64 * 1024, backup_count=100, max_age_days=0) as writer:
        for i in range(first, first + count):
            assert writer.submit(RecordText.of(record(i)))
            if submitted is not None:
                submitted[0] += 1
            if per_second:
                time.sleep(1 / per_second)
        assert writer.flush_wait()


def file_lines(live: Path) -> dict[int, bytes]:
    """seq -> line (no newline) of every record on disk."""
    from auditlog.fileset import audit_files, iter_lines
    out = {}
    for _, path in audit_files(live):
        for _, _, raw in iter_lines(path):
            out[json.loads(raw)["npaudit"]["seq"]] = raw.rstrip(b"\n")
    return out
