"""OpenFlowChannel against a fake OpenFlow 1.5 switch: what a user of the channel sees."""

from __future__ import annotations

import asyncio
import gc
import logging
import struct
import warnings
from pathlib import Path
from typing import Any

import pytest
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from meters.ovs import MeterSupport
from packetin import messages
from packetin.channel import ChannelSettings, OpenFlowChannel
from packetin.errors import ChannelClosed, OpenFlowError
from tests.support.fake_switch import OFPMBT_DROP_BIT, FakeSwitch, Meter, packet_in2
from tests.support.channel_rig import DPID, Rig, WALL, flow, ports, rig, run, sock_path  # noqa: F401 (fixtures)
from tests.support.waiting import eventually
from tests.support.clock import FixedJitter, ManualClock, ManualSleep

DATA = Path(__file__).resolve().parents[1] / "data"


# --- handshake -------------------------------------------------------------------------


def test_handshake_reports_datapath_id_and_meter_support(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path, fake_kw={"max_meter": 4096, "max_bands": 3}) as r:
            assert r.chan.ready
            assert r.chan.datapath_id == DPID
            assert r.chan.meter_support == MeterSupport(max_meter=4096, band_types=OFPMBT_DROP_BIT,
                                                        max_bands=3)
            assert r.chan.meter_support.supported
            assert r.chan.connects == 1
            # The client spoke 1.5 and asked for NXT_PACKET_IN2 with full packets.
            assert r.fake.received_raw[0][:2] == bytes([6, ofp.OFPT_HELLO])
            assert r.fake.packet_in_format == messages.NXPIF_NXT_PACKET_IN2
            assert r.fake.miss_send_len == 0xFFFF
    run(main())


@pytest.mark.parametrize("max_meter,band_types,supported", [
    (0, OFPMBT_DROP_BIT, False),  # datapath without meters (e.g. old kernel datapath)
    (64, 1 << ofp.OFPMBT_DSCP_REMARK, False),  # meters, but no drop band
    (64, OFPMBT_DROP_BIT, True),
])
def test_meter_support_follows_meter_features(sock_path: str, max_meter: int, band_types: int,
                                              supported: bool) -> None:
    async def main() -> None:
        async with rig(sock_path, fake_kw={"max_meter": max_meter, "band_types": band_types}) as r:
            assert r.chan.ready
            assert r.chan.meter_support is not None
            assert r.chan.meter_support.max_meter == max_meter
            assert r.chan.meter_support.band_types == band_types
            assert r.chan.meter_support.supported is supported
    run(main())


def test_refused_meter_features_degrade_to_no_meters(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path, fake_kw={"refuse_meter_features": True}) as r:
            assert r.chan.ready and r.chan.connects == 1
            assert r.chan.meter_support == MeterSupport(max_meter=0, band_types=0, max_bands=0)
            assert r.chan.meter_support.supported is False
    run(main())


def test_switch_without_openflow15_never_becomes_ready(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path, wait=False, fake_kw={"hello_version": 4}) as r:
            with pytest.raises(asyncio.TimeoutError):
                await r.chan.wait_ready(0.4)
            assert r.chan.connects == 0 and r.chan.datapath_id is None
            assert r.fake.accepted >= 2  # it keeps retrying with backoff
            assert ofp.OFPT_FEATURES_REQUEST not in r.fake.types()
    run(main())


# --- flows -------------------------------------------------------------------------------


