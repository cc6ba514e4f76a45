"""A queue backlog, an Overload on it and drop packet-ins, for tests of the pipeline in overload."""

from __future__ import annotations

from scapy.layers.inet import IP, TCP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from auditlog.overload import Overload  # noqa: E402
from auditlog.record import RecordContext  # noqa: E402
from packetin.model import PacketIn  # noqa: E402
from policy_agent.policy.model import Action, Direction  # noqa: E402
from policy_agent.policy.rules import RuleInfo, RuleRegistry  # noqa: E402

MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}
INGRESS_DROP = RuleInfo(rule_id=7, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="p",
                        rule_name="r", tier="securityops", priority=1.0, action=Action.DROP,
                        direction=Direction.INGRESS, log_label="", logged=True)


DROP = 1


class Pods:
    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return {"10.0.0.2": ("backend", "db")}.get(ip)


def context() -> RecordContext:
    rules = RuleRegistry()
    rules.replace({INGRESS_DROP.rule_id: INGRESS_DROP})
    return RecordContext(node="n", rules=rules, pods=Pods())


def pin(src: str, sport: int, dport: int, at: float, disposition: int = DROP, tcp: bool = False) -> PacketIn:
    l4 = TCP(sport=sport, dport=dport) if tcp else UDP(sport=sport, dport=dport)
    frame = bytes(Ether(**MAC) / IP(src=src, dst="10.0.0.2") / l4)
    return PacketIn(reason=0, table_id=40, cookie=1, in_port=1, rule_id=INGRESS_DROP.rule_id, reg7=disposition,
                    userdata=b"", packet=frame, total_len=len(frame), received_at=at)


class Backlog:
    def __init__(self) -> None:
        self.fill = 0.0

    def __call__(self) -> float:
        return self.fill


def overload(backlog: Backlog) -> Overload:
    return Overload(backlog, high_mark=0.5, peers_mark=0.8, low_mark=0.1)
