#!/usr/bin/env python3
"""Start-up of the `npaudit` command: wall time of `--version`, `--help`, every verb's `--help` and two verbs
that ask a (missing) agent, beside a bare interpreter's start on the same machine (the floor), medians of N
runs. Prints one JSON document.

Issue 23 asks for <= 150 ms for every verb; on a busy machine compare with the floor (over_floor_ms) and
look at each command's own CPU time (median_cpu_ms, cpu_over_floor_ms), which others' load hardly moves.
Run: `.venv/bin/python bench/cli_startup.py [--runs N]` (no root needed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 150.0
CLI = [sys.executable, "-m", "policy_agent.cli.main"]
# Every verb's --help (cni has none: a runtime execs it with CNI_* variables), and two verbs that ask an
# agent, run with no agent there (they load the config and the API client, then say so: exit 1).
VERBS = ("agent", "check-config", "ovs", "apply", "delete", "verify", "syslog", "logs", "observe", "status", "stats",
         "bundle", "get", "trace", "demo", "completion")


POLICY = """apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: bench-one-rule}
spec:
  priority: 5
  appliedTo: [{podSelector: {matchLabels: {app: web}}}]
  ingress: [{action: Drop, name: r1, ports: [{protocol: TCP, port: 80}]}]
"""


# What a running agent's status answer holds, in brief (policy_agent/status.py): enough for every line of the table.
STATUS = {"agent": {"pid": 1, "version": "0.1.0", "node": "node-a", "uptime_seconds": 3600, "started": 0},
          "openflow": {"connected": True, "target": "tcp:127.0.0.1:6653", "connects": 1},
          "ovs": {"version": "3.1.0", "datapath_type": "netdev", "bridge": "br-int", "mode": "embedded"},
          "meters": {"supported": True}, "ebpf": {"state": "off", "active": False},
          "policy": {"tiers": 5, "policies": 100, "rules": 1000, "namespaces": 3, "pods": 30},
          "audit": {"enabled": True, "path": "/var/log/npaudit/audit.jsonl", "head": {"seq": 1, "chain": "0" * 64}},
          "apply_settlement": {"outcome": "nothing", "store": 3}, "problems": []}


def stub_agent(path: Path) -> None:
    """A local API socket at `path` answering every request at once, in a daemon thread (`status` with STATUS, any
    other op "ok"): what is left of `npaudit apply`'s wall time is the command's own (bench/cni_latency.py's
    apply_wall_ms minus agent_side_ms), and `status` prints a whole table."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    replies = {"status": json.dumps({"ok": True, "status": STATUS}).encode()}
    default = json.dumps({"ok": True, "apply": {"policies": 1}, "rules": 1000}).encode()

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            with conn:
                (length,) = struct.unpack(">I", conn.recv(4, socket.MSG_WAITALL))
                op = json.loads(conn.recv(length, socket.MSG_WAITALL)).get("op")
                reply = replies.get(op, default)
                conn.sendall(struct.pack(">I", len(reply)) + reply)
    threading.Thread(target=serve, daemon=True).start()


def commands(config: Path, stub_config: Path, policy: Path) -> dict[str, list[str]]:
    """`config`: no agent answers there; `stub_config`: its api_socket is stub_agent's."""
    return {
        "python_floor": [sys.executable, "-c", "pass"],
        "version": [*CLI, "--version"],
        "help": [*CLI, "--help"],
        **{f"{verb.replace('-', '_')}_help": [*CLI, verb, "--help"] for verb in VERBS},
        "status_no_agent": [*CLI, "status", "--config", str(config)],
        "get_rules_no_agent": [*CLI, "get", "rules", "--config", str(config)],
        "apply_one_policy_stub_agent": [*CLI, "apply", "-f", str(policy), "--config", str(stub_config)],
        "status_stub_agent": [*CLI, "status", "--config", str(stub_config)],
    }


def run_ms(argv: list[str]) -> tuple[float, float]:
    """(wall ms, CPU ms: the process's user + system time) of one run. On a machine others load, the wall time
    holds their share too; the CPU time is the command's own work (a run waits for no I/O here)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - t0) * 1000
    proc.returncode = 0  # reaped by wait4: Popen must not wait for it again
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    medians, cpu = {}, {}
    with tempfile.TemporaryDirectory(prefix="npaudit-startup-", dir="/tmp") as tmp:  # AF_UNIX paths are short
        config = Path(tmp) / "agent.yaml"
        config.write_text(f"state_dir: {tmp}\n")
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(POLICY)
        no_agent = Path(tmp) / "none"
        no_agent.mkdir()
        (no_agent / "agent.yaml").write_text(f"state_dir: {no_agent}\n")  # no agent answers there
        stub_agent(Path(tmp) / "api.sock")  # the config's api_socket
        for name, argv in commands(no_agent / "agent.yaml", config, policy).items():
            run_ms(argv)  # warm the page cache
            runs = [run_ms(argv) for _ in range(args.runs)]
            medians[name] = round(statistics.median(w for w, _ in runs), 1)
            cpu[name] = round(statistics.median(c for _, c in runs), 1)
    over = {k: round(v - medians["python_floor"], 1) for k, v in medians.items() if k != "python_floor"}
    cpu_over = {k: round(v - cpu["python_floor"], 1) for k, v in cpu.items() if k != "python_floor"}
    print(json.dumps({
        "benchmark": "cli_startup", "runs": args.runs, "load_avg_at_start": load_at_start,
        "median_wall_ms": medians, "over_floor_ms": over, "median_cpu_ms": cpu, "cpu_over_floor_ms": cpu_over,
        "target_ms": TARGET_MS,
        "target_met": {k: v <= TARGET_MS for k, v in medians.items() if k != "python_floor"},
        "slowest_over_floor": max(over, key=over.__getitem__),
    }, indent=2))


if __name__ == "__main__":
    main()
