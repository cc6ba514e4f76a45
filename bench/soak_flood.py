#!/usr/bin/env python3
"""A packet-in flood at OVS's maximum for --minutes through the real agent: its RSS, and every packet-in accounted. Prints JSON.

Issue 14: "10-minute packet-in flood at OVS's maximum with agent RSS <= 200 MB and every
packet-in accounted (admitted + dropped by reason = received)".

The agent is the e2e cluster's (tests/support/cluster.py: the agent process, its embedded
OVS, Pods through CNI) with bench/flood.py's Pods and logged Drop rule, the offload off
and the debug tap off. The policy_deny meter is raised far above what OVS can emit
(--meter-rate), so the packet-in rate is OVS's own ceiling, not the meter's; the agent's
token buckets and fair shares then drop what is above its admission rate (counted).
Pod x/a sends UDP to the rule's port from --keys source ports, unpaced, for the whole
run. Every second the agent's RSS is sampled (psutil).

Accounting, as deltas over the flood (counters read before it and once they settle after):

  agent        received (npaudit_packetin_total{outcome="received"} + unroutable) against
               admitted (delivered, handler_error) + dropped by reason; `difference` must be 0
  ovs_vs_agent packet-ins OVS sent (n_packets of its controller flows, `ovs-ofctl dump-flows`,
               minus the meter bands' drops, `ovs-ofctl meter-stats`) against those OVS lost
               before sending (npaudit_ovs_packetin_lost_total: rconn/packet-in overflow) plus
               what the agent received; `difference` must be 0

Run as root. Default 10 minutes; `--minutes 1` for a short check.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from _bridge import machine  # noqa: E402
from flood import MANIFESTS, cpu  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.support.cluster import Cluster  # noqa: E402
from tests.support.offload_scenario import PORT  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.udp_flood import send_flood  # noqa: E402

RSS_TARGET_MB = 200.0

def meters_section(rate: int) -> str:
    return f"meters:\n  policy_deny:\n    rate: {rate}\n    burst: {rate}\n"


def counters(port: int) -> dict[str, float]:
    """The agent's packet-in counters, flattened: 'packetin/<category>/<outcome>', 'unroutable/<reason>', ..."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "npaudit_packetin_total":
                out[f"packetin/{s.labels['category']}/{s.labels['outcome']}"] = s.value
            elif s.name == "npaudit_packetin_unroutable_total":
                out[f"unroutable/{s.labels['reason']}"] = s.value
            elif s.name == "npaudit_ovs_packetin_lost_total":
                out[f"ovs_lost/{s.labels['counter']}"] = s.value
            elif s.name == "npaudit_packetin_queue_depth":
                out[f"queue/{s.labels['category']}"] = s.value
            elif s.name in ("npaudit_audit_packet_ins_total", "npaudit_audit_records_coarsened_total",
                            "npaudit_audit_writer_queue_depth"):
                out[s.name] = s.value
    return out


def ovs_side(cluster: Cluster) -> dict[str, int]:
    return {"controller_flow_packets": cluster.controller_flow_packets(), "meter_band_dropped": cluster.meter_band_drops()}


def settled(port: int, timeout: float = 60.0) -> dict[str, float]:
    """The counters once the agent's queues are empty and nothing changed for 2 s (OVS drained too)."""
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        now = counters(port)
        busy = any(v for k, v in now.items() if k.startswith("queue/"))
        if busy or now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 2.0:
            break
        time.sleep(0.25)
    return last or counters(port)


