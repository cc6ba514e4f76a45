"""auditlog.record with a PodTable: the Pod texts kept per address pair give the same lines as a lookup per
record, and a change of Pods (a new table) is in the very next record: a name never outlives its Pod."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any, Mapping

from auditlog.chain import GENESIS
from auditlog.packet import decode_frame
from auditlog.record import RecordContext, RecordEncoder
from packetin.model import PacketIn
from policy_agent.policy.model import Action, Direction
from policy_agent.policy.rules import RuleInfo, RuleRegistry

T0 = 1_800_000_000.25
A, B, C = "10.10.1.5", "10.10.2.7", "10.10.3.9"
RULES = [RuleInfo(rule_id=0x1001 + i, policy_kind="AntreaClusterNetworkPolicy", namespace=ns, policy_name="p",
                  rule_name=f"r{i}", tier="securityops", priority=1.0, action=Action.DROP, direction=direction,
                  log_label="", logged=True)
         for i, (ns, direction) in enumerate([("", Direction.INGRESS), ("", Direction.EGRESS),
                                              ("frontend", Direction.EGRESS)])]


class Table:
    """A PodTable whose table a test swaps, as the engine does on a change of Pods."""

    def __init__(self, pods: dict[str, tuple[str, str]]) -> None:
        self.table: Mapping[str, tuple[str, str]] = MappingProxyType(dict(pods))
        self.lookups = 0

    def swap(self, pods: dict[str, tuple[str, str]]) -> None:
        self.table = MappingProxyType(dict(pods))

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        self.lookups += 1
        return self.table.get(ip)

    def ip_table(self) -> Mapping[str, tuple[str, str]]:
        return self.table


class Lookup:
    """A PodDirectory with by_ip only: the encoder looks every record's Pods up."""

    def __init__(self, table: Table) -> None:
        self._table = table

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return self._table.table.get(ip)


def encoder(pods: Any) -> RecordEncoder:
    rules = RuleRegistry()
    rules.replace({r.rule_id: r for r in RULES})
    return RecordEncoder(RecordContext(node="n", cluster="c", rules=rules, pods=pods,
                                       new_event_id=lambda: "0123456789abcdef0123456789abcdef"))


def udp(src: str, dst: str, dport: int) -> bytes:
    eth = bytes.fromhex("020000000002020000000001") + b"\x08\x00"
    ip = bytes([0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0]) + bytes(map(int, src.split("."))) \
        + bytes(map(int, dst.split(".")))
    return eth + ip + (40000).to_bytes(2, "big") + dport.to_bytes(2, "big") + b"\x00\x08\x00\x00"


def line(enc: RecordEncoder, src: str, dst: str, rule_id: int, dport: int = 53) -> str:
    frame = udp(src, dst, dport)
    pin = PacketIn(reason=0, table_id=20, cookie=1, in_port=3, rule_id=rule_id, reg7=1, userdata=b"",
                   packet=frame, total_len=len(frame), received_at=T0)
    text = enc.encode_positional(pin, decode_frame(frame), 1, len(frame), T0, T0, 0)
    return text.seal(GENESIS, 1)[0]


def pods_of(text: str) -> tuple[Any, Any, Any]:
    record = json.loads(text)
    return (record["npaudit"].get("source"), record["npaudit"].get("destination"),
            record["orchestrator"].get("namespace"))


def test_kept_texts_give_the_lines_of_a_lookup_per_record() -> None:
    table = Table({A: ("frontend", "client"), B: ("backend", "api-0")})
    kept, looked_up = encoder(table), encoder(Lookup(table))
    for src, dst in [(A, B), (B, A), (A, C), (C, B), (A, A)]:
        for rule in RULES:
            for dport in (53, 54):
                assert line(kept, src, dst, rule.rule_id, dport) == line(looked_up, src, dst, rule.rule_id, dport)
    assert table.lookups == 0  # the table was read, by_ip never called


def test_a_change_of_pods_shows_in_the_next_record() -> None:
    table = Table({A: ("frontend", "client"), B: ("backend", "api-0")})
    enc = encoder(table)
    egress = RULES[1].rule_id
    assert pods_of(line(enc, A, B, egress)) == ({"pod": {"name": "client", "namespace": "frontend"}},
                                                 {"pod": {"name": "api-0", "namespace": "backend"}}, "frontend")
    # A's Pod is deleted and its address given to a Pod of another namespace; B's Pod goes away.
    table.swap({A: ("batch", "job-7")})
    assert pods_of(line(enc, A, B, egress)) == ({"pod": {"name": "job-7", "namespace": "batch"}}, None, "batch")
    table.swap({})
    assert pods_of(line(enc, A, B, egress)) == (None, None, None)
    table.swap({A: ("frontend", "client"), B: ("backend", "api-0")})
    assert pods_of(line(enc, A, B, egress))[2] == "frontend"
