"""Each logged rule's own loss: packets its flows matched in OVS minus the packet-ins of it the audit trail took.

`seen` counts, per rule, the packet-ins that reached the audit pipeline less the packets
of records the full writer refused (auditlog/pipeline.py): what the rule's records hold
or will hold once their window closes (eBPF-offloaded packets never match a flow and are
in neither side). Whatever else the flows matched was lost on the way: a meter band, the
controller queue of ovs-vswitchd, the agent's admission, or a refused record.

A window's flow counts run ahead of `seen` by the packet-ins still in flight (in
ovs-vswitchd's queue, the socket, the demux queue). So the loss stated at a window end
compares the flows as read at least `settle` seconds earlier with what has been seen
since: a lower bound, never more than the true loss so long as a packet-in reaches the
pipeline within `settle` of its flow counting it. Stated cumulatively, it only grows;
once traffic to the rule has stopped for `settle` seconds it is exact (the flows then
counted what they count now). What a rule lost in the last `settle` seconds before the
agent stops is not stated (its packet-ins may still be in the demux queue the agent
drains after the last window).

With per-rule meters (meters.per_rule) a rule's own meter drops are known exactly, and the
loss splits: `meter`, the meter's drops as read with the settled flows, and the rest (OVS's
controller queue, admission, a refused record), a lower bound of its own: flows - meter drops
- seen. Both only grow; once the rule is quiet both are exact.
"""

from __future__ import annotations

from collections import deque
from typing import Mapping, NamedTuple, Protocol


class RuleLoss(NamedTuple):
    """A rule's loss newly stated in a window; `meter`: the part its own meter dropped (None: not known)."""

    packets: int
    meter: int | None = None


class RuleLossLedger:
    """Turns per-rule flow totals and per-rule `seen` counts into the loss newly stated per rule each window."""

    def __init__(self, settle: float) -> None:
        self.settle = settle
        # (monotonic time, flow totals, own-meter drops) per reading
        self._snapshots: deque[tuple[float, dict[int, int], dict[int, int]]] = deque()
        self._seen_base: dict[int, int] | None = None
        self.stated: dict[int, int] = {}  # rule id -> loss stated so far (cumulative)
        self.stated_meter: dict[int, int] = {}  # of that, what its own meter dropped (rules with one)

    def tick(self, flows: Mapping[int, int], seen: Mapping[int, int], now: float,
             meters: Mapping[int, int] | None = None) -> dict[int, RuleLoss]:
        """Flow totals read now (RuleFlowTotals.totals, 0-based at the first reading), `seen` now
        (cumulative since the agent started) and the drops of the rules' own meters read just after
        the flows (0-based at the first reading); returns {rule id: loss newly stated}."""
        snapshot = (now, dict(flows), dict(meters or {}))
        if self._seen_base is None:  # the flows' first reading is their baseline: seen's too
            self._seen_base = dict(seen)
            self._snapshots.append(snapshot)
            return {}
        self._snapshots.append(snapshot)
        settled = None
        while self._snapshots and now - self._snapshots[0][0] >= self.settle:
            settled = self._snapshots.popleft()
        if settled is not None:  # the newest old enough stays the oldest kept, for the next window
            self._snapshots.appendleft(settled)
        if settled is None:
            return {}
        base, out = self._seen_base, {}
        _, matched_by_rule, metered = settled
        for rule_id, matched in matched_by_rule.items():
            took = seen.get(rule_id, 0) - base.get(rule_id, 0)
            before = self.stated.get(rule_id, 0)
            if rule_id not in metered:
                if matched - took > before:
                    out[rule_id] = RuleLoss(matched - took - before)
                    self.stated[rule_id] = matched - took
                continue
            meter_before = self.stated_meter.get(rule_id, 0)
            meter = max(meter_before, metered[rule_id])
            after = max(before - meter_before, matched - metered[rule_id] - took)  # after the meter
            if meter + after > before:
                out[rule_id] = RuleLoss(meter + after - before, meter - meter_before)
                self.stated[rule_id], self.stated_meter[rule_id] = meter + after, meter
        return out


class RuleDescription(Protocol):
    """What a loss record says of a rule (policy_agent.policy.rules.RuleInfo fits)."""

    @property
    def ruleset(self) -> str: ...
    @property
    def rule_name(self) -> str: ...
    @property
    def tier(self) -> str: ...


def describe_rule(rule_id: int, rule: RuleDescription | None) -> dict[str, str]:
    """The rule object of a loss record's by_rule item, named as in audit records (rule.id, name,
    ruleset, category = tier); just the id for a rule the registry no longer knows."""
    fields = {"id": str(rule_id)}
    if rule is not None:
        fields.update((k, v) for k, v in (("name", rule.rule_name), ("ruleset", rule.ruleset),
                                          ("category", rule.tier)) if v)
    return fields
