#!/usr/bin/env python3
"""Start-up of the `npaudit` command: wall time of `--version`, `--help`, every verb's `--help` and two verbs
that ask a (missing) agent, beside a bare interpreter's start on the same machine (the floor), medians of N
runs. Prints one JSON document.

Issue 23 asks for <= 150 ms for every verb; on a busy machine compare with the floor (over_floor_ms).
Run: `.venv/bin/python bench/cli_startup.py [--runs N]` (no root needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 150.0
CLI = [sys.executable, "-m", "policy_agent.cli.main"]
# Every verb's --help (cni has none: a runtime execs it with CNI_* variables), and two verbs that ask an
# agent, run with no agent there (they load the config and the API client, then say so: exit 1).
VERBS = ("agent", "check-config", "ovs", "apply", "delete", "verify", "syslog", "logs", "observe", "status", "stats",
         "bundle", "get", "trace", "demo", "completion")


def commands(config: Path) -> dict[str, list[str]]:
    return {
        "python_floor": [sys.executable, "-c", "pass"],
        "version": [*CLI, "--version"],
        "help": [*CLI, "--help"],
        **{f"{verb.replace('-', '_')}_help": [*CLI, verb, "--help"] for verb in VERBS},
        "status_no_agent": [*CLI, "status", "--config", str(config)],
        "get_rules_no_agent": [*CLI, "get", "rules", "--config", str(config)],
    }


def wall_ms(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    medians = {}
    with tempfile.TemporaryDirectory(prefix="npaudit-startup-") as tmp:
        config = Path(tmp) / "agent.yaml"
        config.write_text(f"state_dir: {tmp}\n")  # no agent answers there
        for name, argv in commands(config).items():
            wall_ms(argv)  # warm the page cache
            medians[name] = round(statistics.median(wall_ms(argv) for _ in range(args.runs)), 1)
    over = {k: round(v - medians["python_floor"], 1) for k, v in medians.items() if k != "python_floor"}
    print(json.dumps({
        "benchmark": "cli_startup", "runs": args.runs, "median_wall_ms": medians, "over_floor_ms": over,
        "target_ms": TARGET_MS,
        "target_met": {k: v <= TARGET_MS for k, v in medians.items() if k != "python_floor"},
        "slowest_over_floor": max(over, key=over.__getitem__),
    }, indent=2))


if __name__ == "__main__":
    main()
