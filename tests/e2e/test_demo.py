"""`npaudit demo` (what `make demo` runs) end to end: it ends by showing `npaudit logs` and `npaudit stats`
on the records it produced itself, and those agree with the audit file it wrote.

The demo owns its run directory (/var/run/npaudit/demo), its namespaces and its OVS and removes them
itself; the test only starts the command and reads what it printed and wrote.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from policy_agent.demo import BASE

AUDIT = BASE / "audit" / "audit.jsonl"


def _records_since(path: Path, since: str) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if "@timestamp" in r and r["@timestamp"] >= since]


def _section(out: str, command: str) -> list[str]:
    """The lines the demo printed after `$ npaudit COMMAND ...` up to the next `$ ` line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"$ npaudit {command} "))
    rest = lines[start + 1:]
    end = next((i for i, line in enumerate(rest) if line.startswith("$ ")), len(rest))
    return [lines[start]] + rest[:end]


def test_demo_ends_with_logs_and_stats_of_its_own_records() -> None:
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "demo"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]

    logs = _section(res.stdout, "logs")
    since = re.search(r"--since (\S+)", logs[0]).group(1)
    own = _records_since(AUDIT, since)
    # The demo's traffic: x/a -> y/a and y/a -> z/a dropped, x/a -> z/a allowed and logged.
    assert {(r["npaudit"]["source"]["pod"]["name"], r["npaudit"]["source"]["pod"]["namespace"],
             r["npaudit"]["destination"]["pod"]["namespace"], r["npaudit"]["disposition"]) for r in own} \
        == {("a", "x", "y", "Drop"), ("a", "x", "z", "Allow"), ("a", "y", "z", "Drop")}
    shown = logs[1:]
    # One compact line per record of this run that was in the file when logs ran (stop may add the rest).
    assert 3 <= len(shown) <= len(own)
    for line, record in zip(shown, own):
        assert line.startswith(record["@timestamp"]) and f" {record['npaudit']['disposition']} " in line
    assert any(re.search(r" x/a:\d+ -> y/a:80 tcp Drop .*drop-x-a-to-y-http", line) for line in shown)
    assert any(re.search(r" x/a:\d+ -> z/a:80 tcp Allow ", line) for line in shown)

    stats = "\n".join(_section(res.stdout, "stats"))
    assert f"--since {since}" in stats
    assert re.search(rf"^records  {len(shown)}, packets \d+", stats, re.M), stats
    drops = sum(1 for line in shown if " Drop " in line)
    assert re.search(rf"^Drop +{drops} ", stats, re.M) and re.search(r"^Allow +1 ", stats, re.M), stats
    # Asked while the agent still ran: its packet-in counters are there, not "not reached".
    assert "agent    counters since it started" in stats, stats
    assert "npaudit verify" in res.stderr and "OK:" in res.stderr
