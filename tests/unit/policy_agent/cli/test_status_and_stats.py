"""`npaudit status` and `npaudit stats`: the agent's snapshot over the real local API, the log ring, and counts
over a recorded multi-file (gzip) audit set."""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import io
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from auditlog.fileset import audit_files
from policy_agent.agent import Agent
from policy_agent.cli.main import main
from policy_agent.config.loader import AgentConfig, loads
from policy_agent.sources.local_api import STATUS_OP, LocalApi
from policy_agent.status import RecentProblems, snapshot as status_snapshot
from policy_agent.cli.stats import run_stats
from policy_agent.cli.status import run_status
from tests.support.audit_records import T0, sample_record, stamp, write_set

N = 120
NOW = dt.datetime(2024, 5, 2, tzinfo=dt.timezone.utc)


def config(tmp_path: Path) -> AgentConfig:
    return loads(f"state_dir: {tmp_path / 'state'}\naudit:\n  path: {tmp_path / 'logs' / 'audit.jsonl'}\n")


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "npaudit.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\naudit:\n  path: {tmp_path / 'logs' / 'audit.jsonl'}\n")
    return path


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    (tmp_path / "logs").mkdir()
    return Agent(config(tmp_path))


def snapshot(agent: Agent) -> dict[str, Any]:
    return status_snapshot(agent, now=(T0, 100.0), ovs_version="3.1.0",
                           ovs_losses={"rconn_overflow": 0, "packet_in_overflow": None})


# --- the agent's side ---

def test_the_snapshot_of_an_agent_not_yet_connected_says_what_is_not_known(agent: Agent) -> None:
    status = snapshot(agent)
    assert status["openflow"]["connected"] is False and status["meters"]["supported"] is None
    assert status["ovs"]["version"] == "3.1.0" and status["policy"] is None
    assert status["ebpf"]["active"] is False and status["ebpf"]["attached"] == 0
    assert status["ebpf"]["state"] == "disabled in the config (offload.enabled: false)"
    assert status["audit"]["path"].endswith("logs/audit.jsonl") and status["audit"]["head"]["seq"] == 0
    assert status["syslog"] == {"writer_seq": 0, "destinations": []}
    assert status["packetin"]["ovs_lost"] == {"rconn_overflow": 0, "packet_in_overflow": None}
    assert status["packetin"]["meter_drops"] is None
    assert status["traceflow"] == {"outcomes": {"delivered": 0, "forwarded": 0, "dropped": 0, "rejected": 0,
                                                "unknown-destination": 0, "timeout": 0, "no-report": 0,
                                                "error": 0},
                                   "suppressed": 0, "stray": 0, "received": 0, "reports": 0}
    json.dumps(status)  # it crosses the local API as JSON


def test_the_problem_ring_keeps_the_newest_warnings_and_errors_only() -> None:
    ring = RecentProblems(size=3)
    logger = logging.getLogger("npaudit.test.ring")
    logger.addHandler(ring)
    logger.setLevel(logging.DEBUG)
    try:
        logger.info("not a problem")
        for i in range(5):
            logger.warning("problem %d\nsecond line", i)
        logger.error("last")
    finally:
        logger.removeHandler(ring)
    lines = ring.snapshot()
    assert [p["level"] for p in lines] == ["WARNING", "WARNING", "ERROR"]
    assert [p["message"] for p in lines[:2]] == ["problem 3\\nsecond line", "problem 4\\nsecond line"]
    assert lines[2]["message"] == "last" and lines[2]["logger"] == "npaudit.test.ring"


def test_status_over_the_real_local_api_and_client(tmp_path: Path, agent: Agent) -> None:
    logging.getLogger("npaudit.test").addHandler(agent.problems)
    try:
        logging.getLogger("npaudit.test").warning("datapath of bridge br-int has NO meter support")
    finally:
        logging.getLogger("npaudit.test").removeHandler(agent.problems)

    async def serve() -> tuple[int, str]:
        async def status() -> dict[str, Any]:
            return snapshot(agent)

        cfg = config(tmp_path)
        api = LocalApi(cfg.api_socket, engine=None, status=status)  # type: ignore[arg-type]
        await api.start()
        out = io.StringIO()
        try:
            code = await asyncio.to_thread(run_status, cfg, "json", probe=lambda: (False, "no kernel headers"),
                                           out=out)
        finally:
            await api.close()
        return code, out.getvalue()

    code, text = asyncio.run(serve())
    assert code == 0
    status = json.loads(text)
    assert status["ebpf"]["state"] == "disabled in the config (offload.enabled: false)"
    assert status["ebpf"]["probe"] == {"ok": False, "reason": "no kernel headers"}
    assert status["agent"]["uptime_seconds"] == 0  # start() was not run: the snapshot's own time
    assert status["problems"][0]["message"] == "datapath of bridge br-int has NO meter support"


