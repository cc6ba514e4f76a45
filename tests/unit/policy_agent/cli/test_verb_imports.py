"""Each verb's --help parses without its machinery, reading audit records never loads OpenFlow, and a verb that asks
the agent loads the API's client only (behaviour: which modules load; the time is bench/cli_startup.py's)."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from pathlib import Path
from typing import Any, Iterator

import pytest

from auditlog.query_output import FORMATS
from policy_agent.cli import logs
from tests.support.accepting import AcceptThread
from tests.support.cli_imports import code_imports, modules_imported, under

EXAMPLE = Path(__file__).resolve().parents[4] / "config" / "npaudit.yaml"
OPENFLOW = ("os_ken", "packetin.channel", "packetin.messages", "meters.ovs")
MACHINERY = (*OPENFLOW, "yaml", "prometheus_client", "bcc", "policy_agent.config.loader", "policy_agent.agent",
             "policy_agent.engine", "policy_agent.policy", "policy_agent.sources", "auditlog.query",
             "auditlog.syslog.forwarder", "orjson", "dateutil", "asyncio")


@pytest.mark.parametrize("verb", ["agent", "logs", "observe", "status", "get", "trace", "stats", "syslog", "apply"])
def test_a_verbs_help_loads_none_of_its_machinery(verb: str) -> None:
    modules, res = modules_imported([verb, "--help"])
    assert "usage: npaudit" in res.stdout
    assert under(modules, MACHINERY) == [], f"{verb} --help imports them"


def test_reading_and_filtering_records_never_loads_openflow() -> None:
    modules = code_imports("import auditlog.query, auditlog.query_output, auditlog.logs_command, auditlog.packet")
    assert under(modules, OPENFLOW) == []


# What a verb that only talks to the agent must not load: the config's sections (it reads state_dir alone,
# policy_agent/config/client.py), the policy model and compiler, the agent's side, the audit machinery.
NOT_FOR_A_CLIENT = (*OPENFLOW, "policy_agent.config.loader", "policy_agent.config.audit", "policy_agent.config.ovs",
                    "policy_agent.config.packetin", "policy_agent.config.services", "policy_agent.config.syslog",
                    "policy_agent.config.cluster", "policy_agent.config.node", "policy_agent.config.offload",
                    "dataclasses", "policy_agent.policy.model", "policy_agent.policy.kinds",
                    "policy_agent.policy.compiler", "policy_agent.policy.manifests", "policy_agent.sources",
                    "policy_agent.engine", "policy_agent.agent", "auditlog.syslog", "auditlog.writer", "asyncio",
                    "prometheus_client", "bcc", "policy_agent.cluster")


def test_asking_the_agent_loads_the_apis_client_not_its_server(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    # The shipped example with its own state_dir: every section present, none of them built.
    config.write_text(EXAMPLE.read_text().replace("state_dir: /var/run/npaudit", f"state_dir: {tmp_path}"))
    for argv in (["status"], ["get", "rules"], ["syslog", "status"],
                 ["trace", "--from", "ns/p", "--to", "10.0.0.1"]):
        modules, res = modules_imported([*argv, "--config", str(config)], ok=(1, 4))
        assert f"no agent answers at {tmp_path / 'api.sock'}" in res.stderr, res.stderr
        assert under(modules, NOT_FOR_A_CLIENT) == [], f"{argv} imports them"


def test_applying_through_a_stub_agent_loads_no_policy_machinery(tmp_path: Path) -> None:
    """The whole of `npaudit apply` (read the manifests, send them, print the reply) against a socket that
    answers like the agent: the manifests are the agent's to parse and compile."""
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")
    manifest = tmp_path / "policy.yaml"
    manifest.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n")
    with stub_agent(tmp_path / "api.sock", {"ok": True, "apply": {"namespaces": 1}, "rules": 0}) as requests:
        modules, res = modules_imported(["apply", "-f", str(manifest), "--config", str(config)])
    assert res.stdout == "apply: 1 namespaces (0 rules active)\n"
    assert [r["op"] for r in requests] == ["apply"] and "kind: Namespace" in requests[0]["manifests"]
    assert under(modules, NOT_FOR_A_CLIENT) == []


def test_status_prints_an_agents_answer_without_openflow_or_the_audit_query(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")
    snapshot = {"agent": {"pid": 7, "version": "0.1.0", "node": "node-a\x1b[31m", "uptime_seconds": 65},
                "openflow": {"connected": True, "target": "tcp:127.0.0.1:6653", "connects": 1},
                "apply_settlement": {"outcome": "rolled-back", "reason": "the switch never took it"},
                "problems": [{"time": 0, "level": "WARNING", "logger": "x", "message": "one\nline"}]}
    with stub_agent(tmp_path / "api.sock", {"ok": True, "status": snapshot}):
        modules, res = modules_imported(["status", "--config", str(config)])
    assert "interrupted apply rolled back at start: the switch never took it" in res.stdout
    assert "node node-a\\x1b[31m" in res.stdout and "one\\nline" in res.stdout  # escaped, as ever
    # sources.apply_outcome (the settlement's line) and nothing else of the agent's sources.
    assert under(modules, ("policy_agent.sources",)) == ["policy_agent.sources", "policy_agent.sources.apply_outcome"]
    heavy = [m for m in NOT_FOR_A_CLIENT if m != "policy_agent.sources"]
    assert under(modules, (*heavy, "auditlog.query", "auditlog.query_output", "orjson")) == []


def test_syslog_status_reads_an_agents_answer_without_the_forwarder(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")
    stats = {"destination": "tcp://127.0.0.1:514", "connected": True, "last_seq_sent": 40, "backlog_bytes": 0,
             "last_error": None, "sent": 40, "lost": 0, "truncated": 0, "skipped": 0, "errors": 0, "restarts": 0,
             "receiver_wait_s": 0.0}
    reply = {"ok": True, "syslog": {"writer_seq": 42, "destinations": [stats]}}
    with stub_agent(tmp_path / "api.sock", reply):
        modules, res = modules_imported(["syslog", "status", "--config", str(config)])
    assert "tcp://127.0.0.1:514" in res.stdout and "42" in res.stdout
    # The snapshot's types (auditlog.syslog.status, .stats; dataclasses) read the answer; nothing that forwards.
    heavy = [m for m in NOT_FOR_A_CLIENT if m not in ("auditlog.syslog", "dataclasses")]
    assert under(modules, (*heavy, "auditlog.syslog.forwarder", "auditlog.syslog.transport", "auditlog.syslog.relp",
                           "auditlog.syslog.tailer", "auditlog.syslog.process", "auditlog.chain", "ssl")) == []


@contextlib.contextmanager
def stub_agent(path: Path, reply: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """A local API socket at `path` answering one request with `reply` (policy_agent.rpc's framing)."""
    requests: list[dict[str, Any]] = []

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            (length,) = struct.unpack(">I", conn.recv(4, socket.MSG_WAITALL))
            requests.append(json.loads(conn.recv(length, socket.MSG_WAITALL)))
            body = json.dumps(reply).encode()
            conn.sendall(struct.pack(">I", len(body)) + body)

    agent = AcceptThread(serve, path=path, once=True)
    try:
        yield requests
    finally:
        agent.close()


def test_the_logs_parser_offers_the_output_formats_the_printer_has() -> None:
    assert logs.FORMATS == FORMATS
