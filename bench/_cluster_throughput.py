"""bench/cluster_scale.py's throughput part: cross-node TCP with logging on vs off, and cross-node vs
same-node, made robust to a shared machine.

A run is a series of steps; each step sets the ClusterNetworkPolicy that allows x -> y on the bench port
with `enableLogging` off or on (alternating every step: off, on, off, on, ...), waits three polls of the
shared source, then runs one short TCP stream x/a (n1) -> y/a (n2) (cross-node) and one x/a -> y/b (n1)
(same node), back to back, which one first alternating every two steps (so that neither logging state
always follows the policy write or the other path). The streams of a path thus alternate on/off; the
logging figure is the median of the on/off ratios of every two adjacent streams of a path (n-1 ratios
from n streams: a slow drift of the machine's load cancels within a pair), reported with its spread
(quartiles, min, max). Cross-node vs same-node is the median of the per-step ratios (the two streams of a
step run next to each other under the same policy), logging off; the same per CPU-second beside it.

Each stream also reports the CPU seconds it cost: the sender's and receiver's own (each process measures
itself) and the ovs-vswitchd of the node(s) it crossed (the userspace datapath does the forwarding, and
the Geneve encapsulation across nodes). Mbit per CPU-second barely moves with how much CPU the machine
lends the stream, so its on/off ratio (same adjacent pairs) says whether logging made the datapath
costlier even when throughput is noise-bound.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

PORT = 5201
TARGET = 0.95
PATHS = ("cross_node", "same_node")

# Counts what each connection delivers (first to last byte) and the CPU this process spent on it.
SERVER = r"""
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    cpu0 = time.process_time()
    buf = bytearray(1 << 20); n = 0; first = last = None
    while True:
        k = c.recv_into(buf)
        if not k:
            break
        last = time.monotonic(); first = first or last; n += k
    c.close()
    print(json.dumps({"bytes": n, "seconds": (last - first) if first else 0.0,
                      "cpu_s": time.process_time() - cpu0}), flush=True)
"""
# Sends 128 KiB writes for argv[3] seconds; prints the CPU it spent sending (not its start-up).
CLIENT = r"""
import json, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
chunk = b"\0" * (128 << 10); cpu0 = time.process_time(); end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    s.sendall(chunk)
s.close()
print(json.dumps({"cpu_s": time.process_time() - cpu0}), flush=True)
"""


# --- pure helpers (tests/unit/bench/test_cluster_throughput.py) ----------------------------------

def logging_at(step: int) -> bool:
    """Off at even steps, on at odd ones: every two adjacent streams of a path are one off, one on."""
    return step % 2 == 1


def path_order(step: int) -> tuple[str, str]:
    """Cross-node first for steps 0, 1, same-node first for 2, 3, ...: each logging state runs first
    and second equally often."""
    return PATHS if (step // 2) % 2 == 0 else (PATHS[1], PATHS[0])


def adjacent_ratios(series: Sequence[tuple[bool, float]]) -> list[float]:
    """On/off ratios of every two neighbours of `series` ((logging, value) in the order measured) whose
    logging differs and whose off value is not zero."""
    out = []
    for (log_a, a), (log_b, b) in zip(series, series[1:]):
        if log_a == log_b:
            continue
        on, off = (a, b) if log_a else (b, a)
        if off:
            out.append(on / off)
    return out


def spread(values: Sequence[float], target: float | None = None) -> dict[str, Any]:
    """Median, quartiles (inclusive method), min and max of `values`, rounded; with `target`, how many
    reach it."""
    if not values:
        return {"n": 0, "median": None}
    s = sorted(values)
    q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else (s[0], s[0], s[0])
    out: dict[str, Any] = {"n": len(s), "median": round(statistics.median(s), 3), "q1": round(q1, 3),
                           "q3": round(q3, 3), "min": round(s[0], 3), "max": round(s[-1], 3)}
    if target is not None:
        out["at_or_above_target"] = sum(1 for v in s if v >= target)
    return out


def proc_cpu_seconds(stat_line: str, ticks: int) -> float:
    """utime + stime of a /proc/<pid>/stat line (every thread of the process), in seconds."""
    fields = stat_line[stat_line.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / ticks


def stream_figures(server: dict[str, Any], client_cpu: float, vswitchd_cpu: float) -> dict[str, Any]:
    """One stream's JSON entry from what the server and client printed and the vswitchd CPU it cost."""
    seconds = float(server["seconds"])
    bits = int(server["bytes"]) * 8
    cpu = float(server["cpu_s"]) + client_cpu + vswitchd_cpu
    return {"bytes": int(server["bytes"]), "seconds": round(seconds, 3),
            "mbit_per_s": round(bits / seconds / 1e6, 1) if seconds else 0.0,
            "cpu_s": {"sender": round(client_cpu, 3), "receiver": round(float(server["cpu_s"]), 3),
                      "vswitchd": round(vswitchd_cpu, 3)},
            "mbit_per_cpu_s": round(bits / cpu / 1e6, 1) if cpu else 0.0}