def test_install_flows_returns_only_after_the_barrier(sock_path: str) -> None:
    flows = [
        messages.FlowSpec.make(0, 100, {"in_port": 3, "eth_type": 0x0800},
                        [messages.SetField("reg7", 1), messages.Output(2)], goto=5, cookie=0xC0FFEE),
        messages.FlowSpec.make(5, 10, {"eth_type": 0x86DD}, [messages.Controller(userdata=b"\x01\x00\x01")]),
        messages.FlowSpec.make(5, 0, None, [], goto=6),
    ]

    async def main() -> None:
        async with rig(sock_path) as r:
            r.fake.hold_barriers = True
            barriers = r.fake.types().count(ofp.OFPT_BARRIER_REQUEST)
            task = asyncio.create_task(r.chan.install_flows(flows))
            await eventually(lambda: r.fake.types().count(ofp.OFPT_BARRIER_REQUEST) > barriers, 1.0,
                             "barrier")
            assert len(r.fake.flows) == 3  # the switch has them, but did not confirm yet
            await asyncio.sleep(0.05)
            assert not task.done(), "install_flows returned before the barrier reply"
            r.fake.release_barriers()
            await asyncio.wait_for(task, 1.0)

            assert r.fake.types()[-4:] == [ofp.OFPT_FLOW_MOD] * 3 + [ofp.OFPT_BARRIER_REQUEST]
            got = r.fake.flows[(0, 100, (("eth_type", 0x0800), ("in_port", 3)))]
            assert got.match == {"in_port": 3, "eth_type": 0x0800}
            assert got.cookie == 0xC0FFEE and got.goto == 5
            assert isinstance(got.actions[0], parser.OFPActionSetField)
            assert got.actions[0].key == "reg7" and got.actions[0].value == 1
            assert ports(got.actions) == [2]
            ctl = r.fake.flows[(5, 10, (("eth_type", 0x86DD),))]
            assert type(ctl.actions[0]).__name__ == "NXActionController2"
            assert bytes(ctl.actions[0].userdata) == b"\x01\x00\x01"
            miss = r.fake.flows[(5, 0, ())]
            assert miss.actions == [] and miss.goto == 6
            assert {f.key for f in r.chan.desired_flows} == {f.key for f in flows}
    run(main())


def test_refused_flow_raises_naming_the_flow(sock_path: str) -> None:
    first = [flow(0, 100, 1, in_port=1), flow(0, 90, 2, in_port=2)]
    bad = flow(3, 200, 77, in_port=7, eth_type=0x0800)  # the fake refuses output:77

    async def main() -> None:
        async with rig(sock_path) as r:
            await r.chan.install_flows(first)
            with pytest.raises(OpenFlowError) as info:
                await r.chan.install_flows([flow(0, 80, 3, in_port=3), bad, flow(0, 70, 4, in_port=4)])
            err = info.value
            assert bad.describe() == "table=3 priority=200 match=eth_type=2048,in_port=7"
            assert bad.describe() in str(err) and bad.describe() in err.failed
            assert "error type 2 code 4" in str(err)
            assert (err.err_type, err.err_code) == (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT)
            refused = [x for x in r.fake.mods if x.ident == bad.key]
            assert len(refused) == 1 and err.xid == refused[0].xid
            assert bad.key not in r.fake.flows
            keys = {f.key for f in r.chan.desired_flows}
            assert bad.key not in keys
            assert {f.key for f in first} <= keys
            # The channel stays usable after a refusal.
            await r.chan.install_flows([flow(0, 60, 5, in_port=5)])
            assert (0, 60, (("in_port", 5),)) in r.fake.flows
            assert r.chan.connects == 1
    run(main())


def test_flows_accepted_in_a_partly_refused_batch_survive_a_restart(sock_path: str) -> None:
    good = flow(0, 80, 3, in_port=3)

    async def main() -> None:
        async with rig(sock_path) as r:
            with pytest.raises(OpenFlowError):
                await r.chan.install_flows([good, flow(0, 81, 77, in_port=9)])
            assert good.key in r.fake.flows  # the switch accepted and confirmed it
            fresh = await r.restart_switch()
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 2.0, "reconnect")
            assert good.key in fresh.flows
    run(main())


def test_overwrite_and_delete_flows(sock_path: str) -> None:
    a, b = flow(1, 100, 1, in_port=1), flow(1, 100, 1, in_port=2)

    async def main() -> None:
        async with rig(sock_path) as r:
            await r.chan.install_flows([a, b])
            a2 = flow(1, 100, 9, in_port=1)  # same table/priority/match: overwrites a
            await r.chan.install_flows([a2])
            assert ports(r.fake.flows[a.key].actions) == [9]
            assert r.chan.desired_flows.count(a2) == 1 and a not in r.chan.desired_flows
            await r.chan.delete_flows([a2])
            assert r.fake.mods[-1].command == ofp.OFPFC_DELETE_STRICT
            assert a.key not in r.fake.flows and b.key in r.fake.flows
            assert r.chan.desired_flows == [b]
    run(main())


# --- meters -------------------------------------------------------------------------------


