"""Per-rule fair meters (meters.per_rule): id allocation in the compiler, and the meter lifecycle around
the engine's bundles (added before the flows that use them, deleted after those flows are gone)."""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable, Sequence

import pytest

from meters.ovs import METER_POLICY_ALLOW, METER_POLICY_DENY, MeterLimits, MeterSpec, MeterSupport
from meters.rule_meters import EMPTY_PLAN, MeterAllocator, RuleMeterRange
from meters.stats import MeterReading, MeterTotals
from packetin import messages
from packetin.errors import OpenFlowError
from policy_agent.config import loader as config
from policy_agent.engine import ApplyFailed, PolicyEngine
from policy_agent.policy import incremental
from policy_agent.policy.compiler import ClusterState
from policy_agent.policy.model import (Action, AppliedTo, Direction, LabelSelector, Namespace, Pod, Policy,
                                        PolicyKind, Rule)
from policy_agent.policy.rules import RuleRegistry
from policy_agent.limits.meter_sync import RuleMeters, effective_range

LIMITS = MeterLimits(policy_allow=(1000, 200), policy_deny=(50, 20), traceflow=(500, 200))
RANGE = RuleMeterRange(4096, 3)
WEB = Pod("x", "w", (("app", "web"),))  # known to the engine: rules that select it have flows


def policy(name: str, action: Action = Action.DROP, logged: bool = True, rules: int = 1) -> Policy:
    return Policy(PolicyKind.ACNP, name, tier="application", priority=1,
                  applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "web"),))),),
                  rules=tuple(Rule(Direction.INGRESS, action, name=f"r{i}", enable_logging=logged)
                              for i in range(rules)))


def state(*policies: Policy, rng: RuleMeterRange | None = RANGE, meters: bool = True) -> ClusterState:
    return ClusterState({"x": Namespace("x")}, (), tuple(policies), meters=meters, rule_meters=rng, pods=(WEB,))


def controller_meters(snap: incremental.Snapshot) -> dict[str, int | None]:
    """rule "policy/rule name" -> the meter its controller action names (absent: no controller action)."""
    out = {}
    for placed in snap.placed.values():
        for action in placed.actions:
            if isinstance(action, messages.Controller):
                out[f"{placed.policy.name}/{placed.rule.name}"] = action.meter_id
    return out


# --- allocation ------------------------------------------------------------------------------


def test_each_rule_that_sends_to_the_agent_gets_its_own_meter_from_the_range_with_its_class_rate() -> None:
    snap, _ = incremental.update(None, state(policy("d", rules=2), policy("a", Action.ALLOW),
                                             policy("quiet", Action.ALLOW, logged=False)))
    got = controller_meters(snap)
    assert sorted(v for v in got.values()) == [4096, 4097, 4098]
    assert "quiet/r0" not in got  # an unlogged Allow sends nothing to the agent: no meter
    specs = snap.layout.meters.specs(LIMITS)
    assert specs[got["a/r0"]] == MeterSpec(got["a/r0"], 1000, 200)  # the allow class's rate and burst
    assert specs[got["d/r0"]] == MeterSpec(got["d/r0"], 50, 20)  # the deny class's
    assert snap.layout.meters.classes()[got["d/r1"]] == METER_POLICY_DENY


def test_an_unlogged_reject_gets_a_meter_too_and_per_rule_off_keeps_the_class_meters() -> None:
    snap, _ = incremental.update(None, state(policy("rej", Action.REJECT, logged=False), policy("a", Action.ALLOW)))
    assert controller_meters(snap) == {"a/r0": 4096, "rej/r0": 4097}  # in evaluation order (by name here)
    off, _ = incremental.update(None, state(policy("rej", Action.REJECT, logged=False), policy("a", Action.ALLOW),
                                            rng=None))
    assert controller_meters(off) == {"rej/r0": METER_POLICY_DENY, "a/r0": METER_POLICY_ALLOW}
    assert off.layout.meters is EMPTY_PLAN
    nometers, _ = incremental.update(None, state(policy("a", Action.ALLOW), meters=False))
    assert controller_meters(nometers) == {"a/r0": None}  # no datapath meters: unmetered, as before


