"""Packet-ins from real packets on a real OVS bridge arrive typed, demultiplexed and metered."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import time

from packetin import messages
from packetin.demux import DELIVERED, RECEIVED, Demux
from packetin.model import Category, Disposition, Flags, PacketIn, Userdata
from tests.support.podnet import PodNet, set_neighbor

from tests.integration.conftest import OvsEnv, PodFactory
from tests.support.packetin_ovs import COOKIE, METER_POLICY, RULE_ID, _in, connected, logged_rule, send_udp
from tests.support.waiting import eventually

def ipv4_5tuple(frame: bytes) -> tuple[str, str, int]:
    """(src, dst, protocol) of an untagged Ethernet/IPv4 frame."""
    assert struct.unpack_from("!H", frame, 12)[0] == 0x0800, frame[:16].hex()
    proto = frame[14 + 9]
    src = ".".join(str(b) for b in frame[26:30])
    dst = ".".join(str(b) for b in frame[30:34])
    return src, dst, proto


def two_pods(make_pod: PodFactory) -> tuple[PodNet, PodNet]:
    a, b = make_pod("a", 1), make_pod("b", 2)
    set_neighbor(a, b)
    set_neighbor(b, a)
    return a, b


def test_logged_policy_flow_yields_typed_packet_ins(ovs_env: OvsEnv, make_pod: PodFactory) -> None:
    a, b = two_pods(make_pod)
    got: dict[int, list[PacketIn]] = {Category.POLICY: [], Category.TRACEFLOW: []}

    async def scenario() -> None:
        async with connected(ovs_env.target, got) as (channel, demux):
            assert channel.meter_support is not None and channel.meter_support.supported
            await channel.install_meters([messages.MeterSpec(METER_POLICY, rate_pps=1000, burst=100)])
            await channel.install_flows([logged_rule(a, b, Disposition.REJECT, {"ip_proto": 1})])
            res = await asyncio.to_thread(_in, a.netns, "ping", "-c", "3", "-i", "0.2", "-W", "1", b.ip)
            assert res.returncode != 0  # the flow outputs nowhere: the ping really was dropped
            await eventually(lambda: len(got[Category.POLICY]) >= 3, 5.0)
            await asyncio.sleep(0.2)
            assert demux.stats()[Category.POLICY][RECEIVED] == 3

    asyncio.run(scenario())
    assert got[Category.TRACEFLOW] == []
    pins = got[Category.POLICY]
    assert len(pins) == 3
    for pin in pins:
        assert pin.reason == 0
        assert pin.table_id == 0
        assert pin.cookie == COOKIE
        assert pin.in_port == a.ofport
        assert pin.rule_id == RULE_ID
        assert pin.disposition == Disposition.REJECT
        ud = pin.parsed_userdata
        assert ud == Userdata(category=Category.POLICY, flags=int(Flags.LOG | Flags.REJECT), rule_id=RULE_ID)
        assert ipv4_5tuple(pin.packet) == (a.ip, b.ip, 1)
        assert pin.total_len == len(pin.packet) == 98
        assert abs(pin.received_at - time.time()) < 30


def test_traceflow_category_reaches_its_own_subscriber(ovs_env: OvsEnv, make_pod: PodFactory) -> None:
    a, b = two_pods(make_pod)
    got: dict[int, list[PacketIn]] = {Category.POLICY: [], Category.TRACEFLOW: []}
    base = {"eth_type": 0x0800, "ipv4_src": a.ip, "ipv4_dst": b.ip, "ip_proto": 17}
    flows = [
        # Traceflow with our userdata: category from userdata byte 1.
        messages.FlowSpec.make(0, 100, {**base, "udp_dst": 9}, [
            messages.Controller(reason=1, userdata=Userdata(category=Category.TRACEFLOW).encode()), messages.Output(b.ofport)]),
        # No userdata at all: demux falls back to the reason code (action -> traceflow).
        messages.FlowSpec.make(0, 100, {**base, "udp_dst": 10}, [messages.Controller(reason=1), messages.Output(b.ofport)]),
        # Userdata claiming a category nobody knows: counted as unroutable, not delivered.
        messages.FlowSpec.make(0, 100, {**base, "udp_dst": 11}, [
            messages.Controller(reason=0, userdata=Userdata(category=9).encode())]),
    ]

    async def scenario() -> Demux:
        async with connected(ovs_env.target, got) as (channel, demux):
            await channel.install_flows(flows)
            await asyncio.to_thread(send_udp, a, b, 9, 2)
            await asyncio.to_thread(send_udp, a, b, 10, 1)
            await asyncio.to_thread(send_udp, a, b, 11, 4)
            await eventually(lambda: len(got[Category.TRACEFLOW]) >= 3 and demux.unroutable["unknown_category"] >= 4,
                               5.0, what=lambda: f"{demux.stats()} {demux.unroutable} {got}")
            return demux

    demux = asyncio.run(scenario())
    assert got[Category.POLICY] == []
    trace = got[Category.TRACEFLOW]
    assert [p.reason for p in trace] == [1, 1, 1]
    assert [struct.unpack_from("!H", p.packet, 36)[0] for p in trace] == [9, 9, 10]
    assert demux.unroutable["unknown_category"] == 4
    assert demux.stats()[Category.TRACEFLOW][DELIVERED] == 3


def test_meter_caps_packet_ins_while_flow_counts_every_packet(ovs_env: OvsEnv, make_pod: PodFactory) -> None:
    a, b = two_pods(make_pod)
    got: dict[int, list[PacketIn]] = {Category.POLICY: []}
    sent = 300

    async def scenario() -> None:
        async with connected(ovs_env.target, got) as (channel, _):
            await channel.install_meters([messages.MeterSpec(METER_POLICY, rate_pps=10, burst=10)])
            await channel.install_flows([logged_rule(a, b, Disposition.DROP, {"ip_proto": 17})])
            t0 = time.monotonic()
            await asyncio.to_thread(send_udp, a, b, 5353, sent, 0.001)  # ~1000/s: 100x the meter
            elapsed = time.monotonic() - t0
            await asyncio.sleep(0.5)
            # burst + rate * time (+1 for rounding), far below what was sent
            assert len(got[Category.POLICY]) <= 10 + 10 * (elapsed + 0.5) + 1
            assert len(got[Category.POLICY]) >= 5

    asyncio.run(scenario())
    stats = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-flows", ovs_env.mgmt, "udp"],
                           capture_output=True, text=True, check=True).stdout
    assert f"n_packets={sent}," in stats, stats