def test_install_meters_falls_back_to_modify_and_delete(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path) as r:
            await r.chan.install_meters([messages.MeterSpec(5, rate_pps=100, burst=10)])
            assert r.fake.meters[5].bands == [(100, 10)]
            start = len(r.fake.mods)
            await r.chan.install_meters([messages.MeterSpec(5, rate_pps=200, burst=20), messages.MeterSpec(6, 50)])
            assert [(x.command, x.ident) for x in r.fake.mods[start:]] == [
                (ofp.OFPMC_ADD, 5), (ofp.OFPMC_ADD, 6), (ofp.OFPMC_MODIFY, 5)]
            assert r.fake.meters[5].bands == [(200, 20)]
            assert r.fake.meters[5].flags & ofp.OFPMF_PKTPS
            assert r.fake.meters[6].bands == [(50, 0)]
            await r.chan.delete_meters([5])
            assert r.fake.mods[-1].command == ofp.OFPMC_DELETE
            assert set(r.fake.meters) == {6}
            # Desired state: only meter 6 comes back after a restart.
            fresh = await r.restart_switch()
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 2.0, "reconnect")
            assert set(fresh.meters) == {6}
    run(main())


def test_meter_that_exists_on_the_switch_is_modified(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path) as r:
            r.fake.meters[9] = Meter(9, 0, [(1, 1)])  # left over from a previous agent run
            await r.chan.install_meters([messages.MeterSpec(9, rate_pps=300)])
            assert [x.command for x in r.fake.mods] == [ofp.OFPMC_ADD, ofp.OFPMC_MODIFY]
            assert r.fake.meters[9].bands == [(300, 0)]
    run(main())


# --- reconnect and replay ---------------------------------------------------------------


def test_reconnect_replays_meters_then_flows(sock_path: str) -> None:
    flows = [messages.FlowSpec.make(0, 100, {"in_port": 1}, [messages.Controller(userdata=b"\x01\x00")]),
             messages.FlowSpec.make(0, 90, {"in_port": 2, "eth_type": 0x0800}, [messages.Output(3)], goto=2),
             flow(2, 5, 4, in_port=5)]

    async def main() -> None:
        async with rig(sock_path) as r:
            await r.chan.install_flows(flows)  # flows first, to show replay reorders
            await r.chan.install_meters([messages.MeterSpec(1, 10), messages.MeterSpec(2, 20), messages.MeterSpec(3, 30)])
            await r.chan.delete_flows([flows[2]])
            await r.chan.delete_meters([3])
            before = dict(r.fake.flows)

            fresh = await r.restart_switch()
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 4.9, "reconnect")
            assert fresh.accepted == 1  # the first connection to the new switch was the good one
            assert r.chan.datapath_id == DPID

            kinds = [x.kind for x in fresh.mods]
            assert kinds == ["meter", "meter", "flow", "flow"]
            assert all(x.command == 0 for x in fresh.mods)  # all ADDs on the empty table
            assert set(fresh.meters) == {1, 2} and fresh.meters[2].bands == [(20, 0)]
            assert fresh.flows.keys() == {flows[0].key, flows[1].key}
            for key, old in before.items():
                new = fresh.flows[key]
                assert (new.match, new.goto, new.cookie) == (old.match, old.goto, old.cookie)
                assert [str(a) for a in new.actions] == [str(a) for a in old.actions]
            # A barrier after each replayed batch; ready only after the last one.
            barriers = [i for i, t in enumerate(fresh.types()) if t == ofp.OFPT_BARRIER_REQUEST]
            assert len(barriers) >= 4
    run(main())


def test_pending_batch_fails_with_channel_closed_when_the_switch_dies(sock_path: str) -> None:
    f = flow(0, 1, 1, in_port=1)

    async def main() -> None:
        async with rig(sock_path) as r:
            r.fake.hold_barriers = True
            task = asyncio.create_task(r.chan.install_flows([f]))
            await eventually(lambda: len(r.fake._held) == 1, 1.0, "barrier")
            r.fake.hold_barriers = False
            r.fake.drop()
            with pytest.raises(ChannelClosed):
                await asyncio.wait_for(task, 1.0)
            assert f not in r.chan.desired_flows  # never confirmed
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 2.0, "reconnect")
    run(main())


def test_switch_dying_during_handshake_is_noticed_at_once(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path, wait=False, request_timeout=3.0) as r:
            r.fake.drop_on = ofp.OFPT_FEATURES_REQUEST
            await r.chan.wait_ready(1.0)  # reconnect + handshake take ~0.1 s
            assert r.fake.accepted == 2
    run(main())


