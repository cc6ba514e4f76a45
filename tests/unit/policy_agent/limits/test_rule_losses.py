"""Per-rule loss: the logged rules' flow counts read from OVS's reply, totals across re-added flows, the
settled loss per rule, and the loss records that state it."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from auditlog.chain import RecordText
from auditlog.loss_records import LossKey, LossRecorder, loss_record
from packetin.errors import DecodeError
from meters.ovs import METER_POLICY_DENY, MeterSupport
from meters.rule_meters import RuleMeterRange
from os_ken.ofproto import ofproto_v1_5 as ofp
from policy_agent.limits.losses import LossAccounting
from policy_agent.limits.rule_flows import FlowCount, RuleFlowTotals, parse_logged_flows, policy_flows_request
from policy_agent.limits.rule_losses import RuleLoss, RuleLossLedger, describe_rule
from tests.support.clock import ManualClock

# An OFPMP_FLOW_DESC reply of OVS 3.1 (netdev) to policy_flows_request(): two logged Drop rules of table 40,
# each with a controller2 action carrying reason, userdata (01 00 05 + rule id) and meter_id properties.
RECORDED = bytes.fromhex(
    "061301b0005d42fb000100000000000000d000002800cd51000000000000000000000001000000030001002180000a02"
    "08008000140111800020020035800104085e8c22a6052da80200000000000000000000348002000800000000173eed80"
    "80020208000000000000000080020808000000000000000080020a080000000000000000000000000004005800000000"
    "0019001000010e0400000001000000000019001000010c0479bab66a00000000ffff0030000023200025000000000000"
    "00020005000000000003000b01000579bab66a0000000000000500080000000200d000002800cd110000000000000000"
    "00000001000000030001002180000a02080080001401118000200200368001040848aabf67052da80200000000000000"
    "000000348002000800000000173eed8080020208000000000000000080020808000000000000000080020a0800000000"
    "000000000000000000040058000000000019001000010e0400000001000000000019001000010c04c637c41200000000"
    "ffff003000002320002500000000000000020005000000000003000b010005c637c41200000000000005000800000002")
RULE_A, RULE_B = 0x79BAB66A, 0xC637C412
PACKET_COUNT = bytes.fromhex("80020808")  # OXS packet_count, 8 bytes


def with_counts(*counts: int, flags: int | None = None) -> bytes:
    """RECORDED with the flows' packet counts set (in order), and their userdata flags replaced."""
    raw = bytearray(RECORDED)
    at = 0
    for n in counts:
        at = raw.index(PACKET_COUNT, at) + 4
        raw[at:at + 8] = struct.pack("!Q", n)
    if flags is not None:
        at = 0
        while (at := raw.find(bytes.fromhex("0003000b0100"), at)) >= 0:
            raw[at + 6] = flags
            at += 6
    return bytes(raw)


def test_the_recorded_ovs_reply_gives_each_logged_rules_flow_and_its_packets() -> None:
    flows = parse_logged_flows([with_counts(2000, 1500)])
    assert [(f.rule_id, f.packets) for f in flows] == [(RULE_A, 2000), (RULE_B, 1500)]
    assert flows[0].key != flows[1].key and flows[0].key[:2] == (40, 0xCD51)


def test_flows_whose_copy_does_not_log_are_not_a_rules_count() -> None:
    assert parse_logged_flows([with_counts(5, 5, flags=0x02)]) == []  # REJECT without LOG: answered, not logged


def test_a_cut_reply_is_a_decode_error_never_a_wrong_count() -> None:
    with pytest.raises(DecodeError):
        parse_logged_flows([RECORDED[:200]])
    cut = bytearray(RECORDED)
    cut[16:18] = struct.pack("!H", 0x300)  # a flow longer than the message
    with pytest.raises(DecodeError):
        parse_logged_flows([bytes(cut)])


def test_the_request_asks_every_table_for_policy_flows_of_any_round() -> None:
    req = policy_flows_request()
    assert (req.table_id, req.cookie, req.cookie_mask) == (0xFF, 3, 0xFFFFFFFF)


def in_round(reply: bytes, round_: int) -> bytes:
    """`reply` with every flow's cookie in agent round `round_` (the kind, policy, kept)."""
    raw, at = bytearray(reply), 16
    while at < len(raw):
        raw[at + 16:at + 20] = struct.pack("!I", round_)
        at += struct.unpack_from("!H", raw, at)[0]
    return bytes(raw)


def test_a_restarts_flow_added_again_in_the_new_round_goes_on_counting_where_it_was() -> None:
    totals = RuleFlowTotals()
    totals.update(parse_logged_flows([in_round(with_counts(50, 7), 1)]))  # the baseline: the old run's
    # The new run ADDs the same flows with its round's cookie: OVS replaces them and keeps their counts.
    totals.update(parse_logged_flows([in_round(with_counts(80, 7), 2)]))
    assert totals.totals == {RULE_A: 30, RULE_B: 0}


