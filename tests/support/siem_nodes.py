"""Two nodes' audit file sets for the SIEM-copy tests, and `logs`/`stats` over any copy as JSON."""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from pathlib import Path
from typing import Any

from auditlog.chain import RecordText
from auditlog.writer import AuditWriter
from policy_agent.cli.main import main
from policy_agent.cli.stats import run_stats
from policy_agent.config.loader import AgentConfig
from tests.support.syslog_forwarders import record


def node_record(node: str, i: int) -> dict[str, Any]:
    rec = record(i)
    rec["observer"] = {"hostname": node, "product": "npaudit", "vendor": "npaudit"}
    rec["event"]["id"] = f"{node}-{i}"
    rec["npaudit"]["aggregate"] = {"packets": i % 7 + 1, "bytes": 60 * (i % 7 + 1)}
    return rec


def write_node(live: Path, node: str, count: int, per_second: float, progress: list[int]) -> None:
    with AuditWriter(live, max_bytes=64 * 1024, backup_count=100, max_age_days=0) as writer:
        for i in range(1, count + 1):
            assert writer.submit(RecordText.of(node_record(node, i)))
            progress[0] += 1
            time.sleep(1 / per_second)
        assert writer.flush_wait()


def logs_json(*paths: Path, capsysbinary: Any) -> list[dict[str, Any]]:
    assert main(["logs", "-o", "json", *map(str, paths)]) == 0
    return [json.loads(line) for line in capsysbinary.readouterr().out.splitlines()]


def stats_json(*paths: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    assert run_stats(AgentConfig(state_dir="/nonexistent"), list(paths), since=None, until=None, output="json",
                     now=dt.datetime.now(dt.timezone.utc), out=out, err=err,
                     api=lambda s, r: (_ for _ in ()).throw(FileNotFoundError(2, "no agent"))) == 0
    return dict(json.loads(out.getvalue())["files"])


def by_node_seq(r: dict[str, Any]) -> tuple[str, int]:
    return r["observer"]["hostname"], r["npaudit"]["seq"]