def test_handshake_timeout_is_logged_with_a_reason(sock_path: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with rig(sock_path, wait=False, request_timeout=0.2) as r:
            r.fake.hold_barriers = True  # the handshake's barrier never completes
            await eventually(lambda: r.fake.accepted >= 2, 1.5, "a retry after the timeout")
            assert not r.chan.ready

    with caplog.at_level(logging.WARNING, logger="packetin.channel"):
        run(main())
    msgs = [rec.getMessage() for rec in caplog.records if rec.name == "packetin.channel"]
    assert msgs and all(not msg.rstrip().endswith(":") for msg in msgs), msgs


def test_reconnect_backoff_doubles_to_its_cap_with_jitter_and_starts_over_after_a_connection(sock_path: str) -> None:
    sleep = ManualSleep(instant=1.0)  # a backoff over 1 s waits for the test

    async def main() -> None:
        chan = OpenFlowChannel(ChannelSettings(sock_path, reconnect_min=0.1, reconnect_max=1.6), lambda b, t: None,
                               sleep=sleep, rng=FixedJitter(0.25))  # jitter x(0.5 + 0.25)
        fake = FakeSwitch(sock_path, datapath_id=DPID)
        chan.start()
        try:
            # Nothing listens: each failed attempt waits twice as long as the one before.
            await eventually(lambda: sleep.parked == 1, 2.0, "a backoff longer than 1 s")
            assert sleep.delays == pytest.approx([0.075, 0.15, 0.3, 0.6, 1.2])
            await sleep.wake()
            await eventually(lambda: sleep.parked == 1 and len(sleep.delays) == 6, 2.0, "the next backoff")
            assert sleep.delays[-1] == pytest.approx(1.2)  # capped at reconnect_max (1.6 x 0.75)
            await fake.start()
            await sleep.wake()
            await chan.wait_ready(2.0)
            assert chan.connects == 1
            # The keepalive's first interval (ready may be told a loop turn before it starts waiting).
            await eventually(lambda: sleep.delays[-1] == chan.settings.echo_interval, 2.0, "the keepalive's wait")
            connected = len(sleep.delays)
            await fake.stop()
            await eventually(lambda: len(sleep.delays) >= connected + 5, 2.0, "the reconnect attempts")
            # A lost connection starts the backoff over.
            assert sleep.delays[connected:connected + 5] == pytest.approx([0.075, 0.15, 0.3, 0.6, 1.2])
        finally:
            await chan.close()
            await fake.stop()
    run(main())


def test_requests_while_disconnected_raise_channel_closed(sock_path: str) -> None:
    async def main() -> None:
        fake = FakeSwitch(sock_path)
        await fake.start()
        chan = OpenFlowChannel(ChannelSettings(sock_path, request_timeout=2.0, reconnect_max=0.2),
                               lambda b, t: None)
        try:
            with pytest.raises(ChannelClosed):  # not started
                await chan.install_flows([flow(0, 1, 1)])
            with pytest.raises(ChannelClosed):
                await chan.request(messages.barrier())
            chan.start()
            await chan.wait_ready(2.0)
            await fake.stop()
            await eventually(lambda: not chan.ready, 1.0, "channel to notice")
            for call in (lambda: chan.install_flows([flow(0, 1, 1)]),
                         lambda: chan.install_meters([messages.MeterSpec(1, 1)]),
                         lambda: chan.request(messages.barrier())):
                with pytest.raises(ChannelClosed):
                    await call()
            with pytest.raises(ChannelClosed):
                chan.send_nowait(messages.echo_request())
            assert chan.desired_flows == []
        finally:
            await chan.close()
        with pytest.raises(ChannelClosed):  # closed
            await chan.install_flows([flow(0, 1, 1)])
    run(main())


def test_a_request_cancelled_as_its_reply_arrives_is_cancelled_not_answered(sock_path: str) -> None:
    """The stop's cancel of the loss accounting task landed in the loop turn that brought its meter reply:
    wait_for returned the reply, the task ticked on, and the agent stayed up after SIGTERM."""
    async def main() -> None:
        async with rig(sock_path) as r:
            replies: list[asyncio.Future[Any]] = []

            class CancelOnReply(dict):  # the channel's pending replies: each reply's arrival cancels the request
                def __setitem__(self, xid: int, reply: asyncio.Future[Any]) -> None:
                    reply.add_done_callback(lambda _: request.cancel())  # in the reply's own loop turn
                    replies.append(reply)
                    super().__setitem__(xid, reply)

            r.chan._pending = CancelOnReply(r.chan._pending)
            request = asyncio.create_task(r.chan.request(messages.barrier()))
            await asyncio.wait({request}, timeout=5.0)
            [reply] = replies
            assert reply.done() and not reply.cancelled()  # the switch did answer
            assert request.cancelled(), f"the cancel was swallowed: the request returned {request.result()!r}"
            assert r.chan._pending == {}
    run(main())


# --- keepalive ---------------------------------------------------------------------------


async def next_echo(r: Rig, what: str) -> None:
    """Let the channel's keepalive interval pass and wait for its tick to reach the switch."""
    n = r.fake.echo_requests
    await r.sleep.wake()
    await eventually(lambda: r.fake.echo_requests > n, 1.0, what)


def test_keepalive_drops_a_silent_switch_and_reconnects(sock_path: str) -> None:
    clock = ManualClock(1000.0)

    async def main() -> None:
        async with rig(sock_path, echo_interval=1.0, echo_timeout=0.3, mono_clock=clock) as r:
            start = clock.now
            # An answering switch is kept: each reply restarts the timeout.
            for _ in range(5):
                clock.advance(0.2)
                await next_echo(r, "echo request")
            assert clock.now - start > 3 * 0.3
            assert r.chan.connects == 1 and r.fake.peer_closed == 0
            r.fake.answer_echo = False
            # Silent, but not yet for echo_timeout: kept, however many echoes go unanswered.
            for _ in range(3):
                await next_echo(r, "unanswered echo request")
            assert r.fake.peer_closed == 0
            clock.advance(0.31)
            await r.sleep.wake()
            await eventually(lambda: r.fake.peer_closed == 1, 1.0, "channel to drop the silent switch")
            r.fake.answer_echo = True
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 1.0, "reconnect")
    run(main())


