#!/usr/bin/env python3
"""The idle agent's CPU and wake-ups: the e2e cluster of bench/agent_cpu.py (the agent, its embedded OVS,
two Pods, one logged Drop), no traffic, nothing scraping it. Prints JSON.

For each source tree given (--trees: this one by default; give main's checkout beside it for an A/B in
one run), in alternation over --rounds, the cluster is started from that tree (its .venv's python, its
tests/support), left to settle (--settle seconds after the first policy), then measured for --seconds:
- CPU % of a core, user + sys, of the whole process from its CPU clock (bench/agent_cpu.py process_cpu_ns:
  threads that ended during the window count, a thread started per reading would hide from a per-thread
  sum), and per live thread from schedstat;
- wake-ups/s: voluntary + involuntary context switches of the threads alive at both ends (a thread that
  ended is not counted: its CPU shows as ended_threads_cpu_percent);
- the load average beside each figure (2 shared cores: compare within one run, alternate A/B).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cpu import process_cpu_ns  # noqa: E402

HERE = Path(__file__).resolve().parent.parent

# Run with cwd = the tree measured: starts its cluster, prints the agent's pid, holds until stdin closes.
HOLDER = r"""
import sys, warnings
sys.path.insert(0, ".")
warnings.filterwarnings("ignore")
from policy_agent.config.loader import AuditConfig, PacketInConfig
from tests.support.overload_scenario import new_key_flood_cluster, settled, start_flood_pods
marks = AuditConfig().overload
c = new_key_flood_cluster(meter_rate=1_000_000, overload=marks.enabled, queue_size=PacketInConfig().policy.queue_size,
                          marks=(marks.high_mark, marks.peers_mark, marks.low_mark))
try:
    c.start(timeout=120)
    start_flood_pods(c)
    settled(c)
    print(c.agent.pid, flush=True)
    sys.stdin.read()
finally:
    c.close()
"""


def threads(pid: int) -> dict[int, tuple[str, int, int]]:
    """{tid: (name, run ns, context switches)} of the live threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            name = Path(f"{base}/comm").read_text().strip()
            run_ns = int(Path(f"{base}/schedstat").read_text().split()[0])
            status = Path(f"{base}/status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        out[int(tid)] = (name, run_ns, switches)
    return out


def measure(pid: int, seconds: float) -> dict:
    load0 = os.getloadavg()[0]
    t0, th0, cpu0 = time.monotonic(), threads(pid), process_cpu_ns(pid)
    time.sleep(seconds)
    t1, th1, cpu1 = time.monotonic(), threads(pid), process_cpu_ns(pid)
    elapsed = t1 - t0
    both = [tid for tid in th1 if tid in th0]
    live_ns = sum(th1[t][1] - th0[t][1] for t in both)
    switches = sum(th1[t][2] - th0[t][2] for t in both)
    total = (cpu1 - cpu0) / 1e9
    per_thread = sorted(({"tid": t, "name": th1[t][0], "cpu_percent": round(100 * (th1[t][1] - th0[t][1]) / 1e9
                                                                             / elapsed, 3),
                          "wakeups_per_s": round((th1[t][2] - th0[t][2]) / elapsed, 2)} for t in both),
                        key=lambda d: -d["cpu_percent"])
    return {"seconds": round(elapsed, 2), "cpu_percent_of_a_core": round(100 * total / elapsed, 3),
            "live_threads_cpu_percent": round(100 * live_ns / 1e9 / elapsed, 3),
            "ended_threads_cpu_percent": round(max(0.0, 100 * (total - live_ns / 1e9) / elapsed), 3),
            "wakeups_per_s": round(switches / elapsed, 2), "threads_started": len(set(th1) - set(th0)),
            "load_average_1m": [round(load0, 2), round(os.getloadavg()[0], 2)], "threads": per_thread[:6]}


def run_tree(tree: Path, seconds: float, settle: float) -> dict:
    python = tree / ".venv" / "bin" / "python"
    proc = subprocess.Popen([str(python), "-c", HOLDER], cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            raise RuntimeError(f"the cluster of {tree} did not start")
        time.sleep(settle)
        return measure(int(line), seconds)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=120)


def git_head(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "log", "--oneline", "-1"], capture_output=True,
                          text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", default=str(HERE), help="source trees, comma separated, each with its .venv")
    ap.add_argument("--rounds", type=int, default=2, help="runs per tree, in alternation")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured time per run (at least 20)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after the cluster settled before measuring")
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",") if t]
    runs: dict[str, list[dict]] = {str(t): [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            runs[str(tree)].append(run_tree(tree, args.seconds, args.settle))
    summary = {str(t): {"head": git_head(t),
                        "cpu_percent_of_a_core": [r["cpu_percent_of_a_core"] for r in runs[str(t)]],
                        "wakeups_per_s": [r["wakeups_per_s"] for r in runs[str(t)]],
                        "load_average_1m": [r["load_average_1m"] for r in runs[str(t)]]} for t in trees}
    print(json.dumps({"benchmark": "agent_idle", "target_issue_22": "idle agent <= 1 % of a core",
                      "settings": {"seconds": args.seconds, "settle": args.settle, "rounds": args.rounds,
                                   "machine": "2 cores shared with other work: compare within this run only"},
                      "summary": summary, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
