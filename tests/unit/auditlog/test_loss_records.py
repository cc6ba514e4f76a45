"""Loss records: the audit trail states its own gaps, in a record chained like every other."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import jsonschema

from auditlog.chain import OBSERVER, RecordText
from auditlog.logs_command import LogsRequest, run_logs
from auditlog.loss_records import ADMISSION, METER, RECORDS, WRITER_FULL, LossKey, LossRecorder
from auditlog.verify import verify
from policy_agent.config.loader import AgentConfig
from policy_agent.cli.stats import run_stats
from tests.support.audit_records import T0, sample_record, write_set

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "config" / "audit-record.schema.json").read_text())
DENY = LossKey("policy", METER, "policy_deny")
RATE = LossKey("policy", ADMISSION, "rate_limit")
FULL = LossKey("policy", WRITER_FULL, "audit_writer", RECORDS)
CONTEXT = {"observer": {"hostname": "node-a"}}


class Sink:
    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.records: list[dict[str, Any]] = []

    def __call__(self, text: RecordText) -> bool:
        if self.accept:
            self.records.append(text.record())
        return self.accept


def test_nothing_is_written_while_no_count_changes() -> None:
    sink = Sink()
    recorder = LossRecorder(sink, now=T0, context=CONTEXT)
    assert recorder.tick({DENY: 0, RATE: 0}, T0 + 5) is None
    assert recorder.tick({DENY: 0, RATE: 0}, T0 + 10) is None
    assert sink.records == []


def test_a_window_with_losses_gets_one_record_with_its_counts_and_bounds() -> None:
    sink = Sink()
    recorder = LossRecorder(sink, now=T0, context=CONTEXT)
    recorder.tick({DENY: 0, RATE: 0, FULL: 0}, T0 + 5)
    record = recorder.tick({DENY: 301, RATE: 4, FULL: 2}, T0 + 10)
    assert record is not None and [r["event"]["id"] for r in sink.records] == [record["event"]["id"]]
    loss = record["npaudit"]["loss"]
    assert loss["packet_ins"] == 305 and loss["records"] == 2
    assert {(i["reason"], i["source"], i["unit"], i["count"]) for i in loss["by_reason"]} == {
        ("meter", "policy_deny", "packet_ins", 301), ("admission", "rate_limit", "packet_ins", 4),
        ("writer_full", "audit_writer", "records", 2)}
    assert record["event"]["start"] == "2024-05-01T02:14:08.500Z" and record["event"]["end"] == record["@timestamp"]
    assert record["@timestamp"] == "2024-05-01T02:14:13.500Z"
    # The same observer as every record kind (the node given, vendor and product always); warning, per ECS log.level.
    assert record["observer"] == {**CONTEXT["observer"], **OBSERVER} and record["log"] == {"level": "warning"}
    assert "301 policy packet-ins dropped by OVS meter policy_deny" in record["message"]
    jsonschema.validate(record, SCHEMA)


def test_only_what_grew_in_the_window_is_in_its_record() -> None:
    sink = Sink()
    recorder = LossRecorder(sink, now=T0)
    recorder.tick({DENY: 10, RATE: 3}, T0 + 5)
    record = recorder.tick({DENY: 25, RATE: 3}, T0 + 10)
    assert record is not None
    assert [(i["source"], i["count"]) for i in record["npaudit"]["loss"]["by_reason"]] == [("policy_deny", 15)]


def test_a_record_the_full_writer_refuses_is_carried_into_the_next_window() -> None:
    sink = Sink(accept=False)
    recorder = LossRecorder(sink, now=T0)
    assert recorder.tick({DENY: 7}, T0 + 5) is None and recorder.refused == 1
    sink.accept = True
    record = recorder.tick({DENY: 9}, T0 + 10)
    assert record is not None and record["npaudit"]["loss"]["by_reason"][0]["count"] == 9
    assert record["event"]["start"] == "2024-05-01T02:14:03.500Z"  # both windows
    assert recorder.written == 1


def test_a_counter_that_started_again_counts_from_zero() -> None:
    sink = Sink()
    recorder = LossRecorder(sink, now=T0)
    recorder.tick({DENY: 100}, T0 + 5)
    record = recorder.tick({DENY: 6}, T0 + 10)
    assert record is not None and record["npaudit"]["loss"]["by_reason"][0]["count"] == 6


def _set_with_losses(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    sink = Sink()
    recorder = LossRecorder(sink, now=T0 + 0.5, context=CONTEXT)
    recorder.tick({DENY: 301, FULL: 1}, T0 + 5.5)
    recorder.tick({DENY: 350, FULL: 1}, T0 + 10.5)
    records = [sample_record(0), sink.records[0], sample_record(7), sink.records[1]]
    write_set(tmp_path / "audit.jsonl", records, max_bytes=0, compress=False)
    return tmp_path, records


def test_a_file_with_loss_records_verifies_and_every_line_fits_the_schema(tmp_path: Path) -> None:
    directory, _ = _set_with_losses(tmp_path)
    result = verify([directory])
    assert result.ok and result.records == 4
    assert result.warnings == ("2 loss records state that 350 packet-ins and 1 records never became records "
                               "(meter, OVS queue, admission or writer drops; `npaudit logs` shows them as LOSS)",)
    for line in (directory / "audit.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"]["action"] == "audit-loss":
            jsonschema.validate(record, SCHEMA, format_checker=jsonschema.FormatChecker())


def _logs(directory: Path, output: str) -> str:
    out = io.BytesIO()
    code = run_logs(LogsRequest(paths=[directory], output=output), out=out, err=io.StringIO(),
                    now=dt.datetime(2024, 5, 2, tzinfo=dt.timezone.utc), tty=False, colour=False)
    assert code == 0
    return out.getvalue().decode()


def test_logs_shows_a_loss_record_as_a_loss_with_its_message_or_its_counts(tmp_path: Path) -> None:
    directory, _ = _set_with_losses(tmp_path)
    compact = _logs(directory, "compact").splitlines()
    assert len(compact) == 4
    assert compact[1].startswith("2024-05-01T02:14:09.000Z node-a: LOSS the audit trail is incomplete between "
                                 "2024-05-01T02:14:04.000Z and 2024-05-01T02:14:09.000Z: 301 policy packet-ins "
                                 "dropped by OVS meter policy_deny; 1 policy records dropped")
    table = _logs(directory, "table").splitlines()
    row = table[2].split()
    assert row[:4] == ["2024-05-01T02:14:09.000Z", "-", "-", "LOSS"] and row[-1] == "302"
    assert "policy meter policy_deny 301; policy writer_full audit_writer 1" in table[2]
    assert table[4].split()[-1] == "49"


def test_stats_counts_what_the_loss_records_state_apart_from_the_traffic_records(tmp_path: Path) -> None:
    directory, records = _set_with_losses(tmp_path)
    out = io.StringIO()
    code = run_stats(AgentConfig(state_dir=str(tmp_path / "nostate")), [directory], since=None, until=None,
                     output="json", now=dt.datetime(2024, 5, 2, tzinfo=dt.timezone.utc),
                     api=lambda s, r: (_ for _ in ()).throw(FileNotFoundError(2, "x")), out=out, err=io.StringIO())
    files = json.loads(out.getvalue())["files"]
    assert code == 0 and files["records"] == 2
    assert files["packets"] == sum(r["npaudit"]["aggregate"]["packets"] for r in (records[0], records[2]))
    assert files["losses_stated"] == {"policy meter policy_deny packet_ins": 350,
                                      "policy writer_full audit_writer records": 1}
    assert "-" not in files["by_disposition"]