def flow(n: int, packets: int, rule: int = 7) -> FlowCount:
    return FlowCount((40, 100 + n, 3, b"m%d" % n), rule, packets)


def test_flow_totals_start_at_the_first_reading_and_survive_re_added_and_deleted_flows() -> None:
    totals = RuleFlowTotals()
    totals.update([flow(1, 50)])  # before the agent looked: not its to state
    assert totals.totals == {7: 0}
    totals.update([flow(1, 80), flow(2, 10)])  # a flow made since counts from 0
    assert totals.totals == {7: 40}
    totals.update([flow(1, 5), flow(2, 10)])  # made again (vswitchd restarted): on from 0
    assert totals.totals == {7: 45}
    totals.update([flow(2, 12)])  # flow 1 deleted: what it counted stays
    assert totals.totals == {7: 47}


def test_the_ledger_never_states_packet_ins_still_in_flight_and_is_exact_once_the_rule_is_quiet() -> None:
    ledger = RuleLossLedger(settle=1.0)
    assert ledger.tick({1: 0, 2: 0}, {1: 3}, now=0.0) == {}  # baseline: seen before the flows were read
    # 0.5 s later the flows counted 1000 and 400 but the pipeline has seen only 200 and 100 so far.
    assert ledger.tick({1: 1000, 2: 400}, {1: 203, 2: 100}, now=0.5) == {}  # nothing settled yet
    # At 1.0 the flows as read at 0.0 are settled: nothing to state; in flight at 0.5 is not stated.
    assert ledger.tick({1: 1500, 2: 400}, {1: 403, 2: 300}, now=1.0) == {}
    # At 1.5 the flows as of 0.5 (1000, 400) against what has been seen by now: 1000-500, 400-390.
    assert ledger.tick({1: 1500, 2: 400}, {1: 503, 2: 390}, now=1.5) == {1: RuleLoss(500), 2: RuleLoss(10)}
    # Seen catches up on rule 1's last packet-ins: never stated twice, never taken back.
    assert ledger.tick({1: 1500, 2: 400}, {1: 903, 2: 390}, now=2.0) == {1: RuleLoss(100)}
    assert ledger.tick({1: 1500, 2: 400}, {1: 903, 2: 390}, now=3.0) == {}
    assert ledger.stated == {1: 1500 - 900, 2: 400 - 390}  # quiet: flows - seen, exactly


def test_a_rule_with_its_own_meter_splits_its_loss_into_the_meters_drops_and_the_rest() -> None:
    ledger = RuleLossLedger(settle=1.0)
    ledger.tick({5: 0}, {}, now=0.0, meters={5: 0})
    # At 1.0 the flows matched 1000; its meter had dropped 600; 300 of the 400 it passed are seen so far.
    assert ledger.tick({5: 1000}, {5: 300}, now=1.0, meters={5: 600}) == {}
    # Settled against the reading at 1.0: 600 by the meter, 1000-600-350 = 50 lost after it (so far).
    assert ledger.tick({5: 1000}, {5: 350}, now=2.0, meters={5: 600}) == {5: RuleLoss(650, 600)}
    # The rest of what it passed arrives but for 10 (admission dropped them): the rest shrinks to 10 only
    # in truth; what was stated stays, and nothing more is stated.
    assert ledger.tick({5: 1000}, {5: 390}, now=3.0, meters={5: 600}) == {}
    assert (ledger.stated, ledger.stated_meter) == ({5: 650}, {5: 600})


def test_a_rule_with_its_own_meter_is_exact_once_quiet() -> None:
    ledger = RuleLossLedger(settle=1.0)
    ledger.tick({5: 0}, {}, now=0.0, meters={5: 0})
    ledger.tick({5: 1000}, {5: 100}, now=1.0, meters={5: 600})  # most of what passed still in flight
    assert ledger.tick({5: 1000}, {5: 390}, now=2.0, meters={5: 600}) == {5: RuleLoss(610, 600)}
    assert ledger.tick({5: 1000}, {5: 390}, now=3.0, meters={5: 600}) == {}
    assert ledger.stated == {5: 1000 - 390}


def test_a_rule_is_described_as_audit_records_name_it() -> None:
    class Info:
        ruleset, rule_name, tier = "AntreaClusterNetworkPolicy:p", "drop-x", "securityops"

    assert describe_rule(9, Info()) == {"id": "9", "name": "drop-x", "ruleset": "AntreaClusterNetworkPolicy:p",
                                        "category": "securityops"}
    assert describe_rule(9, None) == {"id": "9"}


