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
import warnings
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from packetin import messages as m  # noqa: E402
from packetin.model import Category, Disposition, Userdata  # noqa: E402
from policy_agent.ovs_embedded import EmbeddedOvs  # noqa: E402
from policy_agent.ovs_stats import CoverageReader  # noqa: E402
from policy_agent.ovsdb import Ovsdb  # noqa: E402
from policy_agent.podnet import create_pod, delete_pod, set_neighbor  # noqa: E402

BRIDGE = "br-int"
RULE_ID = 4242


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
    from packetin.channel import ChannelSettings, OpenFlowChannel
    from packetin.demux import Demux

    async def main() -> None:
        demux = Demux()
        demux.subscribe(Category.POLICY, lambda pin: None, rate=1e9, burst=1e9,
                        queue_size=1 << 20, now=time.monotonic())
        channel = OpenFlowChannel(ChannelSettings(target=target, netns=netns), demux.dispatch,
                                  on_malformed=demux.count_malformed)
        demux.start()
        channel.start()
        await channel.wait_ready(10)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        await demux.wait_idle()
        stats = demux.stats()[Category.POLICY]
        await channel.close()
        await demux.stop()
        print(json.dumps({"delivered": stats["delivered"], "decoded": channel.packet_ins,
                          "dropped": stats["dropped_rate_limit"] + stats["dropped_queue_full"]}), flush=True)

    asyncio.run(main())


# --- the run -----------------------------------------------------------------------


FLOOD = """
import socket, struct, sys, time
src_mac, dst_mac, src, dst, seconds, rate = sys.argv[1:7]
rate = float(rate)
mac = lambda s: bytes(int(x, 16) for x in s.split(':'))
ip = socket.inet_aton
payload = b'x' * 64
udp = struct.pack('!HHHH', 40000, 5001, 8 + len(payload), 0) + payload
hdr = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, ip(src), ip(dst))
frame = mac(dst_mac) + mac(src_mac) + b'\\x08\\x00' + hdr + udp
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
send = s.send
n = 0
start = time.monotonic()
end = start + float(seconds)
while True:
    now = time.monotonic()
    if now >= end:
        break
    ahead = n / rate - (now - start)  # paced: never more than `rate` frames/s
    if ahead > 0:
        time.sleep(ahead)
    for _ in range(64):
        send(frame)
    n += 64
print(n)
"""


def flow_packets(mgmt: str) -> int:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-flows", mgmt, "udp"],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(x) for x in re.findall(r"n_packets=(\d+)", out))


def coverage(ovs: EmbeddedOvs, name: str) -> int:
    value = CoverageReader(ovs.run_dir).read((name,))[name]
    return -1 if value is None else value


