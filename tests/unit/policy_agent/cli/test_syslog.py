"""`npaudit syslog status|test`: the marked test message, the status snapshot and its reply, the CLI's output and exit codes."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any, Sequence

import pytest

from auditlog.chain import ChainError, RecordText, parse_line
from auditlog.syslog.errors import SyslogTLSError, SyslogTransportError
from auditlog.syslog.destination import Destination, make_destination, send_test_message
from auditlog.syslog.forwarder import Forwarder, ForwarderStats
from auditlog.syslog.rfc5424 import Header, encode_test_message, rfc3339_millis
from auditlog.syslog.status import SyslogStatus, SyslogStatusError
from auditlog.writer import AuditWriter
from policy_agent.agent import Agent
from policy_agent.cli.main import main
from policy_agent.config.loader import AgentConfig, loads
from policy_agent.sources.local_api import LocalApi, call
from policy_agent.cli.syslog import run_status, run_test
from tests.support.syslog_parse import parse_message, split_octet_counted

NOW = 1796004843.512  # 2026-11-30T02:14:03.512Z
TCP = ForwarderStats("tcp://siem:514", True, 1200, 4096, None, sent=1200, lost=3, truncated=0, skipped=0, errors=1)
TLS = ForwarderStats("tls://siem:6514", False, None, None, "syslog tls://siem:6514: server certificate not trusted",
                     sent=0, lost=0, truncated=0, skipped=0, errors=7, restarts=2)


class FakeSender:
    def __init__(self, fail: bool = False) -> None:
        self.frames: list[bytes] = []
        self.connected = False
        self.closed = 0
        self.fail = fail

    def connect(self) -> None:
        if self.fail:
            raise SyslogTransportError("tcp://siem:514: cannot connect: refused")
        self.connected = True

    def send(self, frames: Sequence[bytes]) -> None:
        self.frames += frames

    def unacked(self) -> int:
        return 0

    def finish(self, timeout: float) -> bool:
        self.close()
        return True

    def close(self) -> None:
        self.connected = False
        self.closed += 1


# --- the test message ---

def test_the_test_message_is_marked_by_msgid_structured_data_and_msg_and_carries_no_seq_or_chain() -> None:
    message = encode_test_message(Header.for_node("node-a", "local3"), timestamp=rfc3339_millis(NOW),
                                  test_id="5eed")
    parsed = parse_message(message)
    assert (parsed.facility, parsed.severity, parsed.hostname, parsed.app_name, parsed.msgid) == (
        19, 5, "node-a", "npaudit", "TEST")
    assert parsed.timestamp == "2026-11-30T02:14:03.512Z"
    assert parsed.sd == {"npaudit@32473": {"test": "true", "id": "5eed"}}
    body = json.loads(parsed.msg)
    assert body["npaudit"] == {"test": True} and body["event"]["id"] == "5eed"
    assert "not part of the hash chain" in body["message"]
    with pytest.raises(ChainError):  # no reader of a forwarded copy can take it for a chain record
        parse_line(parsed.msg)


def test_sending_a_test_message_uses_the_destinations_framing_and_closes_its_own_connection() -> None:
    sender = FakeSender()
    dest = make_destination("tcp://siem:514", node_name="node-a")
    send_test_message(dest, now=NOW, test_id="abc", sender=sender)
    (frame,) = sender.frames
    (message,), rest = split_octet_counted(frame)
    assert rest == b"" and parse_message(message).msgid == "TEST" and sender.closed == 1
    failing = FakeSender(fail=True)
    with pytest.raises(SyslogTransportError, match="refused"):
        send_test_message(dest, now=NOW, test_id="abc", sender=failing)
    assert failing.closed == 1 and failing.frames == []


# --- the status snapshot ---

@pytest.mark.parametrize("writer_seq,last_sent,backlog", [
    (1250, 1200, 50), (1200, 1200, 0), (1250, None, None), (None, 1200, None), (10, 1200, None)])
def test_backlog_in_records_is_the_writers_seq_minus_the_last_sent_when_both_are_known(
        writer_seq: int | None, last_sent: int | None, backlog: int | None) -> None:
    stats = ForwarderStats("tcp://siem:514", True, last_sent, 0, None, 0, 0, 0, 0, 0)
    assert SyslogStatus(writer_seq, (stats,)).backlog_records(stats) == backlog


def test_the_status_reply_reads_back_and_a_malformed_one_is_named_by_field() -> None:
    status = SyslogStatus(1250, (TCP, TLS))
    reply = json.loads(json.dumps(status.to_json()))
    assert reply["destinations"][0]["backlog_records"] == 50
    assert SyslogStatus.from_json(reply) == status
    reply["destinations"][1]["sent"] = "many"
    with pytest.raises(SyslogStatusError, match=r"destinations\[1\]\.sent"):
        SyslogStatus.from_json(reply)
    with pytest.raises(SyslogStatusError, match="writer_seq"):
        SyslogStatus.from_json({"writer_seq": "x", "destinations": []})


# --- npaudit syslog status ---

def status_reply(status: SyslogStatus) -> Any:
    return lambda socket, request: {"ok": True, "syslog": status.to_json()} \
        if request == {"op": "syslog-status"} else {"ok": False, "errors": [f"unexpected {request}"]}


def test_status_prints_one_aligned_row_per_destination_with_backlog_and_last_error() -> None:
    out = io.StringIO()
    assert run_status(AgentConfig(), api=status_reply(SyslogStatus(1250, (TCP, TLS))), out=out) == 0
    header, tcp, tls = out.getvalue().splitlines()
    assert header.split()[:4] == ["DESTINATION", "CONNECTED", "LAST", "SENT"]
    assert tcp.split() == ["tcp://siem:514", "yes", "1200", "1250", "50", "4096", "1200", "3", "0", "1", "0", "-"]
    # RESTARTS: forwarder children that died and were started again (syslog.process)
    assert tls.split()[:11] == ["tls://siem:6514", "no", "-", "1250", "-", "-", "0", "0", "0", "7", "2"]
    assert tls.endswith("server certificate not trusted")
    assert header.index("LAST ERROR") == tcp.rindex("-") == tls.index("syslog tls://")  # one column


def test_status_as_json_is_the_agents_snapshot_with_the_backlog_in_records() -> None:
    out = io.StringIO()
    status = SyslogStatus(1250, (TCP,))
    assert run_status(AgentConfig(), "json", api=status_reply(status), out=out) == 0
    assert json.loads(out.getvalue()) == status.to_json()


def test_status_without_destinations_says_so_and_succeeds() -> None:
    out = io.StringIO()
    assert run_status(AgentConfig(), api=status_reply(SyslogStatus(7)), out=out) == 0
    assert out.getvalue().startswith("no syslog destinations configured")


@pytest.mark.parametrize("reply,message", [
    ({"ok": False, "errors": ["op: must be apply or delete, got 'syslog-status'"]}, "op: must be apply"),
    ({"ok": True, "syslog": {"destinations": [{"destination": 1}]}}, "destinations[0].destination"),
])
def test_status_with_a_refusal_or_a_malformed_reply_fails_with_one_line(reply: dict, message: str) -> None:
    err = io.StringIO()
    assert run_status(AgentConfig(), api=lambda s, r: reply, out=io.StringIO(), err=err) == 1
    assert len(err.getvalue().splitlines()) == 1 and message in err.getvalue()


def test_status_when_no_agent_runs_is_one_clear_line_and_exit_1(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "npaudit.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    assert main(["syslog", "status", "--config", str(config)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"error: no agent answers at {tmp_path / 'state' / 'api.sock'} (No such file or directory); "
        "is `npaudit agent` running with this config?"]


def test_the_status_op_answers_over_a_real_local_api_from_the_agents_forwarders(tmp_path: Path) -> None:
    """Agent.syslog_status (the composition root's wiring) behind a LocalApi on a temp socket, read by the CLI."""
    live = tmp_path / "log" / "audit.jsonl"
    cfg = loads(f"node_name: node-a\nstate_dir: {tmp_path / 'state'}\naudit: {{path: {live}}}\n"
                "syslog: {destinations: [{url: 'tcp://127.0.0.1:9'}, {url: 'udp://127.0.0.1:9'}]}\n")
    agent = Agent(cfg)
    with AuditWriter(live) as writer:
        for i in range(12):
            assert writer.submit(RecordText.of({"event": {"id": f"e{i}"}, "npaudit": {"disposition": "Allow"}}))
        assert writer.flush_wait()
        agent.audit_writer = writer  # the agent's own writer is started only by Agent.start (root, OVS)
        tcp = agent.syslog[0]
        fake = FakeSender()
        agent.syslog[0] = Forwarder(make_destination("tcp://127.0.0.1:9", node_name="node-a", batch_records=5),
                                    live=live, checkpoint=tcp.checkpoint, sender=fake, burst=False)
        agent.syslog[0].step(0.0)  # one batch of 5 delivered
        out = io.StringIO()

        async def serve_and_ask() -> int:
            api = LocalApi(cfg.api_socket, engine=None, syslog_status=agent.syslog_status)  # type: ignore[arg-type]
            await api.start()
            try:
                return await asyncio.to_thread(run_status, cfg, "json", out=out)
            finally:
                await api.close()

        assert asyncio.run(serve_and_ask()) == 0
    report = json.loads(out.getvalue())
    assert report["writer_seq"] == 12
    tcp_row, udp_row = report["destinations"]
    assert (tcp_row["destination"], tcp_row["connected"], tcp_row["last_seq_sent"], tcp_row["sent"],
            tcp_row["backlog_records"]) == ("tcp://127.0.0.1:9", True, 5, 5, 7)
    assert tcp_row["backlog_bytes"] > 0
    assert (udp_row["destination"], udp_row["connected"], udp_row["last_seq_sent"]) == ("udp://127.0.0.1:9", False,
                                                                                        None)


def test_the_local_api_without_forwarders_reports_no_destinations(tmp_path: Path) -> None:
    async def ask() -> dict[str, Any]:
        api = LocalApi(tmp_path / "api.sock", engine=None)  # type: ignore[arg-type]
        await api.start()
        try:
            return await asyncio.to_thread(call, tmp_path / "api.sock", {"op": "syslog-status"})
        finally:
            await api.close()

    assert asyncio.run(ask()) == {"ok": True, "syslog": {"writer_seq": None, "destinations": []}}


# --- npaudit syslog test ---

TWO = loads("node_name: node-a\nsyslog: {destinations: [{url: 'tcp://siem:514'}, "
            "{url: 'tls://siem:6514', ca: /etc/npaudit/siem-ca.pem}]}\n")


class Recorder:
    def __init__(self, failing: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.sent: list[tuple[Destination, float, str]] = []
        self.failing = failing

    def __call__(self, dest: Destination, now: float, test_id: str) -> None:
        self.sent.append((dest, now, test_id))
        if dest.name in self.failing:
            raise SyslogTLSError(f"syslog {dest.name}: server certificate not trusted (unable to get local issuer "
                                 "certificate); not sending")


def test_syslog_test_sends_one_message_per_destination_with_one_id_and_succeeds_when_all_arrive() -> None:
    send, out = Recorder(), io.StringIO()
    assert run_test(TWO, send=send, clock=lambda: NOW, out=out) == 0
    assert [d.name for d, _, _ in send.sent] == ["tcp://siem:514", "tls://siem:6514"]
    assert len({tid for _, _, tid in send.sent}) == 1 and send.sent[1][0].tls.ca == Path("/etc/npaudit/siem-ca.pem")
    first, tcp, tls = out.getvalue().splitlines()
    assert send.sent[0][2] in first
    assert tcp.split()[:2] == ["tcp://siem:514", "ok"] and "acknowledged" in tcp
    assert tls.split()[:2] == ["tls://siem:6514", "ok"]


def test_syslog_test_fails_when_one_destination_fails_and_names_its_error() -> None:
    out = io.StringIO()
    assert run_test(TWO, send=Recorder({"tls://siem:6514"}), clock=lambda: NOW, out=out) == 1
    _, tcp, tls = out.getvalue().splitlines()
    assert tcp.split()[1] == "ok"
    assert tls.split()[1] == "FAILED" and "server certificate not trusted" in tls


def test_syslog_test_of_one_destination_takes_its_settings_from_the_config_or_the_defaults() -> None:
    send = Recorder()
    assert run_test(TWO, "tls://siem", send=send, out=io.StringIO()) == 0  # default port 6514: the configured one
    assert [(d.name, d.tls.ca) for d, _, _ in send.sent] == [("tls://siem:6514", Path("/etc/npaudit/siem-ca.pem"))]
    send, out = Recorder(), io.StringIO()
    assert run_test(TWO, "udp://other:5514", send=send, out=out) == 0
    assert [d.name for d, _, _ in send.sent] == ["udp://other:5514"]
    assert "no acknowledgement" in out.getvalue() and "not in the config" in out.getvalue()


@pytest.mark.parametrize("cfg,url,message", [
    (AgentConfig(), None, "no syslog destinations configured"),
    (TWO, "http://siem", "scheme must be one of"),
])
def test_syslog_test_with_nothing_to_send_to_fails_with_one_line(cfg: AgentConfig, url: str | None,
                                                                 message: str) -> None:
    send, err = Recorder(), io.StringIO()
    assert run_test(cfg, url, send=send, out=io.StringIO(), err=err) == 1
    assert send.sent == [] and len(err.getvalue().splitlines()) == 1 and message in err.getvalue()