def summarize(streams: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures of a run's streams (each with step, path, logging "on"/"off", mbit_per_s, mbit_per_cpu_s)."""
    def series(path: str, key: str) -> list[tuple[bool, float]]:
        return [(s["logging"] == "on", float(s[key])) for s in sorted(streams, key=lambda s: s["step"])
                if s["path"] == path]

    def by_step(path: str, logging: str, key: str = "mbit_per_s") -> dict[int, float]:
        return {s["step"]: float(s[key]) for s in streams if s["path"] == path and s["logging"] == logging}

    medians = {f"{p}_{lg}": round(statistics.median(v), 1) for p in PATHS for lg in ("off", "on")
               if (v := list(by_step(p, lg).values()))}
    on_off = {p: spread(adjacent_ratios(series(p, "mbit_per_s")), TARGET) for p in PATHS}
    per_cpu = {p: spread(adjacent_ratios(series(p, "mbit_per_cpu_s"))) for p in PATHS}
    cross_same = {lg: spread([c / same[k] for k, c in by_step("cross_node", lg).items() if same.get(k)])
                  for lg in ("off", "on") for same in [by_step("same_node", lg)]}
    same_cpu = by_step("same_node", "off", "mbit_per_cpu_s")
    cross_same_cpu = spread([c / same_cpu[k] for k, c in by_step("cross_node", "off", "mbit_per_cpu_s").items()
                             if same_cpu.get(k)])
    figure = on_off["cross_node"]["median"]
    return {"mbit_per_s_median": medians,
            "cross_node_logging_on_vs_off_ratio": figure,
            "same_node_logging_on_vs_off_ratio": on_off["same_node"]["median"],
            "cross_node_vs_same_node_ratio": cross_same["off"]["median"],
            "logging_on_vs_off_adjacent_pairs": on_off,
            "logging_on_vs_off_per_cpu_second_adjacent_pairs": per_cpu,
            "cross_node_vs_same_node_per_step": cross_same,
            "cross_node_vs_same_node_per_cpu_second_per_step": cross_same_cpu,
            "target": f"cross-node logging on >= {TARGET} of logging off (median of adjacent on/off pairs)",
            "target_met": figure is not None and figure >= TARGET}


# --- the part ------------------------------------------------------------------------------------

def _cpu(pids: Sequence[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(proc_cpu_seconds(Path(f"/proc/{p}/stat").read_text(), ticks) for p in pids)


def _vswitchd(cluster: Any, node: str) -> int:
    return int((cluster.dir / node / "ovs" / "ovs-vswitchd.pid").read_text().strip())


def stream_policy(logging: bool) -> str:
    """x -> y TCP PORT allowed, logged or not (bench/pod_throughput.py's policy)."""
    return ("apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: bench-throughput}\n"
            "spec:\n  tier: securityops\n  priority: 5\n"
            "  appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]\n"
            f"  ingress:\n  - name: allow-stream\n    action: Allow\n    enableLogging: {str(logging).lower()}\n"
            "    logLabel: bench-stream\n"
            "    from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]\n"
            f"    ports: [{{protocol: TCP, port: {PORT}}}]\n")


def _stream(server: subprocess.Popen[str], netns: str, ip: str, seconds: float, vswitchds: Sequence[int]
            ) -> dict[str, Any]:
    before = _cpu(vswitchds)
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", CLIENT, ip, str(PORT), str(seconds)],
                         check=True, timeout=seconds + 60, capture_output=True, text=True)
    assert server.stdout is not None
    got = json.loads(server.stdout.readline())
    vswitchd = _cpu(vswitchds) - before
    return stream_figures(got, float(json.loads(res.stdout)["cpu_s"]), vswitchd)


def run(cluster: Any, apply: Any, warm: Any, wait_pods: Any, seconds: float, steps: int) -> dict[str, Any]:
    """x/a (n1) -> y/a (n2) and -> y/b (n1), `steps` steps (see the module's docstring). `apply(name, text)`
    writes a manifest to the shared source; `warm(src, dsts)` and `wait_pods(nodes, count)` wait for the
    Pods to be known and reachable."""
    src = cluster.add_pod("n1", "x/a", "app=client", server=False)
    dsts = {"cross_node": cluster.add_pod("n2", "y/a", "app=server"),  # with TCP 80/81 for warm
            "same_node": cluster.add_pod("n1", "y/b", "app=server")}
    vswitchds = {"cross_node": [_vswitchd(cluster, "n1"), _vswitchd(cluster, "n2")],
                 "same_node": [_vswitchd(cluster, "n1")]}
    servers: dict[str, subprocess.Popen[str]] = {}
    streams: list[dict[str, Any]] = []
    try:
        for where, dst in dsts.items():
            servers[where] = subprocess.Popen(["ip", "netns", "exec", dst["netns"], sys.executable, "-c", SERVER,
                                               str(PORT)], stdout=subprocess.PIPE, text=True)
            out = servers[where].stdout
            if out is None or out.readline().strip() != "ready":
                raise SystemExit(f"throughput server in {dst['netns']} did not start")
        wait_pods(["n1", "n2"], 3)
        warm(src, list(dsts.values()))
        before = 0
        for step in range(steps):
            logging = logging_at(step)
            apply("bench-throughput.yaml", stream_policy(logging))
            time.sleep(1.5)  # three polls of the shared source
            for where in path_order(step):
                result = _stream(servers[where], src["netns"], dsts[where]["ip"], seconds, vswitchds[where])
                time.sleep(0.2)
                records = sum(1 for n in ("n1", "n2") for r in cluster.audit_records(n)
                              if r.get("labels", {}).get("log_label") == "bench-stream")
                result.update(step=step, path=where, logging="on" if logging else "off", audit_records=records - before)
                before = records
                streams.append(result)
    finally:
        for proc in servers.values():
            proc.kill()
            proc.wait()
    unlogged = sum(1 for s in streams if s["logging"] == "on" and not s["audit_records"])
    return {"seconds_per_stream": seconds, "steps": steps, **summarize(streams),
            "logged_streams_without_a_record": unlogged, "streams": streams}