def pin_process(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a process (sched_setaffinity is per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


def run_phase(kind: str, env: dict, seconds: float) -> dict:
    ovs: EmbeddedOvs = env["ovs"]
    proc = subprocess.Popen([sys.executable, __file__, "--consumer", kind, "--target", env["target"],
                             "--netns", env["ovs"].netns],
                            stdout=subprocess.PIPE, text=True)
    if env["pin"]:
        # Consumer alone on CPU 1; vswitchd (and the niced generator) on CPU 0. Each
        # side then gets one whole core and the run-to-run noise of a shared core is gone.
        pin_process(proc.pid, {1})
        pin_process(ovs.pid("ovs-vswitchd"), {0})
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{kind} consumer did not start")
    time.sleep(0.3)
    ps = psutil.Process(proc.pid)
    vswitchd = psutil.Process(ovs.pid("ovs-vswitchd"))
    before = flow_packets(env["mgmt"])
    overflow0 = coverage(ovs, "rconn_overflow")
    c0, v0, t0 = ps.cpu_times(), vswitchd.cpu_times(), time.monotonic()
    sent = int(subprocess.run(
        # The generator runs at the lowest priority so it takes only the CPU that
        # vswitchd and the consumer leave (2 cores for all three).
        (["taskset", "-c", "0"] if env["pin"] else []) + ["nice", "-n", "19", "ip", "netns", "exec", env["a"].netns, sys.executable, "-c", FLOOD,
         env["a"].mac, env["b"].mac, env["a"].ip, env["b"].ip, str(seconds), str(env["rate"])],
        capture_output=True, text=True, check=True).stdout)
    elapsed = time.monotonic() - t0
    c1, v1 = ps.cpu_times(), vswitchd.cpu_times()
    time.sleep(1.0)  # let the consumer drain what OVS already queued
    emitted = (flow_packets(env["mgmt"]) - before) * env["copies"]
    overflow = coverage(ovs, "rconn_overflow") - overflow0
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    counts = json.loads(out.strip().splitlines()[-1])
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    vcpu = (v1.user + v1.system) - (v0.user + v0.system)
    return {
        "consumer": kind,
        "seconds": round(elapsed, 3),
        "frames_sent": sent,
        "ovs_emitted": emitted,
        "ovs_emitted_per_s": round(emitted / elapsed),
        "delivered": counts["delivered"],
        "delivered_per_s": round(counts["delivered"] / elapsed),
        "delivered_ratio": round(counts["delivered"] / emitted, 4) if emitted else None,
        "lost_in_ovs_rconn_overflow": overflow,
        "consumer_cpu_percent": round(100 * cpu / elapsed, 1),
        "vswitchd_cpu_percent": round(100 * vcpu / elapsed, 1),
    }


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

    tag = secrets.token_hex(3)
    run_dir = Path(tempfile.mkdtemp(prefix=f"npab-{tag}-", dir="/tmp"))
    ovs = EmbeddedOvs(run_dir, netns=f"npab-{tag}")
    pods = []
    db = None
    try:
        ovs.up()
        db = Ovsdb(ovs.db_remote)
        db.ensure_bridge(BRIDGE, "netdev")
        # Both controllers exist side by side; only one consumer is connected at a time.
        unix_path = run_dir / f"{BRIDGE}.npaudit"
        db.ensure_controller(BRIDGE, f"punix:{unix_path}", 512)
        db.ensure_controller(BRIDGE, "ptcp:6653:127.0.0.1", 512)
        db.wait_socket(unix_path)
        targets = {"unix": str(unix_path), "tcp": "tcp:127.0.0.1:6653"}
        target = targets["unix"]
        a = create_pod(db, BRIDGE, netns=f"npab-{tag}-a", host_if=f"npb{tag}1", ip_cidr="10.244.9.2/24",
                       mac="02:00:0a:f4:09:02", ofport=1, ovs_netns=ovs.netns)
        pods.append(a)
        b = create_pod(db, BRIDGE, netns=f"npab-{tag}-b", host_if=f"npb{tag}2", ip_cidr="10.244.9.3/24",
                       mac="02:00:0a:f4:09:03", ofport=2, ovs_netns=ovs.netns)
        pods.append(b)
        set_neighbor(a, b)
        ud = Userdata(category=Category.POLICY, flags=1, rule_id=RULE_ID).encode()
        flow = m.FlowSpec.make(0, 100, {"eth_type": 0x0800, "ip_proto": 17}, [
            m.SetField("reg7", int(Disposition.DROP)), m.SetField("reg6", RULE_ID),
            *[m.Controller(0, ud)] * args.copies])
        mgmt = f"unix:{run_dir / (BRIDGE + '.mgmt')}"
        # Install through a short-lived channel (flows stay: fail_mode=secure).
        from packetin.channel import ChannelSettings, OpenFlowChannel

        async def install() -> None:
            ch = OpenFlowChannel(ChannelSettings(target=target), lambda b, n: None)
            ch.start()
            await ch.wait_ready(10)
            await ch.install_flows([flow])
            await ch.close()

        asyncio.run(install())
        transports = ["tcp", "unix"] if args.transport == "both" else [args.transport]
        phases = []
        summary = {}
        for transport in transports:
            env = {"ovs": ovs, "target": targets[transport], "mgmt": mgmt, "a": a, "b": b,
                   "rate": args.rate, "copies": args.copies, "pin": args.pin}
            ran = []
            for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both
                ran.append(run_phase("raw", env, args.seconds))
                ran.append(run_phase("agent", env, args.seconds))
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
            "machine": {"cpus": os.cpu_count(), "ovs": subprocess.run(
                ["ovs-vswitchd", "--version"], capture_output=True, text=True).stdout.splitlines()[0]},
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
    finally:
        for pod in pods:
            delete_pod(None, BRIDGE, pod, ovs_netns=ovs.netns)
        if db is not None:
            db.close()
        ovs.down(purge=True)
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
