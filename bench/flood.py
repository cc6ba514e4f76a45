#!/usr/bin/env python3
"""A one-key flood into a logged Drop rule through the real agent, with the eBPF offload off and on. Prints JSON.

Each run is the e2e cluster (tests/support/cluster.py: the agent process, its embedded
OVS, Pods through CNI) with the `offload:` section disabled or enabled. Pod x/a
floods y/a (the e2e test's paced UDP sender: one key) into a logged Drop;
meanwhile quiet Pod q/a pings q/b. Reported per run:

  vswitchd / agent CPU    percent of one CPU during the flood
  accounting              frames the sender sent = packets in the flood's records
                          (OVS-seen + offloaded) + OVS meter band drops (read from
                          OVS: the agent does not export them yet) + the agent's
                          admission drops + OVS's packet-in overflow + frames lost
                          before XDP (the sender veth's tx drops); `unaccounted` is
                          the rest (frames vswitchd never read, or still in flight)
  ping                    the quiet Pod's RTT p50/p99 with no flood and during it

Targets (issue 10): vswitchd CPU >= 3x lower with offload; quiet p99 within 2x of
its no-flood baseline; totals exact. Run as root.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from _bridge import machine  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from xdp_offload import tx_dropped  # noqa: E402

from policy_agent.ovs.pids import read_pid  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.offload_scenario import NAMESPACES, PORT, SENDER, pod_y, policy  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

# The e2e test's Pods and logged Drop (applied to y/a by label), plus the quiet Pods' namespace.
MANIFESTS = "---\n".join([NAMESPACES, pod_y("web"), "apiVersion: v1\nkind: Namespace\nmetadata: {name: q}\n",
                          policy("Drop")])


def offload_section(enabled: bool) -> str:
    return (f"offload:\n  enabled: {str(enabled).lower()}\n  threshold_pps: 100\n  rate_pps: 10\n  burst: 10\n"
            f"  ttl_s: 2.0\n  read_interval: 0.5\n")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def start_ping(cluster: Cluster, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(["ip", "netns", "exec", cluster.pods["q/a"].netns, "ping", "-n", "-c", str(count),
                             "-i", "0.01", "-W", "1", cluster.pods["q/b"].ip], stdout=subprocess.PIPE, text=True)


def rtts(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=120)
    times = [float(t) for t in re.findall(r"time=([\d.]+) ms", out)]
    sent = re.search(r"(\d+) packets transmitted", out)
    return {"replies": len(times), "sent": int(sent.group(1)) if sent else None,
            "p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99),
            "mean_ms": round(statistics.fmean(times), 3) if times else None}


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "npaudit_packetin_total" and s.labels.get("outcome", "").startswith("dropped_"):
                out["admission_dropped"] = out.get("admission_dropped", 0) + s.value
            elif s.name == "npaudit_ovs_packetin_lost_total":
                out["ovs_packetin_lost"] = out.get("ovs_packetin_lost", 0) + s.value
            elif s.name.startswith("npaudit_ebpf_") and not s.labels:
                out[s.name] = s.value
    return out


def flood_packets(cluster: Cluster) -> tuple[int, int, int]:
    """(packets, offloaded packets, records) of the flood rule's records so far."""
    recs = [r for r in cluster.audit_records() if r.get("labels", {}).get("log_label") == "flood"]
    agg = [r["npaudit"]["aggregate"] for r in recs]
    return sum(a["packets"] for a in agg), sum(a["offloaded_packets"] for a in agg), len(recs)


