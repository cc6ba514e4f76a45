#!/usr/bin/env python3
"""Packet-ins/s OVS emits vs packet-ins/s the agent decodes and delivers, in one run. Prints JSON.

A private OVS (userspace datapath, own network namespace) gets a flood of UDP
frames from a Pod namespace; one flow loads reg7/reg6 and sends every packet to
the controller (no meter: this measures the ceiling). Two consumers take turns
on the same bridge and the same flood:

  baseline  a raw socket reader that only frames messages (the cheapest consumer
            Python can be: what OVS can emit to a controller on this machine)
  agent     OpenFlowChannel + Demux + a no-op subscriber (the real hot path)

"emitted" is the flow's n_packets delta (every packet the flow sent to the
controller), "lost in OVS" is the rconn_overflow coverage delta (packet-ins OVS
dropped because its queue to us was full). Run as root: `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge import bench_bridge, consumer_path, machine, run_phase, until_sigterm  # noqa: E402

from packetin import messages as m  # noqa: E402


# --- consumers (run as subprocesses so their CPU is measured alone) ----------------


def consume_raw(target: str, netns: str) -> None:
    """Baseline: handshake by hand, then only frame and count packet-ins."""
    if target.startswith("tcp:"):
        from packetin.netns_socket import socket_in_netns

        s = socket_in_netns(netns)
        host, _, port = target[4:].rpartition(":")
        s.connect((host, int(port)))
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(target)
    for msg in (m.hello(), m.set_config(), m.set_packet_in_format_nxt2()):
        s.sendall(m.serialize(msg, 1))
    count = 0
    buf = b""
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    s.settimeout(0.2)
    print("ready", flush=True)
    while not stop:
        try:
            data = s.recv(1 << 20)
        except socket.timeout:
            continue
        if not data:
            break
        buf += data
        off, end = 0, len(buf)
        while end - off >= 8:
            length = (buf[off + 2] << 8) | buf[off + 3]
            if end - off < length:
                break
            if buf[off + 1] == 4:
                count += 1
            elif buf[off + 1] == 2:  # echo request: answer, or OVS drops us
                s.sendall(bytes([buf[off], 3]) + buf[off + 2:off + length])
            off += length
        buf = buf[off:]
    print(json.dumps({"delivered": count, "decoded": count}), flush=True)


def consume_agent(target: str, netns: str) -> None:
    """The real path: channel -> decode -> demux -> token bucket -> channel -> no-op handler."""
    async def main() -> None:
        async with consumer_path(target, netns, lambda pin: None) as (channel, demux):
            stats = await until_sigterm(demux)
        print(json.dumps({"delivered": stats["delivered"], "decoded": channel.packet_ins,
                          "dropped": stats["dropped_rate_limit"] + stats["dropped_queue_full"]}), flush=True)

    asyncio.run(main())


# --- the run -----------------------------------------------------------------------


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2, help="alternate baseline/agent this many times")
    ap.add_argument("--copies", type=int, default=4,
                    help="controller actions per flow: >1 makes OVS emit more packet-ins per upcall")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin vswitchd+generator to CPU 0 and the consumer to CPU 1")
    ap.add_argument("--rate", type=float, default=60000,
                    help="frames/s offered; x copies must exceed the OVS ceiling")
    ap.add_argument("--consumer", choices=["raw", "agent"], help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--netns", default="", help=argparse.SUPPRESS)
    ap.add_argument("--transport", choices=["unix", "tcp", "both"], default="both",
                    help="controller socket: punix in the run dir, ptcp on 127.0.0.1 of the OVS netns "
                         "(the agent's default for the embedded OVS), or both in turn")
    args = ap.parse_args()
    if args.consumer:
        (consume_raw if args.consumer == "raw" else consume_agent)(args.target, args.netns)
        return 0
    if os.geteuid() != 0:
        print("bench needs root (network namespaces, OVS)", file=sys.stderr)
        return 2

    with bench_bridge(args.copies) as bridge:
        transports = ["tcp", "unix"] if args.transport == "both" else [args.transport]
        phases = []
        summary = {}
        for transport in transports:
            env = {**bridge, "target": bridge["targets"][transport], "rate": args.rate, "pin": args.pin}
            ran = []
            for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both
                ran.append(run_phase(__file__, "raw", env, args.seconds))
                ran.append(run_phase(__file__, "agent", env, args.seconds))
            for p in ran:
                p["transport"] = transport
            phases += ran
            base = [p for p in ran if p["consumer"] == "raw"]
            agent = [p for p in ran if p["consumer"] == "agent"]
            ceiling = max(p["ovs_emitted_per_s"] for p in base)
            summary[transport] = {
                "ovs_ceiling_per_s": ceiling,
                "baseline_delivered_per_s": max(p["delivered_per_s"] for p in base),
                "agent_delivered_per_s": max(p["delivered_per_s"] for p in agent),
                "agent_vs_ceiling": round(max(p["delivered_per_s"] for p in agent) / ceiling, 4),
                "agent_delivered_ratio_of_emitted_worst": min(p["delivered_ratio"] or 0 for p in agent),
                "agent_cpu_percent_mean": round(sum(p["consumer_cpu_percent"] for p in agent) / len(agent), 1),
                "lost_in_ovs_with_agent": sum(p["lost_in_ovs_rconn_overflow"] for p in agent),
            }
        result = {
            "benchmark": "packetin_throughput",
            "machine": machine(),
            "settings": {"seconds": args.seconds, "rounds": args.rounds, "offered_frames_per_s": args.rate,
                         "packet_ins_per_frame": args.copies,
                         "pinned": args.pin},
            "phases": phases,
            "summary": summary,
            "target": "agent_vs_ceiling >= 0.90 (ceiling: best packet-ins/s OVS emitted to the baseline "
                      "consumer in the same run)",
        }
        print(json.dumps(result, indent=2))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
