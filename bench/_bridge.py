"""Shared by the benches: a private OVS with two Pod namespaces, a flood generator, measured phases.

Each phase runs one consumer process (pinned to CPU 1 by default, vswitchd and
the niced generator on CPU 0), floods for a while and reports what OVS emitted
(flow n_packets), what it lost (rconn_overflow), what the consumer counted, and
the CPU each used. Root only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from packetin import messages as m  # noqa: E402
from packetin.gctune import settle_heap  # noqa: E402
from packetin.model import Category, Disposition, Userdata  # noqa: E402
from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_UDP  # noqa: E402
from packetin.registers import REG_DISPOSITION_FIELD, REG_RULE_ID_FIELD  # noqa: E402
from policy_agent.ovs.embedded import EmbeddedOvs  # noqa: E402
from policy_agent.ovs.coverage import CoverageReader  # noqa: E402
from tests.support.bridge import BRIDGE, private_bridge  # noqa: E402
from tests.support.podnet import create_pod, delete_pod, set_neighbor  # noqa: E402

RULE_ID = 4242


FLOOD = """
import socket, struct, sys, time
src_mac, dst_mac, src, dst, seconds, rate, distinct = sys.argv[1:8]
rate = float(rate)
distinct = distinct == "1"
mac = lambda s: bytes(int(x, 16) for x in s.split(':'))
ip = socket.inet_aton
payload = b'x' * 64
udp = struct.pack('!HHHH', 40000, 5001, 8 + len(payload), 0) + payload
hdr = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, ip(src), ip(dst))
frame = mac(dst_mac) + mac(src_mac) + b'\\x08\\x00' + hdr + udp
# distinct: every frame a new audit key, so vary the UDP destination port (bytes 36..37)
head, tail = frame[:36], frame[38:]
frames = [head + struct.pack('!H', 1024 + i) + tail for i in range(64000)] if distinct else [frame] * 64
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
    for i in range(64):
        send(frames[(n + i) % len(frames)])
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


def run_phase(script: str, kind: str, env: dict, seconds: float, distinct: bool = False,
              extra: tuple[str, ...] = ()) -> dict:
    """One measured flood with consumer `kind` (run as `script --consumer kind ...`)."""
    ovs: EmbeddedOvs = env["ovs"]
    proc = subprocess.Popen([sys.executable, script, "--consumer", kind, "--target", env["target"],
                             "--netns", env["ovs"].netns, *extra],
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
         env["a"].mac, env["b"].mac, env["a"].ip, env["b"].ip, str(seconds), str(env["rate"]),
         "1" if distinct else "0"],
        capture_output=True, text=True, check=True).stdout)
    elapsed = time.monotonic() - t0
    c1, v1 = ps.cpu_times(), vswitchd.cpu_times()
    time.sleep(1.0)  # let the consumer drain what OVS already queued
    emitted = (flow_packets(env["mgmt"]) - before) * env["copies"]
    overflow = coverage(ovs, "rconn_overflow") - overflow0
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    counts = json.loads(out.strip().splitlines()[-1])
    extra_counts = {k: v for k, v in counts.items() if k not in ("delivered", "decoded")}
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
        **extra_counts,
    }


