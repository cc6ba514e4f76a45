"""What an audit record reads about rules and Pods (auditlog/record.py): the views the agent's rule table
and Pod directory fit, so the record needs nothing of policy_agent."""

from __future__ import annotations

import enum
from typing import Mapping, Protocol


class RuleView(Protocol):
    """What the record needs to know about a rule (policy_agent.policy.rules.RuleInfo fits)."""

    @property
    def ruleset(self) -> str: ...
    @property
    def policy_kind(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def policy_name(self) -> str: ...
    @property
    def rule_name(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def priority(self) -> float | None: ...
    @property
    def action(self) -> str | enum.Enum: ...  # "Allow"... or an enum whose .value is
    @property
    def direction(self) -> str | enum.Enum: ...  # "ingress"/"egress" or an enum whose .value is
    @property
    def log_label(self) -> str: ...


class RuleLookup(Protocol):
    def get(self, rule_id: int) -> RuleView | None: ...


class PodDirectory(Protocol):
    def by_ip(self, ip: str) -> tuple[str, str] | None:
        """(namespace, name) of the Pod that has this address, if any."""
        ...


class PodTable(PodDirectory, Protocol):
    """A PodDirectory that can also hand out its whole address table: a mapping never changed once
    handed out (a change of Pods makes a new one), so whatever was worked out from one table holds
    while `ip_table()` returns that same object."""

    def ip_table(self) -> Mapping[str, tuple[str, str]]: ...