def test_rule_losses_are_attributed_beside_the_reasons_and_not_added_to_the_totals() -> None:
    record = loss_record({LossKey("policy", "meter", "policy_deny"): 30}, 1.0, 2.0,
                         by_rule=[{"rule": {"id": "9", "name": "drop-x"}, "count": 30}])
    loss = record["npaudit"]["loss"]
    assert (loss["packet_ins"], loss["by_rule"]) == (30, [{"rule": {"id": "9", "name": "drop-x"}, "count": 30}])
    assert "30 of rule drop-x (id 9)" in record["message"]


def test_a_refused_record_keeps_the_rules_losses_for_the_next_window() -> None:
    accepted: list[dict[str, Any]] = []
    room = [False]

    def submit(text: RecordText) -> bool:
        if room[0]:
            accepted.append(text.record())
        return room[0]

    recorder = LossRecorder(submit, now=0.0, describe=lambda r: {"id": str(r), "name": f"r{r}"})
    assert recorder.tick({}, 1.0, {4: RuleLoss(10, 7)}) is None
    room[0] = True
    record = recorder.tick({}, 2.0, {4: RuleLoss(5, 0), 6: RuleLoss(1)})
    assert record is not None and record["npaudit"]["loss"]["by_reason"] == []
    assert record["npaudit"]["loss"]["by_rule"] == [{"rule": {"id": "4", "name": "r4"}, "count": 15, "meter": 7},
                                                    {"rule": {"id": "6", "name": "r6"}, "count": 1}]
    assert "15 of rule r4 (id 4, 7 by its own meter)" in record["message"]
    assert recorder.tick({}, 3.0, {}) is None  # stated once


def meter_reply(drops: dict[int, int], age: int = 1) -> bytes:
    """OFPMP_METER reply: each meter id with its band's dropped packets, made `age` seconds ago."""
    body = b"".join(struct.pack("!IH6xIQQIIQQ", m, 56, 0, 0, 0, age, 0, n, 0) for m, n in drops.items())
    return struct.pack("!BBHIHH4x", ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, 16 + len(body), 1,
                       ofp.OFPMP_METER_STATS, 0) + body


class FlowChannel:
    """Answers flow description requests with `flows` (a reply) and meter statistics requests with `meters`."""

    def __init__(self, meters: bool = False) -> None:
        self.ready = True
        self.meter_support = MeterSupport(max_meter=64, band_types=1 << ofp.OFPMBT_DROP, max_bands=1) \
            if meters else None
        self.flows = with_counts(0, 0)
        self.meters: dict[int, int] = {}
        self.meter_age = 1
        self.read: list[Any] = []  # called between replies (as packet-ins are, while a reply is awaited)

    async def multipart(self, msg: Any) -> list[bytes]:
        for step in self.read:
            step()
        if type(msg).__name__ == "OFPMeterStatsRequest":
            return [meter_reply(self.meters, self.meter_age)]
        return [self.flows]


class OwnMeters:
    """Per-rule meters: rule A has meter 100 (deny class), rule B none."""

    range = RuleMeterRange(100, 10)

    def class_of(self, meter_id: int) -> int | None:
        return METER_POLICY_DENY if meter_id == 100 else None

    def meter_of_rule(self) -> dict[int, int]:
        return {RULE_A: 100}

    async def sweep(self, present: list[int]) -> None:
        return None


def test_with_per_rule_meters_a_rules_loss_says_what_its_own_meter_dropped() -> None:
    channel, mono, wall = FlowChannel(meters=True), ManualClock(0.0), ManualClock(1_700_000_000.0)
    records: list[dict[str, Any]] = []
    seen = {RULE_A: 0, RULE_B: 0}
    acc = LossAccounting(channel, interval=1.0, admission=lambda: {}, ovs_losses=lambda: {},
                         submit=lambda t: records.append(t.record()) or True, rule_seen=lambda: dict(seen),
                         mono_clock=mono, wall_clock=wall)
    acc.rule_meters = OwnMeters()

    async def windows() -> None:
        for now, counts, took, dropped in ((1.0, (0, 0), (0, 0), 0), (2.0, (2000, 300), (900, 200), 1000),
                                           (4.0, (2000, 300), (990, 250), 1000)):
            mono.now, wall.now = now, 1_700_000_000.0 + now
            channel.flows, channel.meters = with_counts(*counts), {METER_POLICY_DENY: 0, 100: dropped}
            channel.meter_age = int(now)  # both meters made at 0, as the agent started
            seen[RULE_A], seen[RULE_B] = took
            await acc.tick()

    asyncio.run(windows())
    stated = {item["rule"]["id"]: item for r in records for item in r["npaudit"]["loss"].get("by_rule", ())}
    assert stated == {str(RULE_A): {"rule": {"id": str(RULE_A)}, "count": 1010, "meter": 1000},
                      str(RULE_B): {"rule": {"id": str(RULE_B)}, "count": 50}}


