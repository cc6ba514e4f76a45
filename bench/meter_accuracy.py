#!/usr/bin/env python3
"""OVS meter accuracy on the real netdev datapath: delivered packet-ins/s against the configured rate. Prints JSON.

A private OVS (userspace datapath, own network namespace) with Pods a and b and
one flow sending every UDP packet to the controller through meter 1 (a logged
rule's controller copy, as the agent installs it). For each configured rate
(10, 100, 1,000, 10,000 pps; burst rate/5) Pod a floods at twice that rate.
After a warm-up that empties the burst, a steady-state window counts:

  delivered_pps   packet-ins the agent's OpenFlow channel received, per second
  ratio           delivered_pps / configured rate (issue 10: within 0.98 .. 1.02)
  offered_pps     packets that reached the meter (its packet_in_count), per second:
                  the flood actually achieved in the same window, which must stay
                  above the rate for the ratio to mean anything
  meter_passed_pps  offered minus the band's drops, per second (what OVS emitted)
  lost_in_ovs_rconn_overflow  packet-ins OVS dropped after the meter

Run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge import bench_bridge, coverage, machine  # noqa: E402

from packetin import messages as m  # noqa: E402
from packetin.channel import ChannelSettings, OpenFlowChannel  # noqa: E402
from packetin.model import Category, Disposition, Userdata  # noqa: E402
from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_UDP  # noqa: E402
from packetin.registers import REG_DISPOSITION_FIELD  # noqa: E402

METER_ID = 1
RULE_ID = 4343

# Paced raw sender: argv src_mac dst_mac src dst seconds rate; frames go out in chunks of about 1 ms of traffic
# (one frame per chunk at low rates), so the meter sees a steady stream, not bursts. Prints frames sent.
SENDER = r"""
import socket, struct, sys, time
src_mac, dst_mac, src, dst, seconds, rate = sys.argv[1:7]
rate = float(rate)
mac = lambda s: bytes(int(x, 16) for x in s.split(':'))
payload = b'x' * 64
udp = struct.pack('!HHHH', 40000, 5001, 8 + len(payload), 0) + payload
hdr = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                  socket.inet_aton(src), socket.inet_aton(dst))
frame = mac(dst_mac) + mac(src_mac) + b'\x08\x00' + hdr + udp
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
chunk = max(1, int(rate / 1000))
n, start = 0, time.monotonic()
end = start + float(seconds)
while True:
    now = time.monotonic()
    if now >= end:
        break
    ahead = n / rate - (now - start)
    if ahead > 0:
        time.sleep(ahead)
    for _ in range(chunk):
        s.send(frame)
    n += chunk
print(n)
"""


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, batch: list[Any], now: float) -> None:
        self.n += len(batch)


async def meter_counts(channel: OpenFlowChannel) -> tuple[int, int]:
    """(packets that reached meter 1, packets its band dropped)."""
    for raw in await channel.multipart(m.meter_stats_request()):
        for stats in m.parse(raw).body:
            if stats.meter_id == METER_ID:
                return stats.packet_in_count, sum(b.packet_band_count for b in stats.band_stats)
    raise RuntimeError(f"meter {METER_ID} not in the meter statistics")


async def measure(env: dict[str, Any], channel: OpenFlowChannel, counter: Counter, rate: int,
                  warmup: float, window: float) -> dict[str, Any]:
    burst = max(1, rate // 5)
    await channel.install_meters([m.MeterSpec(METER_ID, rate_pps=rate, burst=burst)])
    a, b = env["a"], env["b"]
    offered_target = 2 * rate
    sender = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", a.netns, sys.executable, "-c", SENDER, a.mac, b.mac, a.ip, b.ip,
        str(warmup + window + 1.0), str(offered_target), stdout=subprocess.PIPE)
    await asyncio.sleep(warmup)  # the burst drains at (offered - rate) pps long before this ends
    in0, drop0 = await meter_counts(channel)
    c0, overflow0, t0 = counter.n, coverage(env["ovs"], "rconn_overflow"), time.monotonic()
    await asyncio.sleep(window)
    in1, drop1 = await meter_counts(channel)
    c1, t1 = counter.n, time.monotonic()
    overflow = coverage(env["ovs"], "rconn_overflow") - overflow0
    sent = int((await sender.communicate())[0])
    await asyncio.sleep(0.5)  # quiet before the next rate
    span = t1 - t0
    delivered = (c1 - c0) / span
    return {
        "rate_pps": rate,
        "burst": burst,
        "window_seconds": round(span, 3),
        "offered_target_pps": offered_target,
        "offered_pps": round((in1 - in0) / span, 1),
        "meter_passed_pps": round(((in1 - in0) - (drop1 - drop0)) / span, 2),
        "delivered_pps": round(delivered, 2),
        "ratio": round(delivered / rate, 4),
        "lost_in_ovs_rconn_overflow": overflow,
        "frames_sent": sent,
    }


async def run(env: dict[str, Any], rates: list[int], warmup: float, min_packets: int) -> list[dict[str, Any]]:
    counter = Counter()
    channel = OpenFlowChannel(ChannelSettings(target=env["targets"]["tcp"], netns=env["ovs"].netns), counter)
    channel.start()
    await channel.wait_ready(10)
    try:
        ud = Userdata(category=Category.POLICY, flags=1, rule_id=RULE_ID).encode()
        await channel.install_meters([m.MeterSpec(METER_ID, rate_pps=rates[0], burst=1)])
        await channel.install_flows([m.FlowSpec.make(0, 200, {"eth_type": ETH_TYPE_IPV4, "ip_proto": IPPROTO_UDP}, [
            m.SetField(REG_DISPOSITION_FIELD, int(Disposition.DROP)), m.Controller(0, ud, meter_id=METER_ID)])])
        # Long enough for min_packets at the rate (e.g. 200 packets: ±0.5% from a packet at either edge).
        return [await measure(env, channel, counter, rate, warmup, max(5.0, min_packets / rate)) for rate in rates]
    finally:
        await channel.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10,100,1000,10000", help="configured meter rates, pps, comma-separated")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of flood before the window (burst excluded)")
    ap.add_argument("--min-packets", type=int, default=200, help="packet-ins a window must expect at its rate")
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    with bench_bridge(copies=1) as env:
        results = asyncio.run(run(env, rates, args.warmup, args.min_packets))
    print(json.dumps({
        "bench": "meter_accuracy",
        "machine": machine(),
        "target": "ratio within 0.98 .. 1.02 with offered_pps above rate_pps",
        "rates": results,
        "ratio_by_rate": {str(r["rate_pps"]): r["ratio"] for r in results},
        "within_2_percent": {str(r["rate_pps"]): abs(r["ratio"] - 1) <= 0.02 and r["offered_pps"] > r["rate_pps"]
                             for r in results},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
