#!/usr/bin/env python3
"""vswitchd CPU and packets reaching OVS during a one-key flood, without and with an XDP offload entry. Prints JSON.

A private OVS (userspace datapath, own network namespace) with Pods a and b and
one flow sending every UDP packet to the controller (a logged Drop: the
expensive slow path). The XDP program is attached to a's host-side veth for
every phase; the phases alternate in one run on the same bridge and flood:

  no_entry    the flood's key is not in the map: every frame goes on to OVS
  with_entry  the key is cached with a token bucket of --sample-rate pps: XDP
              drops the rest before OVS's AF_PACKET socket sees them

"reached_ovs" is the flow's n_packets delta (without an entry it is below what
was sent: frames vswitchd did not read or handle in time never reach the flow);
"lost_before_xdp" the frames a's eth0 could not hand to its peer (the veth ring
was full). With an entry, xdp_dropped + xdp_passed = frames_sent - lost_before_xdp.
Run as root.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
from _bridge import FLOOD, bench_bridge, flow_packets, machine  # noqa: E402

from meters.ebpf.loader import XdpOffload  # noqa: E402
from meters.ebpf.maps import IPPROTO_UDP, OffloadCounts, OffloadKey, rule_until  # noqa: E402

FLOOD_DST_PORT = 5001  # what FLOOD sends to when every frame is the same key
RULE_ID = 4242


def settled_flow_packets(env: dict[str, Any]) -> int:
    # The revalidators push datapath counts to the flow table up to a second late.
    ctl = str(env["run_dir"] / "ovs-vswitchd.ctl")
    for _ in range(2):
        subprocess.run(["ovs-appctl", "-t", ctl, "revalidator/wait"], capture_output=True, check=True, timeout=30)
    return flow_packets(env["mgmt"])


def tx_dropped(netns: str) -> int:
    out = subprocess.run(["ip", "-n", netns, "-s", "-j", "link", "show", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(r'"tx":\{[^}]*"dropped":(\d+)', out).group(1))  # type: ignore[union-attr]


def run_phase(name: str, env: dict[str, Any], xdp: XdpOffload, key: OffloadKey, seconds: float,
              rate: float) -> dict[str, Any]:
    vswitchd = psutil.Process(env["ovs"].pid("ovs-vswitchd"))
    a = env["a"]
    before = settled_flow_packets(env)
    counts0 = xdp.counters().get(key, OffloadCounts())
    lost0 = tx_dropped(a.netns)
    v0, t0 = vswitchd.cpu_times(), time.monotonic()
    sent = int(subprocess.run(
        ["ip", "netns", "exec", a.netns, sys.executable, "-c", FLOOD, a.mac, env["b"].mac, a.ip, env["b"].ip,
         str(seconds), str(rate), "0"], capture_output=True, text=True, check=True).stdout)
    elapsed = time.monotonic() - t0
    v1 = vswitchd.cpu_times()
    time.sleep(0.5)  # let vswitchd finish what its socket already holds
    reached = settled_flow_packets(env) - before
    counts = xdp.counters().get(key, OffloadCounts())
    dropped = counts.dropped_packets - counts0.dropped_packets
    return {
        "phase": name,
        "seconds": round(elapsed, 3),
        "frames_sent": sent,
        "frames_sent_per_s": round(sent / elapsed),
        "lost_before_xdp": tx_dropped(a.netns) - lost0,
        "reached_ovs": reached,
        "reached_ovs_per_s": round(reached / elapsed),
        "xdp_dropped": dropped,
        "xdp_passed": counts.passed_packets - counts0.passed_packets,
        "xdp_drop_rate_pps": round(dropped / elapsed),
        "vswitchd_cpu_percent": round(100 * ((v1.user + v1.system) - (v0.user + v0.system)) / elapsed, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2, help="alternate no_entry/with_entry this many times")
    ap.add_argument("--rate", type=float, default=100000, help="flood frames/s the sender aims for")
    ap.add_argument("--sample-rate", type=int, default=100, help="the entry's token bucket: pps passed to OVS")
    args = ap.parse_args()

    xdp = XdpOffload.compile(max_entries=1024)
    phases = []
    try:
        with bench_bridge(copies=1) as env:
            a, b = env["a"], env["b"]
            ifindex = xdp.attach(a.host_if, env["ovs"].netns)
            key = OffloadKey.make(ifindex, a.ip, b.ip, IPPROTO_UDP, FLOOD_DST_PORT)
            for _ in range(args.rounds):
                xdp.delete(key)
                phases.append(run_phase("no_entry", env, xdp, key, args.seconds, args.rate))
                xdp.put(key, rule_until(RULE_ID, args.sample_rate, args.sample_rate, time.monotonic_ns(),
                                        int((args.seconds + 30) * 1e9)))
                phases.append(run_phase("with_entry", env, xdp, key, args.seconds, args.rate))
            xdp.detach(a.host_if, env["ovs"].netns)
    finally:
        xdp.close()

    def mean(phase: str, field: str) -> float:
        values = [p[field] for p in phases if p["phase"] == phase]
        return sum(values) / len(values)

    off, on = mean("no_entry", "vswitchd_cpu_percent"), mean("with_entry", "vswitchd_cpu_percent")
    print(json.dumps({
        "bench": "xdp_offload",
        "machine": machine(),
        "rate_target_pps": args.rate,
        "sample_rate_pps": args.sample_rate,
        "phases": phases,
        "vswitchd_cpu_percent": {"no_entry": round(off, 1), "with_entry": round(on, 1)},
        "vswitchd_cpu_ratio_no_entry_over_with_entry": round(off / on, 2) if on else None,
        "reached_ovs_per_s": {"no_entry": round(mean("no_entry", "reached_ovs_per_s")),
                              "with_entry": round(mean("with_entry", "reached_ovs_per_s"))},
        "xdp_drop_rate_pps": round(mean("with_entry", "xdp_drop_rate_pps")),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
