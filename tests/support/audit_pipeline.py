"""A recording writer, a record context and packet-ins for driving an AuditPipeline in tests."""

from __future__ import annotations

from typing import Any

from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from auditlog.chain import GENESIS, RecordText  # noqa: E402
from auditlog.record import RecordContext  # noqa: E402
from packetin.model import PacketIn  # noqa: E402
from policy_agent.policy.model import Action, Direction  # noqa: E402
from policy_agent.policy.rules import RuleInfo, RuleRegistry  # noqa: E402

RULE = RuleInfo(rule_id=7, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="p", rule_name="r",
                tier="securityops", priority=1.0, action=Action.DROP, direction=Direction.INGRESS, log_label="",
                logged=True)


MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}


class Pods:
    def by_ip(self, ip: str) -> None:
        return None


class Writer:
    def __init__(self, room: int = 10**9) -> None:
        self.records: list[RecordText] = []
        self.room = room

    def submit(self, record: Any) -> bool:
        if len(self.records) >= self.room:
            return False
        self.records.append(record)
        return True

    def packets(self) -> int:
        total, chain = 0, GENESIS
        for seq, text in enumerate(self.records, 1):
            text.seal(chain, seq)
            total += text.record()["npaudit"]["aggregate"]["packets"]
        return total


def context() -> RecordContext:
    rules = RuleRegistry()
    rules.replace({RULE.rule_id: RULE})
    return RecordContext(node="n", rules=rules, pods=Pods())


def pin(frame: bytes, at: float, disposition: int = 1) -> PacketIn:
    return PacketIn(reason=0, table_id=40, cookie=1, in_port=1, rule_id=RULE.rule_id, reg7=disposition,
                    userdata=b"", packet=frame, total_len=len(frame), received_at=at)


def udp_to(port: int) -> bytes:
    return bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1000, dport=port))