class RssSampler:
    """The agent's resident set size every `interval` s, in a thread, until stopped."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self._proc, self._interval = psutil.Process(pid), interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._proc.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def delta(after: dict[str, float], before: dict[str, float], prefix: str) -> dict[str, int]:
    return {k.removeprefix(prefix): int(after[k] - before.get(k, 0)) for k in sorted(after) if k.startswith(prefix)}


def accounting(before: dict[str, float], after: dict[str, float], ovs0: dict[str, int],
               ovs1: dict[str, int]) -> dict[str, Any]:
    pins = delta(after, before, "packetin/")
    unroutable = delta(after, before, "unroutable/")
    received = sum(n for k, n in pins.items() if k.endswith("/received")) + sum(unroutable.values())
    admitted = {o: sum(n for k, n in pins.items() if k.endswith(f"/{o}")) for o in ("delivered", "handler_error")}
    dropped = {o: sum(n for k, n in pins.items() if k.endswith(f"/{o}"))
               for o in ("dropped_rate_limit", "dropped_queue_full", "dropped_fair_share")}
    dropped.update({f"unroutable_{reason}": n for reason, n in unroutable.items()})
    ovs = {k: ovs1[k] - ovs0[k] for k in ovs1}
    sent = ovs["controller_flow_packets"] - ovs["meter_band_dropped"]
    lost = delta(after, before, "ovs_lost/")
    policy_delivered = pins.get("policy/delivered", 0)
    audited = int(after.get("npaudit_audit_packet_ins_total", 0) - before.get("npaudit_audit_packet_ins_total", 0))
    return {
        "agent": {"received": received, "admitted": admitted, "dropped_by_reason": dropped,
                  "difference": received - sum(admitted.values()) - sum(dropped.values()),
                  "by_category": {k: v for k, v in pins.items() if v}},
        "ovs_vs_agent": {**ovs, "ovs_sent": sent, "lost_in_ovs": lost, "agent_received": received,
                         "difference": sent - sum(lost.values()) - received},
        "audit": {"policy_delivered": policy_delivered, "audit_pipeline_packet_ins": audited,
                  "difference": policy_delivered - audited,
                  "records_coarsened": int(after.get("npaudit_audit_records_coarsened_total", 0)
                                           - before.get("npaudit_audit_records_coarsened_total", 0))},
    }


def run(minutes: float, keys: int, meter_rate: int) -> dict[str, Any]:
    port = free_port()
    cluster = Cluster(extra_config=meters_section(meter_rate), metrics_listen=f"127.0.0.1:{port}")
    # No debug tap: a line per delivered packet-in would fill the disk in a long flood.
    cluster.config.write_text(cluster.config.read_text().replace(f"  tap: {cluster.tap}\n", "  tap: ''\n"))
    try:
        cluster.start(timeout=120)
        cluster.apply(MANIFESTS)
        xa, ya = cluster.add_pod("x", "a", server=False), cluster.add_pod("y", "a", server=False)
        if cluster.agent is None:
            raise RuntimeError("the agent is not running")
        agent = psutil.Process(cluster.agent.pid)
        before, ovs0 = settled(port), ovs_side(cluster)
        seconds = minutes * 60
        with RssSampler(agent.pid) as rss:
            rss_start, a0, t0 = agent.memory_info().rss, cpu(agent), time.monotonic()
            sent = send_flood(xa.netns, ya.ip, seconds, port=PORT, keys=keys)
            elapsed, a1 = time.monotonic() - t0, cpu(agent)
            after = settled(port)
        ovs1 = ovs_side(cluster)
        if cluster.agent.poll() is not None:
            raise RuntimeError(f"the agent exited during the soak:\n{cluster.log()[-3000:]}")
        acc = accounting(before, after, ovs0, ovs1)
        mb = [round(s / 2**20, 1) for s in rss.samples]
        per_minute = [max(mb[i:i + 60]) for i in range(0, len(mb), 60)]
        return {
            "seconds": round(elapsed, 1),
            "frames_sent": sent,
            "frames_sent_per_s": round(sent / elapsed),
            "packet_ins_ovs_sent_per_s": round(acc["ovs_vs_agent"]["ovs_sent"] / elapsed),
            "packet_ins_agent_received_per_s": round(acc["agent"]["received"] / elapsed),
            # Above 1: the sender outpaces OVS, so the packet-in rate is OVS's ceiling.
            "frames_sent_over_packet_ins_ovs_sent": (round(sent / acc["ovs_vs_agent"]["ovs_sent"], 2)
                                                     if acc["ovs_vs_agent"]["ovs_sent"] else None),
            "agent_cpu_percent": round(100 * (a1 - a0) / elapsed, 1),
            "rss_mb": {"start": round(rss_start / 2**20, 1), "max": max(mb), "end": mb[-1],
                       "max_per_minute": per_minute, "samples": len(mb)},
            "accounting": acc,
        }
    finally:
        cluster.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the flood (issue 14: 10)")
    ap.add_argument("--keys", type=int, default=256, help="source ports the flood comes from (audit keys)")
    ap.add_argument("--meter-rate", type=int, default=1_000_000,
                    help="policy_deny meter rate and burst, pps: far above OVS's packet-in ceiling")
    args = ap.parse_args()
    result = run(args.minutes, args.keys, args.meter_rate)
    acc = result["accounting"]
    print(json.dumps({
        "bench": "soak_flood",
        "machine": machine(),
        "minutes": args.minutes,
        "keys": args.keys,
        "meter_rate_pps": args.meter_rate,
        **result,
        "targets": {"rss_mb_max": RSS_TARGET_MB, "agent_difference": 0, "ovs_vs_agent_difference": 0},
        "targets_met": (result["rss_mb"]["max"] <= RSS_TARGET_MB and acc["agent"]["difference"] == 0
                        and acc["ovs_vs_agent"]["difference"] == 0),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
