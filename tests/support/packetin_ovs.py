"""A logged, metered policy rule on a private OVS and a sender of UDP through it, for the packet-in
integration tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import AsyncIterator

from packetin import messages
from packetin.channel import ChannelSettings, OpenFlowChannel
from packetin.demux import Demux
from packetin.model import Category, Disposition, Flags, PacketIn, Userdata
from tests.support.podnet import PodNet

RULE_ID = 0xC0FFEE01  # all 32 bits of reg6 matter
COOKIE = 0x0123456789ABCDEF  # os-ken reads only half of this; we must not
METER_POLICY = 7


def _in(ns: str, *cmd: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=timeout)


def send_udp(src: PodNet, dst: PodNet, port: int, count: int = 1, gap: float = 0.0) -> None:
    """`count` datagrams, `gap` seconds apart (a burst can overflow the veth's receive side
    in the netdev datapath on a busy host: lost before OVS counts them)."""
    code = (f"import socket, time\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for i in range({count}):\n"
            f"    s.sendto(b'npaudit%d' % i, ('{dst.ip}', {port}))\n"
            f"    time.sleep({gap})")
    _in(src.netns, sys.executable, "-c", code).check_returncode()


@contextlib.asynccontextmanager
async def connected(target: str, got: dict[int, list[PacketIn]]) -> AsyncIterator[tuple[OpenFlowChannel, Demux]]:
    demux = Demux()
    now = time.monotonic()
    for cat, sink in got.items():
        demux.subscribe(cat, sink.append, rate=10000, burst=10000, queue_size=10000, now=now)
    channel = OpenFlowChannel(ChannelSettings(target=target), demux.dispatch, on_malformed=demux.count_malformed)
    demux.start()
    channel.start()
    try:
        await channel.wait_ready(10)
        yield channel, demux
    finally:
        await channel.close()
        await demux.stop()


def logged_rule(a: PodNet, b: PodNet, disposition: Disposition, extra_match: dict) -> messages.FlowSpec:
    ud = Userdata(category=Category.POLICY, flags=int(Flags.LOG | Flags.REJECT), rule_id=RULE_ID)
    return messages.FlowSpec.make(0, 200, {"eth_type": 0x0800, "ipv4_src": a.ip, "ipv4_dst": b.ip, **extra_match}, [
        messages.SetField("reg7", int(disposition)), messages.SetField("reg6", RULE_ID),
        messages.Controller(reason=0, userdata=ud.encode(), meter_id=METER_POLICY)], cookie=COOKIE)