def test_channel_answers_the_switch_echo_requests(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path) as r:
            r.fake.send(struct.pack("!BBHI", 6, ofp.OFPT_ECHO_REQUEST, 12, 0x4242) + b"ping")
            await eventually(lambda: (ofp.OFPT_ECHO_REPLY, 0x4242) in r.fake.received, 1.0, "echo reply")
            reply = r.fake.received_raw[r.fake.received.index((ofp.OFPT_ECHO_REPLY, 0x4242))]
            assert reply[8:] == b"ping"
    run(main())


# --- packet-ins --------------------------------------------------------------------------


def test_fake_packet_in2_matches_ovs31_bytes() -> None:
    """The fake builds packet-ins exactly as recorded from OVS 3.1 (so the tests below are real)."""
    recorded = (DATA / "ovs31_packet_in2_stream.bin").read_bytes()
    first_len = struct.unpack_from("!H", recorded, 2)[0]
    first = recorded[:first_len]
    packet = first[20:20 + 98]
    assert packet_in2(xid=0, packet=packet, in_port=1, rule_id=42, reg7=1,
                      userdata=bytes([1, 0, 1, 0, 0, 0, 42])) == first


def test_packet_ins_are_decoded_and_delivered(sock_path: str) -> None:
    n = 25
    sent = [dict(packet=bytes([i]) * (14 + i), table_id=i % 7, cookie=(i << 40) | i, reason=i % 2,
                 in_port=100 + i, rule_id=1000 + i, reg7=i % 4, userdata=bytes([1, i % 2, 0, 0, 0, 0, i]))
            for i in range(n)]

    async def main() -> None:
        async with rig(sock_path) as r:
            raw = b"".join(packet_in2(xid=i, **kw) for i, kw in enumerate(sent))
            cut = len(raw) // 2 + 3  # split a message across two reads
            r.fake.send(raw[:cut])
            await asyncio.sleep(0.02)
            r.fake.send(raw[cut:])
            await eventually(lambda: len(r.packet_ins) >= n, 1.0, "packet-ins")
            await asyncio.sleep(0.02)
            got = r.packet_ins
            assert len(got) == n and r.chan.packet_ins == n
            assert len(r.batches) >= 2  # delivered as they arrived, not all at the end
            for p, kw in zip(got, sent):
                assert (p.rule_id, p.reg7, p.in_port, p.userdata, p.cookie) == (
                    kw["rule_id"], kw["reg7"], kw["in_port"], kw["userdata"], kw["cookie"])
                assert (p.packet, p.table_id, p.reason) == (kw["packet"], kw["table_id"], kw["reason"])
                assert p.total_len == len(kw["packet"]) and p.received_at == WALL
            assert r.chan.malformed == 0 and r.malformed_calls == []
    run(main())