def test_a_rule_keeps_its_meter_while_it_exists_and_a_freed_id_is_reused_only_from_the_next_change() -> None:
    first, _ = incremental.update(None, state(policy("p1"), policy("p2")))
    before = controller_meters(first)
    # p1 goes and p3 comes in the same change: p3 must not take p1's id (p1's flows are in OVS until the bundle).
    second, delta = incremental.update(first, state(policy("p2"), policy("p3")))
    after = controller_meters(second)
    assert after["p2/r0"] == before["p2/r0"]  # stable
    assert after["p3/r0"] not in before.values()
    assert not any(a.meter_id == after["p2/r0"] for f in delta.added for a in f.actions
                   if isinstance(a, messages.Controller))  # p2's flows were left alone
    # One change later, p1's old id is free again.
    third, _ = incremental.update(second, state(policy("p2"), policy("p3"), policy("p4")))
    assert controller_meters(third)["p4/r0"] == before["p1/r0"]
    assert {k: v for k, v in controller_meters(third).items() if k != "p4/r0"} == after


def test_when_the_range_is_used_up_further_rules_share_their_class_meter_until_an_id_is_free() -> None:
    snap, _ = incremental.update(None, state(policy("a", rules=2), policy("b", rules=2)))
    # Rules earlier in evaluation order are served first; the last one shares the deny meter.
    assert controller_meters(snap) == {"a/r0": 4096, "a/r1": 4097, "b/r0": 4098, "b/r1": METER_POLICY_DENY}
    assert len(snap.layout.meters.shared) == 1
    # Policy a goes: its ids are not reused in that change (its flows are in OVS until the bundle) ...
    s2, _ = incremental.update(snap, state(policy("b", rules=2)))
    assert controller_meters(s2) == {"b/r0": 4098, "b/r1": METER_POLICY_DENY}
    # ... but at the next change the shared rule gets its own meter, and its flows are rebuilt with it.
    s3, delta = incremental.update(s2, state(policy("b", rules=2), policy("c", Action.ALLOW, logged=False)))
    assert controller_meters(s3) == {"b/r0": 4098, "b/r1": 4096}
    assert s3.layout.meters.shared == ()
    assert any(a.meter_id == 4096 for f in delta.added for a in f.actions if isinstance(a, messages.Controller))


def test_the_allocator_takes_the_lowest_free_id_and_skips_the_ids_of_the_previous_plan() -> None:
    prev = MeterAllocator(RuleMeterRange(10, 4))
    assert [prev.take(r, False, True) for r in (1, 2, 3)] == [10, 11, 12]
    alloc = MeterAllocator(RuleMeterRange(10, 4), prev.plan())
    assert alloc.take(3, True, True) == 12 and alloc.same(3)  # kept, even with a new class
    assert alloc.take(9, False, True) == 13  # 10 and 11 are held by rules 1, 2 of the previous plan
    assert alloc.take(8, False, True) is None and alloc.plan().shared == (8,)
    assert alloc.take(7, False, False) is None and alloc.plan().shared == (8,)  # sends nothing: wants none
    assert alloc.plan().classes() == {12: METER_POLICY_ALLOW, 13: METER_POLICY_DENY}


@pytest.mark.parametrize("base, count", [(3, 1), (1, 5), (4, 0), (0xFFFF0000, 2)])
def test_a_range_over_the_class_meters_or_past_openflows_last_id_is_refused(base: int, count: int) -> None:
    with pytest.raises(ValueError):
        RuleMeterRange(base, count)


def test_the_config_section_is_off_by_default_and_bounded() -> None:
    cfg = config.loads("")
    assert (cfg.meters.per_rule.enabled, cfg.meters.per_rule.id_base, cfg.meters.per_rule.max) == (False, 4096, 1024)
    on = config.loads("meters: {per_rule: {enabled: true, id_base: 100, max: 10}}").meters.per_rule
    assert (on.enabled, on.id_base, on.max) == (True, 100, 10)
    for bad, field in (("id_base: 3", "meters.per_rule.id_base"), ("max: 0", "meters.per_rule.max"),
                       ("max: 262145", "meters.per_rule.max")):
        with pytest.raises(config.ConfigError) as err:
            config.loads(f"meters: {{per_rule: {{{bad}}}}}")
        assert field in str(err.value)


