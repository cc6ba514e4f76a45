#!/usr/bin/env python3
"""Start-up of the `npaudit` command: wall time of `--version`, `--help` and a verb's `--help`, beside
a bare interpreter's start on the same machine (the floor), medians of N runs. Prints one JSON document.

Issue 23 asks for <= 150 ms for `--version` and `--help`; on a busy machine compare with the floor.
Run: `.venv/bin/python bench/cli_startup.py [--runs N]` (no root needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 150.0
COMMANDS = {
    "python_floor": [sys.executable, "-c", "pass"],
    "version": [sys.executable, "-m", "policy_agent.cli.main", "--version"],
    "help": [sys.executable, "-m", "policy_agent.cli.main", "--help"],
    "logs_help": [sys.executable, "-m", "policy_agent.cli.main", "logs", "--help"],
    "status_help": [sys.executable, "-m", "policy_agent.cli.main", "status", "--help"],
}


def wall_ms(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    medians = {}
    for name, argv in COMMANDS.items():
        wall_ms(argv)  # warm the page cache
        medians[name] = round(statistics.median(wall_ms(argv) for _ in range(args.runs)), 1)
    print(json.dumps({
        "benchmark": "cli_startup", "runs": args.runs, "median_wall_ms": medians,
        "over_floor_ms": {k: round(v - medians["python_floor"], 1) for k, v in medians.items() if k != "python_floor"},
        "target_ms": TARGET_MS,
        "target_met": {k: medians[k] <= TARGET_MS for k in ("version", "help")},
    }, indent=2))


if __name__ == "__main__":
    main()