def test_malformed_packet_in_is_counted_and_the_next_one_arrives(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path) as r:
            overrun = struct.pack("!HH", 7, 200) + b"\0" * 4  # USERDATA says 200 bytes, has 4
            r.fake.send(packet_in2(rule_id=1, in_port=1) + packet_in2(rule_id=2, tail=overrun)
                        + packet_in2(rule_id=3, in_port=3, userdata=b"\x01\x01\x00\x00\x00\x00\x03"))
            await eventually(lambda: len(r.packet_ins) >= 2, 1.0, "packet-ins")
            await eventually(lambda: r.chan.malformed >= 1, 1.0, "malformed count")
            assert [p.rule_id for p in r.packet_ins] == [1, 3]
            assert r.packet_ins[1].in_port == 3 and r.packet_ins[1].userdata[-1] == 3
            assert r.chan.malformed == 1 and r.malformed_calls == [1]
            assert r.chan.packet_ins == 2
            assert r.chan.connects == 1 and r.fake.peer_closed == 0  # not a reason to reconnect
    run(main())


def test_unframeable_stream_reconnects(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path) as r:
            r.fake.send(struct.pack("!BBHI", 6, ofp.OFPT_ECHO_REQUEST, 4, 1))  # length 4 < 8
            await eventually(lambda: r.fake.peer_closed == 1, 1.0, "channel to drop the stream")
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 1.0, "reconnect")
            r.fake.send(packet_in2(rule_id=7))
            await eventually(lambda: len(r.packet_ins) == 1, 1.0, "packet-in after reconnect")
    run(main())


# --- close -------------------------------------------------------------------------------


def test_close_is_clean(sock_path: str, caplog: pytest.LogCaptureFixture) -> None:
    leftovers: list[asyncio.Task[Any]] = []

    async def main() -> None:
        before = asyncio.all_tasks()  # the test's own tasks (run's wait_for wrapper)
        async with rig(sock_path, echo_interval=0.05) as r:
            await r.chan.install_meters([messages.MeterSpec(1, 10)])
            await r.chan.install_flows([flow(0, 1, 1, in_port=1)])
            r.fake.send(packet_in2(rule_id=1))
            await eventually(lambda: len(r.packet_ins) == 1, 1.0, "packet-in")
            await asyncio.sleep(0.12)  # let keepalive run
            await r.chan.close()
            leftovers.extend(asyncio.all_tasks() - before)
            assert not r.chan.ready
            await eventually(lambda: r.fake.peer_closed == 1, 1.0, "switch to see the close")
            await r.chan.close()  # twice is harmless
            await asyncio.sleep(0.15)
            assert r.fake.accepted == 1  # no reconnect after close

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            run(main())
            gc.collect()
    assert leftovers == []
    assert [str(w.message) for w in caught] == []
    assert [rec.getMessage() for rec in caplog.records if rec.name == "asyncio"] == []


def test_close_while_waiting_to_reconnect_is_prompt(sock_path: str) -> None:
    async def main() -> None:
        before = asyncio.all_tasks()
        async with rig(sock_path, reconnect_min=3.0, reconnect_max=3.0, sleep=ManualSleep()) as r:
            await r.fake.stop()
            await eventually(lambda: not r.chan.ready, 1.0, "channel to notice")
            # Now in its reconnect backoff (3.0 s, jitter x0.5..1.5), which never ends by itself
            # here: close must cut it short.
            await eventually(lambda: r.sleep.parked == 1 and r.sleep.delays[-1] == 3.0, 1.0, "the backoff")
            await asyncio.wait_for(r.chan.close(), 1.0)
            assert asyncio.all_tasks() - before == set()
            with pytest.raises(ChannelClosed):
                await r.chan.install_flows([flow(0, 1, 1)])
    run(main())
