"""The agent's loss accounting: meter statistics over a (fake) OpenFlow channel, clocks injected, into the
npaudit_meter_dropped_* counters and the loss records; degraded without datapath meters."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any

import pytest
from os_ken.ofproto import ofproto_v1_5 as ofp
from prometheus_client import CollectorRegistry, generate_latest

from auditlog.chain import RecordText
from meters.ovs import METER_POLICY_ALLOW, METER_POLICY_DENY, MeterSupport
from meters.stats import Dropped
from packetin.errors import OpenFlowError
from policy_agent.limits.losses import LossAccounting, Restartable
from policy_agent.metrics import MeterCollector
from tests.support.clock import ManualClock

SUPPORTED = MeterSupport(max_meter=64, band_types=1 << ofp.OFPMBT_DROP, max_bands=1)
UNSUPPORTED = MeterSupport(max_meter=0, band_types=0, max_bands=0)


def reply(*meters: tuple[int, int, int, float]) -> bytes:
    """OFPMP_METER reply: (meter id, band packets, band bytes, age in seconds) per meter."""
    body = b"".join(struct.pack("!IH6xIQQIIQQ", m, 56, 0, 0, 0, int(age), round(age % 1 * 1e9), p, b)
                    for m, p, b, age in meters)
    return struct.pack("!BBHIHH4x", ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, 16 + len(body), 1,
                       ofp.OFPMP_METER_STATS, 0) + body


class FakeChannel:
    def __init__(self, support: MeterSupport | None = SUPPORTED) -> None:
        self.ready = True
        self.meter_support = support
        self.replies: list[bytes | Exception] = []
        self.requests: list[Any] = []

    async def multipart(self, msg: Any) -> list[bytes]:
        self.requests.append(msg)
        answer = self.replies.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return [answer]


class World:
    """The counters the accounting reads, as the demux, the pipeline and ovs-vswitchd would show them."""

    def __init__(self) -> None:
        self.admission = {"policy": {"received": 0, "dropped_rate_limit": 0, "dropped_queue_full": 0}}
        self.ovs: dict[str, int | None] = {"rconn_overflow": 0, "packet_in_overflow": 0}
        self.writer_full = 0
        self.records: list[dict[str, Any]] = []

    def submit(self, text: RecordText) -> bool:
        self.records.append(text.record())
        return True


def accounting(channel: FakeChannel, world: World, mono: ManualClock, wall: ManualClock, *,
               audit: bool = True) -> LossAccounting:
    return LossAccounting(channel, interval=5.0, admission=lambda: world.admission, ovs_losses=lambda: dict(world.ovs),
                          writer_full=lambda: world.writer_full, submit=world.submit if audit else None,
                          context={"observer": {"hostname": "n1"}}, mono_clock=mono, wall_clock=wall)


def by_reason(record: dict[str, Any]) -> dict[tuple[str, str], int]:
    return {(i["reason"], i["source"]): i["count"] for i in record["npaudit"]["loss"]["by_reason"]}


def test_meter_drops_become_counters_and_a_loss_record_of_the_window() -> None:
    channel, world, mono, wall = FakeChannel(), World(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    acc = accounting(channel, world, mono, wall)
    assert acc.dropped() is None  # nothing read yet: unknown, not zero
    channel.replies.append(reply((METER_POLICY_ALLOW, 0, 0, 1.0), (METER_POLICY_DENY, 0, 0, 1.0)))
    mono.now, wall.now = 105.0, wall.now + 5
    assert asyncio.run(acc.tick()) is None and world.records == []
    channel.replies.append(reply((METER_POLICY_ALLOW, 0, 0, 6.0), (METER_POLICY_DENY, 301, 30100, 6.0)))
    world.admission["policy"]["dropped_rate_limit"] = 4
    mono.now, wall.now = 110.0, wall.now + 5
    record = asyncio.run(acc.tick())
    assert record is not None and world.records[0]["event"]["id"] == record["event"]["id"]
    assert by_reason(record) == {("meter", "policy_deny"): 301, ("admission", "rate_limit"): 4}
    assert acc.dropped() == {"policy_allow": Dropped(0, 0), "policy_deny": Dropped(301, 30100)}
    assert len(channel.requests) == 2 and channel.requests[0].meter_id == ofp.OFPM_ALL


def test_the_counters_keep_growing_across_an_ovs_restart_and_the_record_counts_the_new_drops() -> None:
    channel, world, mono, wall = FakeChannel(), World(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    acc = accounting(channel, world, mono, wall)
    channel.replies += [reply((METER_POLICY_DENY, 50, 500, 9.0)), reply((METER_POLICY_DENY, 7, 70, 2.0))]
    world.ovs["rconn_overflow"] = 3  # the embedded vswitchd's counters, first reading: the baseline
    mono.now = 110.0
    asyncio.run(acc.tick())
    world.ovs["rconn_overflow"] = 1  # restarted vswitchd: its counter started again
    mono.now = 115.0
    record = asyncio.run(acc.tick())
    assert acc.dropped() == {"policy_deny": Dropped(57, 570)}
    assert record is not None and by_reason(record) == {("meter", "policy_deny"): 7, ("ovs_queue_overflow",
                                                                                      "rconn_overflow"): 1}
    registry = CollectorRegistry()
    registry.register(MeterCollector(acc))
    text = generate_latest(registry).decode()
    assert 'npaudit_meter_dropped_packets_total{meter="policy_deny"} 57.0' in text
    assert 'npaudit_meter_dropped_bytes_total{meter="policy_deny"} 570.0' in text


def test_without_datapath_meters_nothing_is_asked_and_other_losses_are_still_recorded() -> None:
    channel, world, mono, wall = FakeChannel(UNSUPPORTED), World(), ManualClock(0.0), ManualClock(1_700_000_000.0)
    acc = accounting(channel, world, mono, wall)
    world.admission["policy"]["dropped_queue_full"] = 2
    world.writer_full = 1
    record = asyncio.run(acc.tick())
    assert channel.requests == [] and acc.dropped() is None and acc.dropped_json() is None
    assert record is not None and by_reason(record) == {("admission", "queue_full"): 2,
                                                        ("writer_full", "audit_writer"): 1}


def test_a_failed_read_is_counted_and_said_once_and_the_next_one_catches_up(caplog: pytest.LogCaptureFixture) -> None:
    channel, world, mono, wall = FakeChannel(), World(), ManualClock(0.0), ManualClock(1_700_000_000.0)
    acc = accounting(channel, world, mono, wall)
    channel.replies += [OpenFlowError("switch refused request: error type 1 code 2", err_type=1, err_code=2, xid=9,
                                      failed="request"), asyncio.TimeoutError(),
                        reply((METER_POLICY_DENY, 12, 120, 3.0))]
    with caplog.at_level(logging.WARNING, logger="policy_agent.limits.losses"):
        for t in (1.0, 2.0):
            mono.now = t
            assert asyncio.run(acc.tick()) is None
        mono.now = 3.5
        record = asyncio.run(acc.tick())
    assert acc.read_errors == 2
    assert [r.getMessage() for r in caplog.records] == [
        "OVS meter statistics not read: switch refused request: error type 1 code 2"]
    assert record is not None and by_reason(record) == {("meter", "policy_deny"): 12}


def test_without_an_audit_log_meters_are_still_read_for_the_metrics() -> None:
    channel, world, mono, wall = FakeChannel(), World(), ManualClock(0.0), ManualClock(0.0)
    acc = accounting(channel, world, mono, wall, audit=False)
    channel.replies.append(reply((METER_POLICY_DENY, 5, 50, 1.0)))
    mono.now = 1.5
    assert asyncio.run(acc.tick()) is None
    assert acc.dropped_json() == {"policy_deny": {"packets": 5, "bytes": 50}} and world.records == []


def test_close_writes_the_last_window_up_to_now() -> None:
    channel, world, mono, wall = FakeChannel(), World(), ManualClock(0.0), ManualClock(1_700_000_000.0)

    async def scenario() -> None:
        acc = accounting(channel, world, mono, wall)
        acc.interval = 3600.0  # the periodic tick never comes in this test
        acc.start()
        await asyncio.sleep(0)
        channel.replies.append(reply((METER_POLICY_DENY, 9, 90, 1.0)))
        mono.now, wall.now = 2.0, wall.now + 2
        await acc.close()

    asyncio.run(scenario())
    assert len(world.records) == 1 and by_reason(world.records[0]) == {("meter", "policy_deny"): 9}


def test_a_last_window_whose_reads_hang_ends_at_its_bound_and_says_what_is_not_stated(caplog) -> None:
    class HungChannel(FakeChannel):
        async def multipart(self, msg: Any) -> list[bytes]:
            self.requests.append(msg)
            await asyncio.Event().wait()  # ovs-vswitchd never answers
            raise AssertionError("unreachable")

    channel, world, mono, wall = HungChannel(), World(), ManualClock(0.0), ManualClock(1_700_000_000.0)

    async def scenario() -> float:
        acc = accounting(channel, world, mono, wall)
        acc.interval = 3600.0
        acc.start()
        await asyncio.sleep(0)
        started = time.monotonic()
        await asyncio.wait_for(acc.close(bound=0.2), 10)  # the test's own limit: a hang fails, not hangs
        return time.monotonic() - started

    with caplog.at_level(logging.ERROR, logger="policy_agent.limits.losses"):
        took = asyncio.run(scenario())
    assert channel.requests and took < 5.0, took  # the bound ended it, not a timeout of the test's
    assert world.records == []
    assert "last loss accounting window not read within" in caplog.text, caplog.text
    assert "are not stated in the audit trail" in caplog.text, caplog.text


def test_restartable_counters_take_the_first_reading_as_the_baseline_and_skip_unreadable_ones() -> None:
    r = Restartable()
    r.update({"rconn_overflow": 40, "packet_in_overflow": None})
    r.update({"rconn_overflow": 45, "packet_in_overflow": 3})
    r.update({"rconn_overflow": 2, "packet_in_overflow": None})
    assert r.totals == {"rconn_overflow": 7, "packet_in_overflow": 0}


class _RuleMeters:
    """Per-rule meters 100 (deny class) and 101 (allow class) of the range 100..109; 105 is not ours."""

    def __init__(self) -> None:
        from meters.rule_meters import RuleMeterRange
        self.range = RuleMeterRange(100, 10)
        self.swept: list[list[int]] = []

    def class_of(self, meter_id: int) -> int | None:
        return {100: METER_POLICY_DENY, 101: METER_POLICY_ALLOW}.get(meter_id)

    async def sweep(self, present: list[int]) -> None:
        self.swept.append(sorted(present))


def test_per_rule_meters_count_under_their_class_and_strays_are_swept_only_by_the_periodic_tick() -> None:
    async def main() -> None:
        channel, world, mono, wall = FakeChannel(), World(), ManualClock(1000.0), ManualClock(1_700_000_000.0)
        acc = accounting(channel, world, mono, wall)
        rm = acc.rule_meters = _RuleMeters()
        mono.now = 1001.0
        # 105: left by an earlier run (made before this agent started): neither counted nor labelled.
        channel.replies.append(reply((2, 4, 400, 0.5), (100, 30, 3000, 0.5), (101, 7, 700, 0.5), (105, 9, 900, 99.0)))
        await acc.read_meters()  # as before a per-rule meter is deleted: no sweep from here
        assert rm.swept == []
        assert acc.dropped() == {"policy_allow": Dropped(7, 700), "policy_deny": Dropped(34, 3400)}
        channel.replies.append(reply((2, 4, 400, 1.5), (101, 8, 800, 1.5), (105, 9, 900, 100.0)))
        await acc.tick()
        assert rm.swept == [[2, 101, 105]]
        assert acc.dropped() == {"policy_allow": Dropped(8, 800), "policy_deny": Dropped(34, 3400)}
        record = world.records[-1]
        assert by_reason(record)[("meter", "policy_deny")] == 34 and by_reason(record)[("meter", "policy_allow")] == 8
    asyncio.run(main())


def flow_desc_reply(table: int, priority: int, cookie: int, packets: int) -> bytes:
    """An OFPMP_FLOW_DESC reply holding one flow (match in_port=1, no instructions: a drop) and its packet count."""
    match = struct.pack("!HHIi", 1, 12, 0x80000004, 1) + bytes(4)  # OXM in_port=1, padded to 8
    stats = struct.pack("!HHHBBQ", 0, 16, 0x8002, 4 << 1, 8, packets)  # OXS packet_count
    flow = struct.pack("!HHBxHHHHHQ", 24 + len(match) + len(stats), 0, table, priority, 0, 0, 0, 0, cookie)
    body = flow + match + stats
    return struct.pack("!BBHIHH4x", ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, 16 + len(body), 1,
                       ofp.OFPMP_FLOW_DESC, 0) + body


def test_packets_refused_from_unknown_sources_are_counted_from_the_first_and_stated_in_a_loss_record() -> None:
    from policy_agent.policy.tunnel_flows import unknown_source_request

    channel, world, mono, wall = FakeChannel(UNSUPPORTED), World(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    acc = LossAccounting(channel, interval=5.0, admission=lambda: world.admission, ovs_losses=lambda: dict(world.ovs),
                         submit=world.submit, context={"observer": {"hostname": "n1"}}, mono_clock=mono,
                         wall_clock=wall, unknown_sources=lambda: unknown_source_request(3))
    assert acc.unknown_source_drops() is None  # not read yet: unknown, not zero
    cookie = unknown_source_request(3).cookie
    # This round's flow, made by this run: what it counted at the first reading is stated in full.
    channel.replies.append(flow_desc_reply(25, 40, cookie, 7))
    mono.now, wall.now = 105.0, wall.now + 5
    asyncio.run(acc.tick())
    assert acc.unknown_source_drops() == 7
    assert channel.requests[-1].cookie == cookie and channel.requests[-1].table_id == 25
    (record,) = world.records
    assert by_reason(record) == {("unknown_source", "tunnel"): 7}
    assert record["npaudit"]["loss"]["frames"] == 7 and record["npaudit"]["loss"]["packet_ins"] == 0
    assert "7 packets from another node (tunnel) dropped before any rule: their source address was no Pod " \
           "this node knew yet" in record["message"]
    channel.replies.append(flow_desc_reply(25, 40, cookie, 10))
    asyncio.run(acc.tick())
    assert by_reason(world.records[-1]) == {("unknown_source", "tunnel"): 3} and acc.unknown_source_drops() == 10
    channel.replies.append(flow_desc_reply(25, 40, cookie, 10))  # nothing new: no record
    asyncio.run(acc.tick())
    assert len(world.records) == 2
    channel.replies.append(flow_desc_reply(25, 40, cookie, 2))  # OVS made it again (a restart): counts on
    asyncio.run(acc.tick())
    assert acc.unknown_source_drops() == 12 and by_reason(world.records[-1]) == {("unknown_source", "tunnel"): 2}
    channel.replies.append(asyncio.TimeoutError())  # a failed read: counted, the total stands
    asyncio.run(acc.tick())
    assert acc.read_errors == 1 and acc.unknown_source_drops() == 12


def test_without_the_check_of_unknown_sources_nothing_is_asked_and_no_such_loss_is_stated() -> None:
    channel, world, mono, wall = FakeChannel(UNSUPPORTED), World(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    acc = accounting(channel, world, mono, wall)
    asyncio.run(acc.tick())
    assert channel.requests == [] and acc.unknown_source_drops() is None
    assert not any(k.reason == "unknown_source" for k in acc.counts())


def test_packets_dropped_for_an_unknown_vni_are_counted_from_the_first_and_said_in_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    from policy_agent.policy.tunnel_flows import unknown_vni_request

    channel, world, mono, wall = FakeChannel(UNSUPPORTED), World(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    acc = LossAccounting(channel, interval=5.0, admission=lambda: world.admission, ovs_losses=lambda: dict(world.ovs),
                         submit=world.submit, mono_clock=mono, wall_clock=wall,
                         unknown_vnis=lambda: unknown_vni_request(3))
    assert acc.unknown_vni_drops() is None  # not read yet: unknown, not zero
    cookie = unknown_vni_request(3).cookie
    channel.replies.append(flow_desc_reply(0, 99, cookie, 0))
    with caplog.at_level(logging.WARNING, logger="policy_agent.limits.losses"):
        asyncio.run(acc.tick())
        assert acc.unknown_vni_drops() == 0 and not caplog.records  # read, none: no warning
        assert channel.requests[-1].cookie == cookie and channel.requests[-1].table_id == 0
        channel.replies.append(flow_desc_reply(0, 99, cookie, 4))
        mono.now += 5
        asyncio.run(acc.tick())
        assert acc.unknown_vni_drops() == 4
        (said,) = [r.getMessage() for r in caplog.records]
        assert said.startswith("4 packets from the tunnel dropped before any rule since start: their Geneve VNI")
        channel.replies.append(flow_desc_reply(0, 99, cookie, 4))  # nothing new: nothing said
        mono.now += 5
        asyncio.run(acc.tick())
        channel.replies.append(flow_desc_reply(0, 99, cookie, 9))  # more, but within the minute: held back...
        mono.now += 5
        asyncio.run(acc.tick())
        assert acc.unknown_vni_drops() == 9 and len(caplog.records) == 1
        channel.replies.append(flow_desc_reply(0, 99, cookie, 9))  # ...and said at the next look after it
        mono.now += 60
        asyncio.run(acc.tick())
        assert [r.getMessage()[:11] for r in caplog.records] == ["4 packets f", "9 packets f"]
    channel.replies.append(asyncio.TimeoutError())  # a failed read: counted, the total stands
    asyncio.run(acc.tick())
    assert acc.read_errors == 1 and acc.unknown_vni_drops() == 9


def test_packets_dropped_for_an_unknown_vni_are_stated_in_the_windows_loss_records_frame_for_frame() -> None:
    from policy_agent.policy.tunnel_flows import unknown_vni_request

    channel, world, mono, wall = FakeChannel(UNSUPPORTED), World(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    acc = LossAccounting(channel, interval=5.0, admission=lambda: world.admission, ovs_losses=lambda: dict(world.ovs),
                         submit=world.submit, mono_clock=mono, wall_clock=wall,
                         unknown_vnis=lambda: unknown_vni_request(3))
    cookie = unknown_vni_request(3).cookie
    # This round's flow, made by this run: what it counted by the first reading is stated in full.
    channel.replies.append(flow_desc_reply(0, 99, cookie, 2))
    mono.now, wall.now = 105.0, wall.now + 5
    asyncio.run(acc.tick())
    (record,) = world.records
    assert by_reason(record) == {("unknown_vni", "tunnel"): 2}
    assert record["npaudit"]["loss"]["frames"] == 2 and record["npaudit"]["loss"]["packet_ins"] == 0
    assert "2 packets from another node (tunnel) dropped before any rule: their Geneve VNI was neither Pod " \
           "traffic's (0) nor a trace mark this node knows" in record["message"]
    channel.replies.append(flow_desc_reply(0, 99, cookie, 2))  # nothing new: no record
    asyncio.run(acc.tick())
    channel.replies.append(flow_desc_reply(0, 99, cookie, 7))
    asyncio.run(acc.tick())
    assert len(world.records) == 2 and by_reason(world.records[-1]) == {("unknown_vni", "tunnel"): 5}
    # Over the trail, the stated losses add up to every packet the drop counted.
    assert sum(n for r in world.records for (reason, _), n in by_reason(r).items() if reason == "unknown_vni") == 7


def test_without_geneve_no_unknown_vni_loss_is_stated() -> None:
    channel, world, mono, wall = FakeChannel(UNSUPPORTED), World(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    acc = accounting(channel, world, mono, wall)
    asyncio.run(acc.tick())
    assert acc.unknown_vni_drops() is None and not any(k.reason == "unknown_vni" for k in acc.counts())
