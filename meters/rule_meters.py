"""Per-rule fair OVS meters (OVN's ACL `fair=true`): which meter id each logged rule's controller copies use.

With one meter per disposition class, a flood on one logged Drop rule uses up the
whole deny budget in OVS, and a quiet Pod's Drop on another rule never reaches the
agent. With per-rule meters on, every rule that sends to the agent gets a meter of
its own from a reserved id range, with its class's rate and burst.

Pure: the compiler's layout asks a MeterAllocator for each rule, in evaluation
order, and the RuleMeterPlan it ends with goes to the next layout.

- Stable: a rule keeps its meter id for as long as it exists (with the previous plan).
- Reuse: an id freed by a rule that went is free again from the next change on, never
  within the same change (its old flows are still in OVS until the bundle commits).
- Exhaustion: a rule that finds no free id shares its class meter (as with per-rule
  meters off) and is counted in `shared`; it gets its own id at a later change when
  one is free. Rules earlier in evaluation order are served first. Refusing the
  policy instead would make enforcement depend on audit capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from meters.ovs import METER_POLICY_ALLOW, METER_POLICY_DENY, METER_TRACEFLOW, MeterLimits, MeterSpec

OFPM_MAX = 0xFFFF0000  # the highest meter id OpenFlow allows


@dataclass(frozen=True, slots=True)
class RuleMeterRange:
    """The reserved meter ids id_base .. id_base + count - 1."""

    id_base: int
    count: int

    def __post_init__(self) -> None:
        if not (METER_TRACEFLOW < self.id_base and self.count >= 1 and self.id_base + self.count - 1 <= OFPM_MAX):
            raise ValueError(f"per-rule meter range {self.id_base}+{self.count} overlaps the class meters "
                             f"or passes {OFPM_MAX}")

    def __contains__(self, meter_id: object) -> bool:
        return isinstance(meter_id, int) and self.id_base <= meter_id < self.id_base + self.count


@dataclass(frozen=True)
class RuleMeterPlan:
    """rule id -> (its own meter id, the class meter it copies); and the rules that wanted
    one when the range was used up (they use their class meter)."""

    own: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    shared: tuple[int, ...] = ()

    def specs(self, limits: MeterLimits) -> dict[int, MeterSpec]:
        """The meters this plan needs in OVS, each with its class's rate and burst."""
        by_class = {METER_POLICY_ALLOW: limits.policy_allow, METER_POLICY_DENY: limits.policy_deny}
        return {meter: MeterSpec(meter, *by_class[cls]) for meter, cls in self.own.values()}

    def classes(self) -> dict[int, int]:
        """meter id -> class meter id."""
        return dict(self.own.values())


EMPTY_PLAN = RuleMeterPlan()


class MeterAllocator:
    """One layout's allocation: `take` for every rule in evaluation order, then `plan()`."""

    def __init__(self, rng: RuleMeterRange | None, previous: RuleMeterPlan | None = None) -> None:
        self._range = rng
        self._prev = previous.own if previous is not None else {}
        self._held = {meter for meter, _ in self._prev.values()}  # not given to another rule in this change
        self._next = rng.id_base if rng is not None else 0
        self._own: dict[int, tuple[int, int]] = {}
        self._shared: list[int] = []

    def take(self, rule_id: int, allow: bool, sends: bool) -> int | None:
        """The meter of a rule whose controller copies are `allow` (else deny class), or None:
        it sends nothing (`sends` False), per-rule meters are off, or none is free (shared)."""
        if self._range is None or not sends:
            return None
        cls = METER_POLICY_ALLOW if allow else METER_POLICY_DENY
        was = self._prev.get(rule_id)
        meter = was[0] if was is not None else self._free()
        if meter is None:
            self._shared.append(rule_id)
            return None
        self._own[rule_id] = (meter, cls)
        return meter

    def same(self, rule_id: int) -> bool:
        """True if the rule's meter is the one the previous plan gave it (its actions are unchanged)."""
        was = self._prev.get(rule_id)
        now = self._own.get(rule_id)
        return (was and was[0]) == (now and now[0])

    def _free(self) -> int | None:
        assert self._range is not None
        end = self._range.id_base + self._range.count
        while self._next < end and self._next in self._held:
            self._next += 1
        if self._next >= end:
            return None
        self._next += 1
        return self._next - 1

    def plan(self) -> RuleMeterPlan:
        return RuleMeterPlan(self._own, tuple(self._shared)) if self._range is not None else EMPTY_PLAN
