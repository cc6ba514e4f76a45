"""The rule registry: rule id (reg6) -> what the rule is, for the audit log; stable ids."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable

from policy_agent.policy.model import Action, Direction, Policy


@dataclass(frozen=True)
class RuleInfo:
    """Everything an audit record says about the rule that judged a packet."""

    rule_id: int
    policy_kind: str  # record's rule.ruleset prefix, e.g. AntreaClusterNetworkPolicy
    namespace: str
    policy_name: str
    rule_name: str
    tier: str
    priority: float
    action: Action
    direction: Direction
    log_label: str
    logged: bool

    @property
    def ruleset(self) -> str:
        where = f"{self.namespace}/{self.policy_name}" if self.namespace else self.policy_name
        return f"{self.policy_kind}:{where}"


def rule_key(policy: Policy, direction: Direction, rule_name: str) -> str:
    return "\x1f".join((policy.kind.value, policy.namespace, policy.name, direction.value, rule_name))


def allocate_ids(keys: Iterable[str]) -> dict[str, int]:
    """Stable 32-bit ids: a hash of the rule's identity, so the same policy revision
    gets the same ids after an agent restart. Collisions are resolved by rehashing
    in sorted key order, which is deterministic too. 0 is never used."""
    ids: dict[str, int] = {}
    used: set[int] = set()
    for key in sorted(set(keys)):
        salt = 0
        while True:
            digest = hashlib.blake2b(f"{salt}\x1e{key}".encode(), digest_size=4).digest()
            rid = int.from_bytes(digest, "big")
            if rid and rid not in used:
                break
            salt += 1
        ids[key] = rid
        used.add(rid)
    return ids


class RuleRegistry:
    """rule id -> RuleInfo; what auditlog's enrichment asks (`get`)."""

    def __init__(self) -> None:
        self._rules: dict[int, RuleInfo] = {}

    def replace(self, rules: dict[int, RuleInfo]) -> None:
        self._rules = dict(rules)

    def mapping(self) -> dict[int, RuleInfo]:
        """Rule id -> rule, as it is now: a new dict at each replace, never changed in place (the C record encoder
        keeps texts while this is the same object and the rule in it the same)."""
        return self._rules

    def get(self, rule_id: int) -> RuleInfo | None:
        return self._rules.get(rule_id)

    def direction(self, rule_id: int) -> str | None:
        """"ingress" or "egress" for a known rule id (the fair-share key asks once per rule)."""
        rule = self._rules.get(rule_id)
        return None if rule is None else str(getattr(rule.direction, "value", rule.direction)).lower()

    def __len__(self) -> int:
        return len(self._rules)

    def all(self) -> list[RuleInfo]:
        return list(self._rules.values())
