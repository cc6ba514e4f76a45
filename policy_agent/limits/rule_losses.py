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
"""

from __future__ import annotations

from collections import deque
from typing import Mapping, Protocol


class RuleLossLedger:
    """Turns per-rule flow totals and per-rule `seen` counts into the loss newly stated per rule each window."""

    def __init__(self, settle: float) -> None:
        self.settle = settle
        self._snapshots: deque[tuple[float, dict[int, int]]] = deque()  # (monotonic time, flow totals)
        self._seen_base: dict[int, int] | None = None
        self.stated: dict[int, int] = {}  # rule id -> loss stated so far (cumulative)

    def tick(self, flows: Mapping[int, int], seen: Mapping[int, int], now: float) -> dict[int, int]:
        """Flow totals read now (RuleFlowTotals.totals, 0-based at the first reading) and `seen` now
        (cumulative since the agent started); returns {rule id: loss newly stated}."""
        if self._seen_base is None:  # the flows' first reading is their baseline: seen's too
            self._seen_base = dict(seen)
            self._snapshots.append((now, dict(flows)))
            return {}
        self._snapshots.append((now, dict(flows)))
        settled = None
        while self._snapshots and now - self._snapshots[0][0] >= self.settle:
            settled = self._snapshots.popleft()
        if settled is not None:  # the newest old enough stays the oldest kept, for the next window
            self._snapshots.appendleft(settled)
        if settled is None:
            return {}
        base, out = self._seen_base, {}
        for rule_id, matched in settled[1].items():
            lost = matched - (seen.get(rule_id, 0) - base.get(rule_id, 0))
            before = self.stated.get(rule_id, 0)
            if lost > before:
                out[rule_id] = lost - before
                self.stated[rule_id] = lost
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