def test_an_older_agent_without_the_op_is_one_line_and_exit_1(tmp_path: Path) -> None:
    err = io.StringIO()
    reply = {"ok": False, "errors": [f"op: must be apply or delete, got {STATUS_OP!r}"]}
    assert run_status(config(tmp_path), api=lambda s, r: reply, out=io.StringIO(), err=err) == 1
    assert len(err.getvalue().splitlines()) == 1 and "must be apply or delete" in err.getvalue()


def test_status_when_no_agent_runs_is_one_line_and_exit_1(tmp_path: Path, capsys: Any) -> None:
    assert main(["status", "--config", str(write_config(tmp_path)), "--no-ebpf-probe"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert captured.err.startswith("error: no agent answers at ") and "api.sock" in captured.err


def test_the_status_table_names_each_subsystem_and_escapes_what_came_from_users(agent: Agent) -> None:
    status = snapshot(agent)
    status["problems"] = [{"time": T0, "level": "ERROR", "logger": "x", "message": "pod evil\x1b[2J"}]
    status["policy"] = {"tiers": 1, "policies": 2, "rules": 5, "namespaces": 2, "pods": 3}
    status["apply_settlement"] = {"outcome": "rolled-forward", "reason": "OVS enforces generation 7", "intent": 7,
                                  "switch": 7, "store": 7, "time": T0}
    out = io.StringIO()
    assert run_status(AgentConfig(), api=lambda s, r: {"ok": True, "status": status},
                      probe=lambda: (True, ""), out=out) == 0
    text = out.getvalue()
    lines = {line.split()[0]: line for line in text.splitlines() if line and not line.startswith(" ")}
    assert set(lines) == {"agent", "openflow", "ovs", "meters", "ebpf", "traceflow", "policy", "audit", "syslog",
                          "apply", "nodes", "problems"}
    assert "Pod subnet not known yet; 0 other nodes routed" in lines["nodes"]
    assert "interrupted apply rolled forward at start: OVS enforces generation 7" in lines["apply"]
    assert "no traces since start; 0 packet-ins of trace packets suppressed" in lines["traceflow"]
    assert "NOT connected" in lines["openflow"] and "3.1.0" in lines["ovs"]
    assert "disabled in the config" in lines["ebpf"] and "probe here: it can run" in lines["ebpf"]
    assert "2 policies, 5 rules" in lines["policy"] and "3 pods" in lines["policy"]
    assert "\x1b" not in text and "pod evil\\x1b[2J" in text


def test_the_status_table_counts_traces_by_outcome_and_what_they_suppressed(agent: Agent) -> None:
    agent.traceflow.stats.outcomes.update(delivered=3, dropped=1, error=1)
    agent.traceflow.stats.suppressed = 2
    status = json.loads(json.dumps(snapshot(agent)))  # as it crosses the local API
    out = io.StringIO()
    assert run_status(AgentConfig(), api=lambda s, r: {"ok": True, "status": status}, out=out) == 0
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith("traceflow")]
    assert line.split(None, 1)[1] == ("5 traces since start: delivered 3, dropped 1, error 1; 2 packet-ins of trace "
                                      "packets suppressed (not audited), 0 stray copies")
    agent.traceflow.stats.received, agent.traceflow.stats.reports = 4, 2
    status = json.loads(json.dumps(snapshot(agent)))
    out = io.StringIO()
    run_status(AgentConfig(), api=lambda s, r: {"ok": True, "status": status}, out=out)
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith("traceflow")]
    assert line.endswith("0 stray copies; other nodes' traces run here 4, their reports taken 2")


# --- stats ---

@pytest.fixture(scope="module")
def logset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("stats")
    records = [sample_record(i) for i in range(N)]
    for i, record in enumerate(records):
        record["npaudit"]["aggregate"]["offloaded_packets"] = i % 2
    write_set(directory / "audit.jsonl", records, max_bytes=12_000)
    return directory


def file_records(directory: Path) -> list[dict[str, Any]]:
    out = []
    for _, path in audit_files(directory / "audit.jsonl"):
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as f:
            out += [json.loads(line) for line in f]
    return out


