"""Per-rule fair meters on the bridge (meters.per_rule): added before the flows that use them, deleted after.

The compiler decides which meter id each rule uses (meters/rule_meters.py); this
keeps OVS in step with the engine's plan in force. OpenFlow bundles cannot carry
meter_mods in OVS, so meters go outside the bundle:

- `prepare(plan)`, before the bundle: every meter the new plan names exists, with its
  class's rate and burst (ADD, or MODIFY when it exists).
- `settle(plan)`, once the change ended, committed or not, with the plan then in
  force: our meters it does not name are deleted (their flows are gone: the bundle
  removed them, or never put them in), after one last reading of their drop counts.
  OVS deletes the flows that use a meter it deletes: that is why deletes only ever
  come after the flows.

A delete that fails (connection lost) leaves the meter in OVS holding no flows; the
channel replays it after a reconnect, and the next settle deletes it. Meters of the
range that OVS has and we never made (left by an earlier agent run, whose flows the
agent deletes at start) are deleted by `sweep`, with each periodic meter-statistics reading
(which starts only once those flows are gone).
The channel replays the meters it confirmed after an OVS restart, as the class meters.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Iterable, Iterator, Protocol, Sequence

from prometheus_client.core import GaugeMetricFamily

from meters.ovs import MeterLimits, MeterSpec, MeterSupport
from meters.rule_meters import EMPTY_PLAN, RuleMeterPlan, RuleMeterRange
from packetin.errors import PacketInError

log = logging.getLogger(__name__)

CLASS_METERS = 3  # policy_allow, policy_deny, traceflow: ids 1..3


class MeterProgrammer(Protocol):
    """The OpenFlow channel as far as meters go (packetin.channel.OpenFlowChannel)."""

    async def install_meters(self, meters: Sequence[MeterSpec]) -> None: ...

    async def delete_meters(self, meter_ids: Iterable[int]) -> None: ...


class RuleMeters:
    """The per-rule meters this agent put on the bridge. `before_delete` (the loss accounting's
    meter reading) runs before meters are deleted, so their last drops are counted."""

    def __init__(self, channel: MeterProgrammer, rng: RuleMeterRange, limits: MeterLimits, *,
                 before_delete: Callable[[], Awaitable[None]] | None = None) -> None:
        self.range = rng
        self._channel = channel
        self._limits = limits
        self.before_delete = before_delete
        self._ours: dict[int, MeterSpec] = {}  # made (or being made) and not confirmed deleted
        self._classes: dict[int, int] = {}  # meter id -> class meter id, of every meter in _ours
        self._plan = EMPTY_PLAN  # in force
        self._dirty = False  # OVS may hold meters (or rates) other than the plan in force says
        self.shared_rules = 0  # rules on their class meter for want of a free id
        self.delete_failures = 0
        self.swept = 0

    @property
    def in_use(self) -> int:
        return len(self._plan.own)

    def meter_of_rule(self) -> dict[int, int]:
        """rule id -> its own meter id, in the plan in force."""
        return {rule_id: meter for rule_id, (meter, _) in self._plan.own.items()}

    def class_of(self, meter_id: int) -> int | None:
        """The class meter a per-rule meter copies; None for one not ours (or not per-rule)."""
        return self._classes.get(meter_id)

    async def prepare(self, plan: RuleMeterPlan) -> None:
        """Before the flows of `plan` go in: its meters exist. Raises what the channel raises."""
        if plan is self._plan:
            return
        specs = plan.specs(self._limits)
        new = [spec for meter, spec in specs.items() if self._ours.get(meter) != spec]
        # Known before they are sent: a sweep running meanwhile never deletes them.
        self._ours.update((s.meter_id, s) for s in new)
        self._classes.update(plan.classes())
        self._dirty = True
        if new:
            await self._channel.install_meters(new)

    async def settle(self, plan: RuleMeterPlan | None) -> None:
        """`plan` is in force (None: nothing compiled yet): delete our meters it does not name, put
        back a meter whose rate a change that failed altered. Failures are logged, retried next time."""
        plan = plan or EMPTY_PLAN
        if plan is self._plan and not self._dirty:
            return
        if plan.shared and not self._plan.shared:
            log.warning("meters.per_rule: all %d meter ids from %d are in use: %d rule(s) share their class "
                        "meter (npaudit_meter_per_rule_shared_rules); raise meters.per_rule.max",
                        self.range.count, self.range.id_base, len(plan.shared))
        elif self._plan.shared and not plan.shared:
            log.info("meters.per_rule: every rule that sends to the agent has a meter of its own again")
        self._plan, self.shared_rules = plan, len(plan.shared)
        specs = plan.specs(self._limits)
        back = [spec for meter, spec in specs.items() if self._ours.get(meter) != spec]
        gone = [meter for meter in self._ours if meter not in specs]
        try:
            if back:
                await self._channel.install_meters(back)
                self._ours.update((s.meter_id, s) for s in back)
                self._classes.update(plan.classes())
            if gone:
                await self._delete(gone)
            self._dirty = False
        except (PacketInError, asyncio.TimeoutError) as exc:
            self.delete_failures += 1
            log.warning("meters.per_rule: OVS not brought in line with the rules in force yet (%s): %d meter(s) "
                        "to delete, holding no flows, %d to restore; retried at the next policy change",
                        exc or type(exc).__name__, len(gone), len(back))

    async def sweep(self, present: Iterable[int]) -> None:
        """Delete meters of the range that OVS has (`present`, a statistics reading) and we did not
        make. Decided and sent without yielding in between: a `prepare` that takes one of these ids
        later sends its ADD after our DELETE."""
        stray = [meter for meter in present if meter in self.range and meter not in self._ours]
        if not stray:
            return
        try:
            await self._channel.delete_meters(stray)
        except (PacketInError, asyncio.TimeoutError) as exc:
            log.warning("meters.per_rule: %d meter(s) left by an earlier run not deleted: %s", len(stray), exc)
            return
        self.swept += len(stray)
        log.info("meters.per_rule: deleted %d meter(s) of the range that no flow of this run uses", len(stray))

    async def _delete(self, gone: list[int]) -> None:
        if self.before_delete is not None:
            await self.before_delete()  # their flows are gone: these counts are final
        await self._channel.delete_meters(gone)
        for meter in gone:
            del self._ours[meter]
            self._classes.pop(meter, None)


def effective_range(id_base: int, count: int, support: MeterSupport | None) -> RuleMeterRange:
    """The configured range, cut to the meters the datapath holds beside the class meters (warned)."""
    room = (support.max_meter - CLASS_METERS) if support is not None else count
    if count > room:
        log.warning("meters.per_rule.max is %d but the datapath holds %d meters: only %d per-rule meters "
                    "(npaudit_meter_per_rule_ids)", count, support.max_meter if support else 0, max(room, 1))
        count = max(room, 1)
    return RuleMeterRange(id_base, count)


class RuleMetersCollector:
    """Gauges of the per-rule meters: ids in the range, in use, rules sharing their class meter."""

    def __init__(self, source: RuleMeters) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        src = self._source
        for name, text, value in (
            ("npaudit_meter_per_rule_ids", "Meter ids reserved for per-rule fair meters (meters.per_rule)",
             src.range.count),
            ("npaudit_meter_per_rule_in_use", "Per-rule fair meters in use (one per rule that sends to the agent)",
             src.in_use),
            ("npaudit_meter_per_rule_shared_rules", "Rules that share their class meter because every per-rule "
             "meter id is in use (0 unless meters.per_rule.max is too small)", src.shared_rules),
        ):
            yield GaugeMetricFamily(name, text, value=value)


class _Losses(Protocol):
    rule_meters: Any

    async def read_meters(self) -> None: ...


def build_rule_meters(enabled: bool, id_base: int, count: int, *, channel: MeterProgrammer, limits: MeterLimits,
                      support: MeterSupport | None, losses: _Losses, registry: Any) -> RuleMeters | None:
    """The agent's RuleMeters for meters.per_rule (None when off, or without datapath meters, which
    the agent has warned about), wired to the loss accounting and exported as metrics."""
    if not enabled or support is None or not support.supported:
        return None
    rule_meters = RuleMeters(channel, effective_range(id_base, count, support), limits,
                             before_delete=losses.read_meters)
    losses.rule_meters = rule_meters
    registry.register(RuleMetersCollector(rule_meters))
    log.info("meters.per_rule: a meter of its own for each rule that sends to the agent, ids %d..%d",
             rule_meters.range.id_base, rule_meters.range.id_base + rule_meters.range.count - 1)
    return rule_meters
