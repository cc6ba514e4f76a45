"""Rules, Pods and a record encoder for tests of the C record encoder (auditlog/_record_fast.c) against the Python one."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from auditlog.record import EventIds, RecordContext, RecordEncoder
from policy_agent.policy.model import Action, Direction
from policy_agent.policy.rules import RuleInfo, RuleRegistry

T0 = 1_800_000_000.5
V4 = ["10.10.1.5", "10.10.2.7", "10.10.3.10"]
ODD = "10.10.3.9"  # its Pod's names are not ASCII: the C part hands its records to Python
V6 = ["fd00:10:10:1::5", "fd00:10:10:2::7", "fe80::1"]
PODS = {"10.10.1.5": ("frontend", "client-7d9f"), "10.10.2.7": ("backend", "api-0"),
        "fd00:10:10:1::5": ("frontend", "client-7d9f"), "10.10.3.9": ("ns-ü", "pod-é")}


def rule(rule_id: int, *, name: str = "deny", tier: str = "securityops", namespace: str = "",
         direction: Direction = Direction.INGRESS, action: Action = Action.DROP, label: str = "") -> RuleInfo:
    return RuleInfo(rule_id=rule_id, policy_kind="AntreaClusterNetworkPolicy" if tier else "K8sNetworkPolicy",
                    namespace=namespace, policy_name="p", rule_name=name, tier=tier, priority=5.5 if tier else 0.0,
                    action=action, direction=direction, log_label=label, logged=True)


RULES = {r.rule_id: r for r in [
    rule(0x1001, label="db-guard"),
    rule(0x1002, namespace="frontend", direction=Direction.EGRESS, action=Action.ALLOW, tier="application"),
    rule(0x1003, tier="", namespace="backend"),
    rule(0x1004, name="règle"),  # non-ASCII: the C part hands these to Python
]}
RENAMED = {**RULES, 0x1001: rule(0x1001, name="deny-renamed", label="db-guard")}


class Pods:
    """A PodTable whose table a test swaps, as the engine does on a change of Pods."""

    def __init__(self) -> None:
        self.table: Mapping[str, tuple[str, str]] = MappingProxyType(dict(PODS))

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return self.table.get(ip)

    def ip_table(self) -> Mapping[str, tuple[str, str]]:
        return self.table


def encoder(rules: RuleRegistry, pods: Pods) -> RecordEncoder:
    ids = EventIds()
    ids._prefix = "0123456789abcdef"  # both encoders draw the same ids
    return RecordEncoder(RecordContext(node="node-a", cluster="c1", rules=rules, pods=pods, new_event_id=ids))