def test_a_range_larger_than_the_datapath_holds_is_cut_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        rng = effective_range(4096, 5000, MeterSupport(max_meter=1024, band_types=2, max_bands=1))
    assert rng == RuleMeterRange(4096, 1021)  # beside the three class meters
    assert "only 1021 per-rule meters" in caplog.text
    assert effective_range(4096, 10, MeterSupport(max_meter=1024, band_types=2, max_bands=1)).count == 10


# --- lifecycle ------------------------------------------------------------------------------


class Switch:
    """A FlowProgrammer and meter channel recording every call in order; `refuse_commit` fails bundles."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.meters: dict[int, MeterSpec] = {}
        self.refuse_commit = False

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        self.calls.append(("flows", len(flows)))

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        self.calls.append(("delete-flows", len(flows)))

    async def commit_flows(self, install: Sequence[messages.FlowSpec], delete: Sequence[messages.FlowSpec]) -> None:
        if self.refuse_commit:
            raise OpenFlowError("switch refused the bundle", err_type=1, err_code=1, xid=1, failed="bundle")
        named = sorted({a.meter_id for f in install for a in f.actions
                        if isinstance(a, messages.Controller) and a.meter_id})
        assert all(m in self.meters for m in named if m >= RANGE.id_base), "a flow names a meter not added yet"
        self.calls.append(("commit", named))

    async def install_meters(self, meters: Sequence[MeterSpec]) -> None:
        self.meters.update((m.meter_id, m) for m in meters)
        self.calls.append(("add-meters", sorted(m.meter_id for m in meters)))

    async def delete_meters(self, meter_ids: Iterable[int]) -> None:
        ids = sorted(meter_ids)
        for m in ids:
            self.meters.pop(m, None)
        self.calls.append(("delete-meters", ids))


def engine(sw: Switch) -> tuple[PolicyEngine, RuleMeters]:
    rm = RuleMeters(sw, RANGE, LIMITS)

    async def reading() -> None:
        sw.calls.append(("read-stats", sorted(sw.meters)))
    rm.before_delete = reading
    return PolicyEngine(sw, RuleRegistry(), round_=1, meters=lambda: True, rule_meters=rm), rm


def test_meters_are_added_before_the_bundle_that_uses_them_and_deleted_after_the_bundle_that_removed_them() -> None:
    async def main() -> None:
        sw = Switch()
        eng, rm = engine(sw)
        await eng.apply(namespaces=[Namespace("x")], pods=[WEB], policies=[policy("p1"), policy("p2")])
        assert sw.calls == [("add-meters", [4096, 4097]), ("commit", [4096, 4097])]
        assert sw.meters[4096] == MeterSpec(4096, 50, 20) and rm.in_use == 2
        sw.calls.clear()
        await eng.delete(policies=[policy("p1")])
        # The flows go in the bundle; then the meter's last drop counts are read; then it is deleted.
        assert sw.calls == [("commit", []), ("read-stats", [4096, 4097]), ("delete-meters", [4096])]
        assert rm.class_of(4096) is None and rm.class_of(4097) == METER_POLICY_DENY
        sw.calls.clear()
        await eng.apply(policies=[policy("p3")])  # takes the id freed by the previous change
        assert sw.calls == [("add-meters", [4096]), ("commit", [4096])]
    asyncio.run(main())


def test_a_refused_bundle_leaves_no_meter_behind_and_the_meters_in_force_untouched() -> None:
    async def main() -> None:
        sw = Switch()
        eng, rm = engine(sw)
        await eng.apply(namespaces=[Namespace("x")], pods=[WEB], policies=[policy("p1")])
        sw.calls.clear()
        sw.refuse_commit = True
        with pytest.raises(ApplyFailed):
            await eng.apply(policies=[policy("p2", rules=2)])
        assert sw.calls == [("add-meters", [4097, 4098]), ("read-stats", [4096, 4097, 4098]),
                            ("delete-meters", [4097, 4098])]
        assert sorted(sw.meters) == [4096] and rm.in_use == 1
        sw.refuse_commit = False
        sw.calls.clear()
        await eng.apply(policies=[policy("p2", rules=2)])
        assert sw.calls == [("add-meters", [4097, 4098]), ("commit", [4097, 4098])]
    asyncio.run(main())


def test_a_meter_whose_delete_failed_is_deleted_at_the_next_change(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        sw = Switch()
        eng, rm = engine(sw)
        await eng.apply(namespaces=[Namespace("x")], pods=[WEB], policies=[policy("p1"), policy("p2")])
        real = sw.delete_meters

        async def lost(ids: Iterable[int]) -> None:
            raise OpenFlowError("connection lost", err_type=0, err_code=0, xid=0, failed="delete")
        sw.delete_meters = lost  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING):
            await eng.delete(policies=[policy("p1")])  # the change stands; the meter holds no flows
        assert "1 meter(s) to delete" in caplog.text and rm.delete_failures == 1
        assert 4096 in sw.meters
        sw.delete_meters = real  # type: ignore[method-assign]
        sw.calls.clear()
        await eng.apply(policies=[policy("p3", Action.ALLOW, logged=False)])  # any later change
        assert ("delete-meters", [4096]) in sw.calls and sorted(sw.meters) == [4097]
    asyncio.run(main())


def test_the_range_running_out_is_warned_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        sw = Switch()
        eng, rm = engine(sw)
        with caplog.at_level(logging.WARNING):
            await eng.apply(namespaces=[Namespace("x")], pods=[WEB], policies=[policy("big", rules=5)])
            await eng.apply(policies=[policy("more")])
        assert rm.shared_rules == 3 and rm.in_use == 3
        assert caplog.text.count("all 3 meter ids from 4096 are in use") == 1
    asyncio.run(main())


def test_a_sweep_deletes_only_meters_of_the_range_that_the_agent_did_not_make() -> None:
    async def main() -> None:
        sw = Switch()
        eng, rm = engine(sw)
        await eng.apply(namespaces=[Namespace("x")], pods=[WEB], policies=[policy("p1")])
        sw.calls.clear()
        await rm.sweep([1, 2, 3, 4096, 4097, 4098, 9999])  # 4097, 4098: left by an earlier run
        assert sw.calls == [("delete-meters", [4097, 4098])] and rm.swept == 2
    asyncio.run(main())


# --- accounting ------------------------------------------------------------------------------


def test_per_rule_meter_drops_count_under_their_class_and_a_reused_id_counts_from_zero() -> None:
    classes = {4096: METER_POLICY_DENY, 4097: METER_POLICY_ALLOW}
    fold = lambda m: classes.get(m) if m >= 4096 else m  # noqa: E731
    totals = MeterTotals(started=100.0)
    totals.update([MeterReading(2, 5, 500, 20.0), MeterReading(4096, 7, 700, 1.0),
                   MeterReading(4097, 3, 300, 1.0), MeterReading(4098, 50, 5000, 1.0)], 110.0, fold)
    assert {m: d.packets for m, d in totals.totals().items()} == {METER_POLICY_ALLOW: 3, METER_POLICY_DENY: 7}
    totals.update([MeterReading(2, 9, 900, 21.0), MeterReading(4096, 10, 1000, 2.0)], 111.0, fold)
    assert totals.totals()[METER_POLICY_DENY].packets == 7 + 4 + 3  # meter 2 from its baseline (older than us)
    # 4096 deleted, then made again for an allow rule: a young meter, counted from zero under its new class.
    classes[4096] = METER_POLICY_ALLOW
    totals.update([MeterReading(4096, 2, 200, 0.5)], 120.0, fold)
    assert {m: d.packets for m, d in totals.totals().items()} == {METER_POLICY_ALLOW: 5, METER_POLICY_DENY: 14}


def test_a_refused_change_of_a_rules_class_puts_its_meters_rate_back() -> None:
    async def main() -> None:
        sw = Switch()
        eng, rm = engine(sw)
        await eng.apply(namespaces=[Namespace("x")], pods=[WEB], policies=[policy("p1")])
        assert sw.meters[4096] == MeterSpec(4096, 50, 20)
        sw.refuse_commit = True
        with pytest.raises(ApplyFailed):  # the same rule (same id and meter) turned Allow: the allow rate first
            await eng.apply(policies=[policy("p1", Action.ALLOW)])
        assert sw.meters[4096] == MeterSpec(4096, 50, 20) and rm.class_of(4096) == METER_POLICY_DENY
        sw.refuse_commit = False
        await eng.apply(policies=[policy("p1", Action.ALLOW)])
        assert sw.meters[4096] == MeterSpec(4096, 1000, 200) and rm.class_of(4096) == METER_POLICY_ALLOW
    asyncio.run(main())