def settled_records(cluster: Cluster, timeout: float) -> tuple[int, int, int]:
    """The flood's record totals once they stop changing (offload entries expire, windows close)."""
    deadline, last, stable_since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        now = flood_packets(cluster)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 3.0:
            break
        time.sleep(0.25)
    return last or (0, 0, 0)


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def run(offload: bool, seconds: float, rate: float) -> dict[str, Any]:
    port = free_port()
    cluster = Cluster(extra_config=offload_section(offload), metrics_listen=f"127.0.0.1:{port}")
    try:
        cluster.start(timeout=120)
        cluster.apply(MANIFESTS)
        xa, ya = cluster.add_pod("x", "a", server=False), cluster.add_pod("y", "a", server=False)
        cluster.add_pod("q", "a", server=False)
        cluster.add_pod("q", "b", server=False)
        pings = int(seconds * 100)
        baseline = rtts(start_ping(cluster, pings))
        vswitchd_pid = read_pid(cluster.dir / "ovs" / "ovs-vswitchd.pid")
        if vswitchd_pid is None or cluster.agent is None:
            raise RuntimeError("ovs-vswitchd or the agent is not running")
        vswitchd, agent = psutil.Process(vswitchd_pid), psutil.Process(cluster.agent.pid)
        meter0, lost0, metrics0 = cluster.meter_band_drops(), tx_dropped(xa.netns), scrape(port)
        v0, a0, t0 = cpu(vswitchd), cpu(agent), time.monotonic()
        ping = start_ping(cluster, pings)
        # A socket sender, not raw frames: the Pod's own stack makes packets conntrack accepts.
        sent = int(subprocess.run(["ip", "netns", "exec", xa.netns, sys.executable, "-c", SENDER, ya.ip,
                                   str(PORT), str(rate), str(int(rate * seconds)), "flood"],
                                  capture_output=True, text=True, check=True).stdout)
        elapsed = time.monotonic() - t0
        v1, a1 = cpu(vswitchd), cpu(agent)
        during = rtts(ping)
        packets, offloaded, records = settled_records(cluster, timeout=30)
        metrics1 = scrape(port)
        meter = cluster.meter_band_drops() - meter0
        lost_before_xdp = tx_dropped(xa.netns) - lost0
        admission = int(metrics1.get("admission_dropped", 0) - metrics0.get("admission_dropped", 0))
        overflow = int(metrics1.get("ovs_packetin_lost", 0) - metrics0.get("ovs_packetin_lost", 0))
        ebpf = {k.removeprefix("npaudit_ebpf_"): int(v) for k, v in metrics1.items() if k.startswith("npaudit_ebpf_")}
        return {
            "offload": offload,
            "ebpf": ebpf,
            "seconds": round(elapsed, 3),
            "frames_sent": sent,
            "frames_sent_per_s": round(sent / elapsed),
            "vswitchd_cpu_percent": round(100 * (v1 - v0) / elapsed, 1),
            "agent_cpu_percent": round(100 * (a1 - a0) / elapsed, 1),
            "accounting": {
                "frames_sent": sent,
                "in_records": packets,
                "of_which_offloaded": offloaded,
                "records": records,
                "meter_band_dropped": meter,
                "admission_dropped": admission,
                "ovs_packetin_overflow": overflow,
                "lost_before_xdp": lost_before_xdp,
                "unaccounted": sent - packets - meter - admission - overflow - lost_before_xdp,
            },
            "quiet_ping": {"no_flood": baseline, "during_flood": during,
                           "p99_ratio": (round(during["p99_ms"] / baseline["p99_ms"], 2)
                                         if during["p99_ms"] and baseline["p99_ms"] else None)},
        }
    finally:
        cluster.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=30000, help="flood frames/s the sender aims for")
    args = ap.parse_args()
    off = run(False, args.seconds, args.rate)
    on = run(True, args.seconds, args.rate)
    ratio = round(off["vswitchd_cpu_percent"] / on["vswitchd_cpu_percent"], 2) if on["vswitchd_cpu_percent"] else None
    print(json.dumps({
        "bench": "flood",
        "machine": machine(),
        "rate_target_pps": args.rate,
        "runs": {"offload_off": off, "offload_on": on},
        "vswitchd_cpu_ratio_off_over_on": ratio,
        "targets": {"vswitchd_cpu_ratio_min": 3.0, "quiet_p99_ratio_max": 2.0, "unaccounted": 0},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
