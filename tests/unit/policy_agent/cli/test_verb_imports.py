"""Each verb's --help parses without its machinery, reading audit records never loads OpenFlow, and a verb that asks
the agent loads the API's client only (behaviour: which modules load; the time is bench/cli_startup.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditlog.query_output import FORMATS
from policy_agent.cli import logs
from tests.support.cli_imports import code_imports, modules_imported, under

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


def test_asking_the_agent_loads_the_apis_client_not_its_server(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")  # no agent there: the verb says so and exits 1
    for argv in (["status"], ["get", "rules"]):
        modules, res = modules_imported([*argv, "--config", str(config)], ok=(1,))
        assert "no agent answers" in res.stderr
        assert under(modules, ("policy_agent.sources", "policy_agent.policy", "policy_agent.engine", *OPENFLOW)) == []


def test_the_logs_parser_offers_the_output_formats_the_printer_has() -> None:
    assert logs.FORMATS == FORMATS