def test_each_window_states_the_loss_of_each_rule_its_flows_show() -> None:
    channel, mono, wall = FlowChannel(), ManualClock(0.0), ManualClock(1_700_000_000.0)
    records: list[dict[str, Any]] = []
    seen = {RULE_A: 0, RULE_B: 0}
    acc = LossAccounting(channel, interval=1.0, admission=lambda: {}, ovs_losses=lambda: {},
                         submit=lambda t: records.append(t.record()) or True, rule_seen=lambda: dict(seen),
                         describe=lambda r: {"id": str(r), "name": {RULE_A: "a", RULE_B: "b"}[r]},
                         mono_clock=mono, wall_clock=wall)

    async def windows() -> None:
        for now, counts, took in ((1.0, (0, 0), (0, 0)), (2.0, (2000, 300), (900, 300)),
                                  (4.0, (2000, 300), (950, 300)), (6.0, (2000, 300), (950, 300))):
            mono.now, wall.now = now, 1_700_000_000.0 + now
            channel.flows = with_counts(*counts)
            seen[RULE_A], seen[RULE_B] = took
            await acc.tick()

    asyncio.run(windows())
    stated = [item for r in records for item in r["npaudit"]["loss"]["by_rule"]]
    assert stated == [{"rule": {"id": str(RULE_A), "name": "a"}, "count": 1050}]  # rule b lost nothing


NO_FLOWS = struct.pack("!BBHIHH4x", ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, 16, 1, ofp.OFPMP_FLOW_DESC, 0)


def test_the_baseline_before_the_policy_makes_a_flood_under_way_at_the_first_window_count_whole() -> None:
    """The agent reads the baseline before its policy flows exist; the first window comes in mid-flood,
    while packet-ins keep arriving between the flows' reply and the count of those taken: the rule's loss,
    once quiet, is its flows' count less what the trail took, exactly."""
    channel, mono, wall = FlowChannel(meters=True), ManualClock(0.0), ManualClock(1_700_000_000.0)
    records: list[dict[str, Any]] = []
    seen = {RULE_A: 0}
    acc = LossAccounting(channel, interval=1.0, admission=lambda: {}, ovs_losses=lambda: {},
                         submit=lambda t: records.append(t.record()) or True, rule_seen=lambda: dict(seen),
                         mono_clock=mono, wall_clock=wall)
    channel.flows, channel.meters = NO_FLOWS, {METER_POLICY_DENY: 0}

    def arrive() -> None:  # 40 more packet-ins taken while each reply is awaited
        seen[RULE_A] += 40

    async def windows() -> None:
        await acc.baseline()
        channel.read.append(arrive)
        for now, count, took in ((1.0, 700, 300), (2.0, 2000, 800), (4.0, 2000, 900), (6.0, 2000, 900)):
            mono.now, wall.now = now, 1_700_000_000.0 + now
            channel.flows, seen[RULE_A] = with_counts(count, 0), took
            await acc.tick()
        channel.read.clear()
        mono.now = wall.now = 8.0
        await acc.tick()

    asyncio.run(windows())
    stated = sum(item["count"] for r in records for item in r["npaudit"]["loss"].get("by_rule", ()))
    assert stated == 2000 - (900 + 2 * 40)  # the flows' count less what the trail took, in full


def test_a_per_rule_meter_a_restart_found_counts_from_its_first_reading_one_made_since_in_full() -> None:
    channel, mono = FlowChannel(meters=True), ManualClock(100.0)
    acc = LossAccounting(channel, interval=1.0, admission=lambda: {}, ovs_losses=lambda: {},
                         rule_seen=lambda: {}, mono_clock=mono)
    acc.rule_meters = OwnMeters()

    async def read(now: float, drops: int, age: int) -> None:
        mono.now, channel.meters, channel.meter_age = now, {100: drops}, age
        await acc.read_meters()

    asyncio.run(read(101.0, 500, 60))  # made 60 s ago, before this agent: the old run's drops
    asyncio.run(read(102.0, 520, 61))
    assert acc.own_meter_drops == {100: 20}
    acc2 = LossAccounting(channel, interval=1.0, admission=lambda: {}, ovs_losses=lambda: {},
                          rule_seen=lambda: {}, mono_clock=mono)
    acc2.rule_meters, acc = OwnMeters(), acc2
    asyncio.run(read(104.0, 30, 2))  # made after this agent started (at 102): all its drops are this run's
    assert acc2.own_meter_drops == {100: 30}
