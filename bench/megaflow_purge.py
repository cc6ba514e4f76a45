#!/usr/bin/env python3
"""What the datapath flow cache purge after each policy change costs (policy_agent/ovs/megaflows.py). Prints JSON.

A private OVS (userspace datapath) with two Pod namespaces; for each count N of
megaflows (0, 100, 1,000, 5,000) Pod a sends one UDP packet to each of N ports of
Pod b, every port with a flow of its own, so the datapath caches N megaflows;
then MegaflowCache.purge() (`revalidator/purge`, what the engine runs after each
committed change) is timed. Baselines measured in the same run, against the
same ovs-vswitchd: a no-op unixctl request (`version`) through the same client,
and the purge of an empty cache. What traffic pays afterwards (one upcall per
flow) shows as sending the N packets after a purge until all N megaflows are
back (polled through dpctl/dump-flows, whose own cost is in the number) against
sending the same N packets with their megaflows cached.

Run as root: `.venv/bin/python bench/megaflow_purge.py` (JSON on stdout, progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy_agent.ovs.coverage import vswitchd_ctl_path  # noqa: E402
from policy_agent.ovs.megaflows import MegaflowCache  # noqa: E402
from tests.support.bridge import BRIDGE, PrivateBridge, private_bridge  # noqa: E402
from tests.support.podnet import PodNet, create_pod, delete_pod, set_neighbor  # noqa: E402

FIRST_PORT = 10_000

# Sends one UDP datagram to argv[1] on each port argv[2]..argv[3]-1, paced so that the
# datapath's receive queue keeps every packet.
SENDER = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i, port in enumerate(range(int(sys.argv[2]), int(sys.argv[3]))):
    s.sendto(b"m", (sys.argv[1], port))
    if i % 50 == 49:
        time.sleep(0.001)
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ms(samples: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(samples) * 1000, 3), "max": round(max(samples) * 1000, 3),
            "n": len(samples)}


class Vswitchd:
    """The private OVS seen from the bench: flows by ovs-ofctl, megaflows and unixctl by ovs-appctl."""

    def __init__(self, env: PrivateBridge) -> None:
        self.env = env
        self.ctl = str(vswitchd_ctl_path(env.run_dir))

    def appctl(self, *args: str) -> str:
        return subprocess.run(["ovs-appctl", "-t", self.ctl, *args], capture_output=True, text=True,
                              check=True).stdout

    def megaflows(self) -> int:
        return sum(1 for line in self.appctl("dpctl/dump-flows").splitlines() if "udp" in line)

    def add_port_flows(self, a: PodNet, b: PodNet, n: int) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".flows") as f:
            f.write("".join(f"table=0,priority=100,in_port={a.ofport},udp,nw_dst={b.ip},tp_dst={FIRST_PORT + i},"
                            f"actions=output:{b.ofport}\n" for i in range(n)))
            f.flush()
            subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "add-flows", self.env.mgmt, f.name], check=True)


def send(a: PodNet, b: PodNet, n: int) -> None:
    subprocess.run(["ip", "netns", "exec", a.netns, sys.executable, "-c", SENDER, b.ip, str(FIRST_PORT),
                    str(FIRST_PORT + n)], check=True)


def wait_for(pred: Callable[[], bool], timeout: float, *, fail: bool = True) -> bool:
    start = time.perf_counter()
    while not pred():
        if time.perf_counter() - start > timeout:
            if fail:
                raise RuntimeError("timed out")
            return False
        time.sleep(0.0005)
    return True


def unixctl_version(ctl: str) -> None:
    from ovs.unixctl.client import UnixctlClient

    error, client = UnixctlClient.create(ctl)
    if error:
        raise RuntimeError(f"cannot open {ctl}")
    try:
        client.transact("version", [])
    finally:
        client.close()


def run(counts: list[int], repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {"counts": counts, "repeat": repeat}
    with private_bridge("npmf") as env:
        a = b = None
        try:
            a = create_pod(env.db, BRIDGE, netns=f"npmf-{env.tag}-a", host_if=f"npmf{env.tag}a",
                           ip_cidr="10.245.0.2/24", mac="02:00:0a:f5:00:02", ofport=1, ovs_netns=env.netns)
            b = create_pod(env.db, BRIDGE, netns=f"npmf-{env.tag}-b", host_if=f"npmf{env.tag}b",
                           ip_cidr="10.245.0.3/24", mac="02:00:0a:f5:00:03", ofport=2, ovs_netns=env.netns)
            set_neighbor(a, b)
            set_neighbor(b, a)
            ovs = Vswitchd(env)
            subprocess.run(["ovs-vsctl", f"--db={env.ovs.db_remote}", "set", "Open_vSwitch", ".",
                            "other_config:max-idle=60000"], check=True)  # megaflows stay until purged
            cache = MegaflowCache(env.run_dir)
            ovs.add_port_flows(a, b, max(counts))

            baseline = []
            for _ in range(repeat * 5):
                t = time.perf_counter()
                unixctl_version(ovs.ctl)
                baseline.append(time.perf_counter() - t)
            out["baseline_unixctl_version_ms"] = ms(baseline)

            purge: dict[str, Any] = {}
            for n in counts:
                samples, cached, refill, resend = [], [], [], []
                for _ in range(repeat):
                    t = time.perf_counter()
                    for _ in range(5):  # after a purge (or at first): every packet is an upcall
                        send(a, b, n)
                        if wait_for(lambda: ovs.megaflows() >= n, 2.0, fail=False):
                            break
                    else:
                        raise RuntimeError(f"{ovs.megaflows()} of {n} megaflows after sending 5 times")
                    refill.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    send(a, b, n)  # the same packets again, their megaflows cached
                    resend.append(time.perf_counter() - t)
                    cached.append(ovs.megaflows())
                    t = time.perf_counter()
                    cache.purge()
                    samples.append(time.perf_counter() - t)
                    if ovs.megaflows():
                        raise RuntimeError("megaflows left after a purge")
                purge[str(n)] = {"megaflows_cached": min(cached), "purge_ms": ms(samples),
                                 "send_all_and_cache_again_ms": ms(refill), "send_all_cached_ms": ms(resend)}
                log(f"{n} megaflows: purge p50 {purge[str(n)]['purge_ms']['p50']} ms")
            out["purge"] = purge

        finally:
            for pod in (a, b):
                if pod is not None:
                    delete_pod(env.db, BRIDGE, pod, ovs_netns=env.netns)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="0,100,1000,5000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(json.dumps(run([int(c) for c in args.counts.split(",")], args.repeat), indent=1))


if __name__ == "__main__":
    main()