def stats_json(directory: Path, *args: str, api: Any = None) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    since = args[0] if args else None
    code = run_stats(AgentConfig(state_dir=str(directory / "nostate")), [directory], since=since, until=None,
                     output="json", now=NOW, api=api or (lambda s, r: (_ for _ in ()).throw(FileNotFoundError(2, "x"))),
                     out=out, err=err)
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def test_stats_counts_every_record_of_live_and_gzipped_files(logset: Path) -> None:
    assert any(p.suffix == ".gz" for p in logset.iterdir())  # the set really has compressed files
    records = file_records(logset)
    code, report, _ = stats_json(logset)
    assert code == 0
    files = report["files"]
    assert files["records"] == N == len(records)
    assert files["packets"] == sum(r["npaudit"]["aggregate"]["packets"] for r in records)
    assert files["offloaded_packets"] == N // 2
    by_disposition = Counter(r["npaudit"]["disposition"] for r in records)
    assert {k: v["records"] for k, v in files["by_disposition"].items()} == by_disposition
    assert {k: v["records"] for k, v in files["by_policy"].items()} == Counter(r["rule"]["ruleset"] for r in records)
    pods = Counter(f"{p['namespace']}/{p['name']}" for r in records
                   for p in {tuple(r["npaudit"][s]["pod"].items()): r["npaudit"][s]["pod"]
                             for s in ("source", "destination") if s in r["npaudit"]}.values())
    assert {k: v["records"] for k, v in files["by_pod"].items()} == pods
    assert files["first"] == stamp(T0) and files["last"] == stamp(T0 + N - 1)
    assert report["agent"] is None


def test_stats_since_counts_only_the_window(logset: Path) -> None:
    since = stamp(T0 + 100)
    code, report, _ = stats_json(logset, since)
    assert code == 0 and report["files"]["records"] == N - 100 and report["files"]["first"] == since
    assert report["window"]["since"] == since


def test_stats_adds_the_agents_admission_drops_when_it_answers(logset: Path, agent: Agent) -> None:
    status = snapshot(agent)
    status["packetin"]["by_category"] = {"policy": {"received": 9, "delivered": 5, "dropped_rate_limit": 3,
                                                    "dropped_queue_full": 1, "handler_error": 0}}
    code, report, _ = stats_json(logset, api=lambda s, r: {"ok": True, "status": status})
    assert code == 0
    assert report["agent"]["admission_drops"] == {"policy": {"dropped_rate_limit": 3, "dropped_queue_full": 1}}
    assert report["agent"]["meter_drops"] is None
    assert report["agent"]["offload"] == {"active": False, "offloaded_packets": 0,
                                          "state": "disabled in the config (offload.enabled: false)"}
    out = io.StringIO()
    run_stats(AgentConfig(), [logset], since=None, until=None, output="table", now=NOW, top=2,
              api=lambda s, r: {"ok": True, "status": status}, out=out, err=io.StringIO())
    table = out.getvalue()
    assert "packet-in admission drops (policy): dropped_queue_full 1, dropped_rate_limit 3" in table
    assert "packet-ins OVS meters dropped: not read (no datapath meters, or no reading yet)" in table
    assert ("packets the eBPF offload dropped before OVS: 0 (offload not active: disabled in the config "
            "(offload.enabled: false))") in table
    assert "more (--top" in table


def test_stats_shows_meter_drops_and_offloaded_packets_when_the_agent_has_them(logset: Path, agent: Agent) -> None:
    status = snapshot(agent)
    status["packetin"]["meter_drops"] = {"policy_deny": {"packets": 301, "bytes": 30100}}
    status["ebpf"].update(active=True, offloaded_packets=5000, state="active: XDP on 2 Pod veth(s)")
    out = io.StringIO()
    run_stats(AgentConfig(), [logset], since=None, until=None, output="table", now=NOW,
              api=lambda s, r: {"ok": True, "status": status}, out=out, err=io.StringIO())
    table = out.getvalue().splitlines()
    assert "  packet-ins OVS meters dropped: policy_deny 301 (30100 bytes)" in table
    assert "  packets the eBPF offload dropped before OVS: 5000" in table


@pytest.mark.parametrize("args,message", [
    (["--since", "yesterday"], "--since 'yesterday'"),
    (["/nonexistent/npaudit"], "/nonexistent/npaudit"),
])
def test_stats_bad_time_or_path_is_exit_2_and_one_line(tmp_path: Path, logset: Path, capsys: Any,
                                                       args: list[str], message: str) -> None:
    paths = [] if args[0].startswith("/") else [str(logset)]
    assert main(["stats", "--config", str(write_config(tmp_path)), *paths, *args]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err and err.startswith("npaudit stats: ")


def test_stats_without_an_agent_prints_the_file_counts_and_says_so(tmp_path: Path, logset: Path,
                                                                  capsys: Any) -> None:
    assert main(["stats", "--config", str(write_config(tmp_path)), str(logset)]) == 0
    out = capsys.readouterr().out
    assert f"records  {N}," in out and "agent    not reached, file counts only: no agent answers" in out
    assert out.splitlines()[3].split() == ["DISPOSITION", "RECORDS", "PACKETS"]