@contextlib.contextmanager
def bench_bridge(copies: int, distinct_rules: bool = False) -> Iterator[dict[str, Any]]:
    """A private OVS, Pods a and b, and one flow sending every UDP packet from a to the
    controller (`copies` controller actions); a unix and a TCP controller side by side
    (one consumer connects at a time). With `distinct_rules` the copies carry rule ids
    RULE_ID, RULE_ID+1, ... (as if a packet met that many logged rules), so that each
    copy is a different audit key. Yields the env run_phase takes; cleans up."""
    with private_bridge("npab", extra_controllers=("ptcp:6653:127.0.0.1",)) as env:
        pods = []
        try:
            for i, name in ((1, "a"), (2, "b")):
                pods.append(create_pod(env.db, BRIDGE, netns=f"npab-{env.tag}-{name}", host_if=f"npb{env.tag}{i}",
                                       ip_cidr=f"10.244.9.{i + 1}/24", mac=f"02:00:0a:f4:09:{i + 1:02x}",
                                       ofport=i, ovs_netns=env.netns))
            a, b = pods
            set_neighbor(a, b)
            asyncio.run(_install_flood_rule(env.target, copies, distinct_rules))
            yield {"ovs": env.ovs, "targets": {"unix": env.target, "tcp": "tcp:127.0.0.1:6653"},
                   "mgmt": env.mgmt, "a": a, "b": b, "copies": copies, "run_dir": env.run_dir}
        finally:
            for pod in pods:
                delete_pod(None, BRIDGE, pod, ovs_netns=env.netns)


async def _install_flood_rule(target: str, copies: int, distinct_rules: bool) -> None:
    """Every UDP packet to the controller `copies` times; the flow stays after the channel
    closes (fail_mode=secure)."""
    from packetin.channel import ChannelSettings, OpenFlowChannel

    actions: list[Any] = [m.SetField(REG_DISPOSITION_FIELD, int(Disposition.DROP))]
    for rule_id in ([RULE_ID + i for i in range(copies)] if distinct_rules else [RULE_ID] * copies):
        ud = Userdata(category=Category.POLICY, flags=1, rule_id=rule_id).encode()
        actions += [m.SetField(REG_RULE_ID_FIELD, rule_id), m.Controller(0, ud)]
    flow = m.FlowSpec.make(0, 100, {"eth_type": ETH_TYPE_IPV4, "ip_proto": IPPROTO_UDP}, actions)
    ch = OpenFlowChannel(ChannelSettings(target=target), lambda b, n: None)
    ch.start()
    await ch.wait_ready(10)
    await ch.install_flows([flow])
    await ch.close()


@contextlib.asynccontextmanager
async def consumer_path(target: str, netns: str, handler: Any,
                        queue_size: int = 1 << 20, fair: Any = None) -> AsyncIterator[tuple[Any, Any]]:
    """The agent's packet-in path into `handler`: channel -> decode -> demux (by default a
    queue big enough that nothing is dropped) -> handler, connected and the heap settled as
    the agent does; yields (channel, demux), closes both on the way out (the demux drains)."""
    from packetin.channel import ChannelSettings, OpenFlowChannel
    from packetin.demux import INLINE_MAX, Demux

    demux = Demux(inline_max=INLINE_MAX)  # as the agent's
    demux.subscribe(Category.POLICY, handler, rate=1e9, burst=1e9, queue_size=queue_size, now=time.monotonic(),
                    fair=fair)
    channel = OpenFlowChannel(ChannelSettings(target=target, netns=netns), demux.dispatch,
                              on_malformed=demux.count_malformed)
    demux.start()
    channel.start()
    try:
        await channel.wait_ready(10)
        settle_heap()  # as the agent does once it has started
        yield channel, demux
    finally:
        await channel.close()
        await demux.stop()


async def until_sigterm(demux: Any) -> dict[str, int]:
    """Say "ready" to run_phase, wait for its SIGTERM, let the demux empty; its policy counts."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await demux.wait_idle()
    return demux.stats()[Category.POLICY]


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "ovs": subprocess.run(
        ["ovs-vswitchd", "--version"], capture_output=True, text=True).stdout.splitlines()[0]}


def print_report(benchmark: str, args: Any, phases: list[dict], summary: dict, work: Path) -> None:
    """The bench's JSON on stdout (settings from its flood arguments), then its work directory removed."""
    print(json.dumps({"benchmark": benchmark, "machine": machine(),
                      "settings": {"seconds": args.seconds, "rounds": args.rounds, "copies": args.copies,
                                   "offered_frames_per_s": args.rate, "pinned": args.pin},
                      "phases": phases, "summary": summary}, indent=2))
    subprocess.run(["rm", "-rf", str(work)])
