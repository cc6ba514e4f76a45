#!/usr/bin/env python3
"""Traceflow latency (issue 11): `trace` requests to the real agent, without and with a logged-Drop flood. Prints JSON.

A cluster of the real processes (tests/support/cluster.py): the agent with its embedded OVS, Pods
x/a, x/b, y/b, y/c, y/d through `npaudit cni`, the policies of tests/e2e/test_traceflow_e2e.py
(a securityops Drop of TCP 80 from x to y/b; a logged emergency Drop of UDP 9 to y/d). Each phase
alternates a trace (x/a -> y/b TCP 80, dropped, and UDP 53, delivered) with a baseline request
of the same local API that does no OVS work (`syslog-status`), spaced by --interval so the
traceflow copy budget (500 copies/s, 9 per trace) never paces them. Reported per phase: the
client's wall time of each request (what `npaudit trace` waits for, minus process start-up)
and the agent's own elapsed time (result "elapsed_ms"), p50/p90/p99, outcomes (every trace
must complete with the expected answer), and, under flood, the packets the policy Drop meter
dropped during the phase (proof that the policy category was saturated).

A last phase (`cross_node`) runs on a 2-node cluster on this machine (`npaudit cluster up`, Geneve):
traces from x/a on n1 alternate between y/b on n2 (across the tunnel: n1 waits for n2's report) and
x/c on n1 (the same-run baseline, one node), all delivered; reported: both sides' client and agent
times and the ratio of the p99s.

Targets (issue 11): p99 <= 50 ms without flood, <= 100 ms under flood.
Run as root: `.venv/bin/python bench/traceflow_latency.py` (JSON on stdout, progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cni_latency import pct  # noqa: E402
from policy_agent.config.loader import load  # noqa: E402
from policy_agent.sources.local_api import SYSLOG_STATUS_OP, TRACE_OP, call  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.traceflow_scenario import FLOOD, meter_drops, setup  # noqa: E402

TARGETS_P99_MS = {"no_flood": 50.0, "flood": 100.0}
CASES = ((dict(to="y/b", protocol="tcp", port=80), "dropped"), (dict(to="y/b", protocol="udp", port=53), "delivered"))


def phase(cluster: Cluster, socket: Path, n: int, interval: float) -> dict[str, Any]:
    client, agent, baseline = [], [], []
    outcomes: dict[str, int] = {}
    wrong = 0
    for i in range(n):
        case, expected = CASES[i % len(CASES)]
        t0 = time.perf_counter()
        reply = call(socket, {"op": TRACE_OP, "from": "x/a", **case, "timeout": 5})
        client.append((time.perf_counter() - t0) * 1000)
        result = reply.get("trace", {}).get("outcome", {}).get("result", "error")
        outcomes[result] = outcomes.get(result, 0) + 1
        wrong += result != expected
        if reply.get("ok"):
            agent.append(reply["trace"]["elapsed_ms"])
        t0 = time.perf_counter()
        call(socket, {"op": SYSLOG_STATUS_OP})
        baseline.append((time.perf_counter() - t0) * 1000)
        time.sleep(interval)
    return {"traces": n, "outcomes": outcomes, "unexpected_outcomes": wrong, "client_ms": pct(client),
            "agent_ms": pct(agent), "baseline_api_roundtrip_ms": pct(baseline)}


def cross_node_phase(n: int, interval: float) -> dict[str, Any]:
    """Traces across the tunnel and on one node, alternating, in one 2-node cluster."""
    from tests.support.local_cluster import LocalCluster
    from tests.support.waiting import wait_for

    cluster = LocalCluster()
    try:
        cluster.up(2, "--encapsulation", "geneve")
        a = cluster.add_pod("n1", "x/a", server=False)
        cluster.add_pod("n1", "x/c", server=False)
        b = cluster.add_pod("n2", "y/b")
        wait_for(lambda: [cluster.node_status(x)["policy"]["pods"] for x in ("n1", "n2")] == [3, 3], timeout=120,
                 what="every Pod known on both nodes")
        wait_for(lambda: cluster.probe(a["netns"], [f"{b['ip']}:80/tcp"]) == {f"{b['ip']}:80/tcp": "connected"},
                 timeout=60, interval=0.5, what="the tunnel carrying x/a -> y/b")
        socket = load(cluster.config("n1")).api_socket
        times: dict[str, dict[str, list[float]]] = {k: {"client": [], "agent": []} for k in ("cross", "same")}
        outcomes: dict[str, dict[str, int]] = {"cross": {}, "same": {}}
        for to in ("y/b", "x/c"):  # first-use costs out of the way
            call(socket, {"op": TRACE_OP, "from": "x/a", "to": to, "port": 80})
        for i in range(n):
            kind, to = ("cross", "y/b") if i % 2 == 0 else ("same", "x/c")
            t0 = time.perf_counter()
            reply = call(socket, {"op": TRACE_OP, "from": "x/a", "to": to, "port": 80, "timeout": 5})
            times[kind]["client"].append((time.perf_counter() - t0) * 1000)
            result = reply.get("trace", {}).get("outcome", {}).get("result", "error")
            outcomes[kind][result] = outcomes[kind].get(result, 0) + 1
            if reply.get("ok"):
                times[kind]["agent"].append(reply["trace"]["elapsed_ms"])
            time.sleep(interval)
        out: dict[str, Any] = {kind: {"outcomes": outcomes[kind], "client_ms": pct(t["client"]),
                                      "agent_ms": pct(t["agent"])} for kind, t in times.items()}
        cross_p99, same_p99 = out["cross"]["client_ms"].get("p99"), out["same"]["client_ms"].get("p99")
        out["client_p99_vs_same_node"] = round(cross_p99 / same_p99, 2) if cross_p99 and same_p99 else None
        out["all_delivered"] = all(set(o) == {"delivered"} for o in outcomes.values())
        return out
    finally:
        cluster.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=200, help="traces per phase")
    ap.add_argument("--interval", type=float, default=0.03, help="seconds between traces")
    args = ap.parse_args()
    cluster = Cluster()
    try:
        cluster.start()
        pods = setup(cluster)
        socket = load(str(cluster.config)).api_socket
        call(socket, {"op": TRACE_OP, "from": "x/a", "to": "y/b", "port": 80})  # first-use costs out of the way
        print("phase: no flood", file=sys.stderr)
        quiet = phase(cluster, socket, args.traces, args.interval)
        print("phase: logged Drop flood", file=sys.stderr)
        duration = args.traces * (args.interval + 0.05) + 5
        before = meter_drops(cluster, 2)
        flood = subprocess.Popen(["ip", "netns", "exec", pods["x/b"].netns, sys.executable, "-c", FLOOD,
                                  pods["y/d"].ip, str(duration)], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(1.0)
            flooded = phase(cluster, socket, args.traces, args.interval)
            flooded["policy_meter_drops_during_phase"] = meter_drops(cluster, 2) - before
        finally:
            flood.kill()
            flood.wait()
    finally:
        cluster.close()
    print("phase: across nodes (2-node cluster)", file=sys.stderr)
    cross = cross_node_phase(args.traces, args.interval)
    result = {
        "bench": "traceflow_latency", "traces_per_phase": args.traces, "interval_s": args.interval,
        "no_flood": quiet, "flood": flooded, "cross_node": cross,
        "targets": {name: {"p99_ms_target": target, "client_p99_ms": res["client_ms"].get("p99"),
                           "met": (res["client_ms"].get("p99") or 1e9) <= target and not res["unexpected_outcomes"]}
                    for (name, target), res in zip(TARGETS_P99_MS.items(), (quiet, flooded))},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
