"""`npaudit demo`: the foundation end to end on a private OVS with real packets.

Two Pod namespaces on a private userspace bridge; hand-written logged flows
stand in for compiled policy (the compiler is issue 3, audit records issue 4):
ICMP a->b is allowed and logged, TCP a->b:80 is dropped and logged, UDP a->b:9
is a traceflow-category copy. Each packet-in is printed live as a JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time

from packetin import messages as m
from packetin.model import Category, Disposition, Flags, Userdata
from policy_agent import config as config_mod
from policy_agent.agent import Agent
from policy_agent.podnet import PodNet, create_pod, delete_pod, set_neighbor
from policy_agent.tap import JsonTap

log = logging.getLogger("npaudit.demo")

RUN_DIR = "/var/run/npaudit/demo"
OVS_NETNS = "npaudit-demo-ovs"
METER_ALLOW, METER_DROP, METER_TRACEFLOW = 1, 2, 3
RULE_ALLOW_ICMP, RULE_DROP_HTTP = 1000, 1001


def demo_flows(a: PodNet, b: PodNet) -> tuple[list[m.MeterSpec], list[m.FlowSpec]]:
    meters = [m.MeterSpec(METER_ALLOW, rate_pps=100, burst=20),
              m.MeterSpec(METER_DROP, rate_pps=100, burst=20),
              m.MeterSpec(METER_TRACEFLOW, rate_pps=10, burst=5)]
    ip_ab = {"eth_type": 0x0800, "ipv4_src": a.ip, "ipv4_dst": b.ip}

    def logged(rule: int, disp: Disposition, meter: int) -> list[m.Action]:
        flags = Flags.LOG | (Flags.REJECT if disp == Disposition.REJECT else 0)
        ud = Userdata(category=Category.POLICY, flags=int(flags), rule_id=rule).encode()
        return [m.SetField("reg7", int(disp)), m.SetField("reg6", rule), m.Controller(0, ud, meter)]

    flows = [
        m.FlowSpec.make(0, 200, {**ip_ab, "ip_proto": 6, "tcp_dst": 80},
                        logged(RULE_DROP_HTTP, Disposition.DROP, METER_DROP)),
        m.FlowSpec.make(0, 150, {**ip_ab, "ip_proto": 1},
                        [*logged(RULE_ALLOW_ICMP, Disposition.ALLOW, METER_ALLOW), m.Output(b.ofport)]),
        m.FlowSpec.make(0, 140, {**ip_ab, "ip_proto": 17, "udp_dst": 9}, [
            m.Controller(1, Userdata(category=Category.TRACEFLOW).encode(), METER_TRACEFLOW),
            m.Output(b.ofport)]),
        m.FlowSpec.make(0, 10, {"in_port": a.ofport}, [m.Output(b.ofport)]),
        m.FlowSpec.make(0, 10, {"in_port": b.ofport}, [m.Output(a.ofport)]),
    ]
    return meters, flows


def _traffic(a: PodNet, b: PodNet) -> None:
    def inside(ns: str, *cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, timeout=10)

    log.info("ping %s -> %s (allowed, logged)", a.ip, b.ip)
    inside(a.netns, "ping", "-c", "3", "-i", "0.2", "-W", "1", b.ip)
    log.info("TCP %s -> %s:80 (dropped, logged)", a.ip, b.ip)
    inside(a.netns, sys.executable, "-c",
           f"import socket; s=socket.socket(); s.settimeout(1.5)\n"
           f"try: s.connect(('{b.ip}', 80))\nexcept OSError: pass")
    log.info("UDP %s -> %s:9 (traceflow copy)", a.ip, b.ip)
    inside(a.netns, sys.executable, "-c",
           f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('{b.ip}', 9))")


def run_demo(duration: float = 0.0, keep: bool = False) -> int:
    cfg = config_mod.AgentConfig(
        ovs=config_mod.OvsConfig(run_dir=RUN_DIR, netns=OVS_NETNS),
        metrics=config_mod.MetricsConfig(listen=""),
    )
    tap = JsonTap(sys.stdout)
    agent = Agent(cfg, {Category.POLICY: tap, Category.TRACEFLOW: tap})

    async def main() -> None:
        await agent.start()
        db = agent.ovsdb
        if db is None:
            raise RuntimeError("agent started without an OVSDB connection")
        pods: list[PodNet] = []
        try:
            a = await asyncio.to_thread(create_pod, db, cfg.ovs.bridge, netns="npaudit-demo-a",
                                        host_if="npd-a", ip_cidr="10.244.0.2/24",
                                        mac="02:00:0a:f4:00:02", ofport=1, ovs_netns=OVS_NETNS)
            pods.append(a)
            b = await asyncio.to_thread(create_pod, db, cfg.ovs.bridge, netns="npaudit-demo-b",
                                        host_if="npd-b", ip_cidr="10.244.0.3/24",
                                        mac="02:00:0a:f4:00:03", ofport=2, ovs_netns=OVS_NETNS)
            pods.append(b)
            set_neighbor(a, b)
            set_neighbor(b, a)
            meters, flows = demo_flows(a, b)
            await agent.channel.install_meters(meters)
            await agent.channel.install_flows(flows)
            log.info("installed %d meters and %d flows (meters %s); packet-ins follow as JSON lines",
                     len(meters), len(flows),
                     "supported" if agent.channel.meter_support and agent.channel.meter_support.supported
                     else "NOT supported")
            await asyncio.to_thread(_traffic, a, b)
            await asyncio.sleep(0.5 + duration)
            await agent.demux.wait_idle()
            log.info("packet-in counts per category: %s", json.dumps(agent.demux.stats()))
        finally:
            await agent.stop()
            if not keep:
                for pod in pods:
                    delete_pod(None, cfg.ovs.bridge, pod, ovs_netns=OVS_NETNS)
                if agent.embedded is not None:
                    agent.embedded.down()

    start = time.monotonic()
    asyncio.run(main())
    log.info("demo finished in %.1fs%s", time.monotonic() - start,
             " (left running: npaudit ovs down --run-dir " + RUN_DIR + ")" if keep else "")
    return 0
