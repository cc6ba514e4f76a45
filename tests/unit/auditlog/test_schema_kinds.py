"""Every kind of line the audit writer puts in a file fits config/audit-record.schema.json.

The lines come from the real writer and pipeline, as the agent wires them (node fields on
state records): full-detail and coarsened policy records, a loss record, and both chain
restarts (after a torn write, and after records a previous writer could not write).
"""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from auditlog import rotation as rotation_mod
from auditlog.aggregate import Aggregator
from auditlog.loss_records import METER, LossKey, LossRecorder
from auditlog.pipeline import AuditPipeline
from auditlog.writer import AuditWriter
from tests.support.audit_overload import Backlog, context, overload, pin

ROOT = Path(__file__).resolve().parents[3]
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "config" / "audit-record.schema.json").read_text()),
                                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
TORN = b'{"@timestamp": "2024-05-01T02:14'
NODE = {"observer": {"hostname": "node-a", "product": "npaudit"}, "orchestrator": {"type": "kubernetes"}}


def _kind(record: dict[str, Any]) -> str:
    event = record["event"]
    if event["action"] == "chain-restart":
        return f"chain-restart/{event['reason']}"
    if event["action"] == "audit-loss":
        return "audit-loss"
    return "coarsened" if "coarsened" in record["npaudit"].get("aggregate", {}) else "policy"


def _first_writer(live: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Policy records (full detail, then coarsened), a loss record; then a full disk and a torn last line."""
    writer = AuditWriter(live, state_fields=NODE)
    writer.start()
    full = AuditPipeline(context(), writer, Aggregator(window=1.0))
    full(pin("10.1.0.1", 1000, 2000, 100.0))
    asyncio.run(full.close())
    backlog = Backlog()
    backlog.fill = 0.9
    coarse = AuditPipeline(context(), writer, Aggregator(window=1.0), overload=overload(backlog))
    coarse(pin("10.1.0.1", 1001, 2001, 100.1))
    asyncio.run(coarse.close())
    LossRecorder(writer.submit, now=100.0, context=NODE).tick({LossKey("policy", METER, "policy_deny"): 3}, 105.0)
    assert writer.flush_wait(5)
    with monkeypatch.context() as patch:
        def no_space(self: Any, msg: str) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")
        patch.setattr(rotation_mod.JsonlHandler, "do_write", no_space)
        pipeline_after = AuditPipeline(context(), writer, Aggregator(window=0))
        pipeline_after(pin("10.1.0.2", 1002, 2002, 101.0))
        asyncio.run(pipeline_after.close())
        assert not writer.close(timeout=0.5)  # one record lost: the loss note says so
    with open(live, "ab") as f:  # an agent killed mid-write
        f.write(TORN)


def test_every_record_kind_the_writer_produces_fits_the_schema(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    live = tmp_path / "audit.jsonl"
    _first_writer(live, monkeypatch)
    second = AuditWriter(live, state_fields=NODE)
    second.start()
    assert second.flush_wait(5)
    second.close()
    lines = live.read_bytes().splitlines()
    assert lines[3] == TORN  # left in place, the chain restarts after it
    records = [json.loads(line) for line in lines if line != TORN]
    kinds = [_kind(r) for r in records]
    assert set(kinds) == {"policy", "coarsened", "audit-loss", "chain-restart/torn-write",
                          "chain-restart/records-lost"}, kinds
    for record in records:
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(record)]
        assert errors == [], (_kind(record), errors)


def test_the_schema_tells_the_two_chain_restarts_apart() -> None:
    torn = {"@timestamp": "2024-05-01T02:14:03.512Z", "message": "m",
            "event": {"kind": "state", "action": "chain-restart", "reason": "torn-write"},
            "npaudit": {"chain_restart": {"file": "audit.jsonl", "line": 3, "offset": 10, "bytes": 5, "after_seq": 2}}}
    lost = {**torn, "event": {**torn["event"], "reason": "records-lost"},
            "npaudit": {"chain_restart": {"after_seq": 2, "records_lost": 5, "lost_by_reason": {"dropped_closed": 5}}}}
    assert VALIDATOR.is_valid(torn) and VALIDATOR.is_valid(lost)
    legacy = {**torn, "event": {"kind": "state", "action": "chain-restart"}}  # files from before event.reason
    assert VALIDATOR.is_valid(legacy)
    assert not VALIDATOR.is_valid({**lost, "event": torn["event"]})  # a torn write names its bytes
    assert not VALIDATOR.is_valid({**torn, "npaudit": {"chain_restart": {"after_seq": 2}}})
    no_count = {**lost, "npaudit": {"chain_restart": {"after_seq": 2, "lost_by_reason": {"dropped_closed": 5}}}}
    assert not VALIDATOR.is_valid(no_count)
