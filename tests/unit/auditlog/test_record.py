"""auditlog.record: ECS records for every disposition, direction and Pod/rule knowledge; one safe line each.

Every record built here is checked the way a consumer would see it: as the line the
writer writes (the RFC 8785 form the chain hashes, which RecordEncoder's text is proven
to be at the end of this file, ASCII-escaped), parsed back, validated against config/audit-record.schema.json,
and walked for nulls and placeholders.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.layers.inet import ICMP, IP, TCP, UDP  # noqa: E402
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6  # noqa: E402
from scapy.layers.l2 import ARP, Dot1Q, Ether  # noqa: E402

from auditlog.packet import decode_frame  # noqa: E402
from auditlog.chain import encode as file_form  # noqa: E402
from auditlog.community_id import community_id  # noqa: E402
from auditlog.jcs import canonical  # noqa: E402
from auditlog.record import RecordContext, RecordEncoder  # noqa: E402
from packetin.model import PacketIn  # noqa: E402
from policy_agent.policy.model import Action, Direction  # noqa: E402
from policy_agent.policy.rules import RuleInfo, RuleRegistry  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "config" / "audit-record.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)

# 2026-11-30T02:14:03Z plus .512 s.
T0 = calendar.timegm((2026, 11, 30, 2, 14, 3)) + 0.512
MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}
CLIENT, SERVER = "10.10.1.5", "10.10.2.7"
CLIENT6, SERVER6 = "fd00:10:10:1::5", "fd00:10:10:2::7"
PODS = {CLIENT: ("frontend", "client-7d9f"), SERVER: ("backend", "api-0"),
        CLIENT6: ("frontend", "client-7d9f"), SERVER6: ("backend", "api-0")}

RULE_ACNP = RuleInfo(rule_id=0x1001, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="acnp-db",
                     rule_name="deny-db", tier="securityops", priority=5.5, action=Action.DROP,
                     direction=Direction.INGRESS, log_label="db-guard", logged=True)
RULE_ANP = RuleInfo(rule_id=0x1002, policy_kind="AntreaNetworkPolicy", namespace="frontend", policy_name="egress",
                    rule_name="allow-api", tier="application", priority=10.0, action=Action.ALLOW,
                    direction=Direction.EGRESS, log_label="", logged=True)
RULE_K8S = RuleInfo(rule_id=0x1003, policy_kind="K8sNetworkPolicy", namespace="backend", policy_name="default-deny",
                    rule_name="isolation", tier="", priority=0.0, action=Action.DROP,
                    direction=Direction.INGRESS, log_label="", logged=True)
UNKNOWN_RULE_ID = 0xDEAD


@dataclass(frozen=True)
class PlainRule:
    """A RuleView with plain strings where RuleInfo has enums."""

    ruleset: str
    policy_kind: str
    namespace: str
    policy_name: str
    rule_name: str
    tier: str
    priority: float | None
    action: str
    direction: str
    log_label: str


class Rules:
    def __init__(self, *rules: Any) -> None:
        self._rules = {r.rule_id: r for r in rules if hasattr(r, "rule_id")}

    def add(self, rule_id: int, rule: Any) -> "Rules":
        self._rules[rule_id] = rule
        return self

    def get(self, rule_id: int) -> Any:
        return self._rules.get(rule_id)


class Pods:
    def __init__(self, pods: dict[str, tuple[str, str]]) -> None:
        self.pods = pods

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return self.pods.get(ip)


FIXED_ID = "0123456789abcdef0123456789abcdef"


def ctx(pods: dict[str, tuple[str, str]] | None = None, rules: Any = None, node: str = "node-a",
        cluster: str = "prod-eu", new_event_id: Any = lambda: FIXED_ID) -> RecordContext:
    return RecordContext(node=node, cluster=cluster, rules=rules or Rules(RULE_ACNP, RULE_ANP, RULE_K8S),
                         pods=Pods(PODS if pods is None else pods), new_event_id=new_event_id)


def frame_tcp(src: str = CLIENT, dst: str = SERVER, vlan: int | None = None) -> bytes:
    ip = IP(src=src, dst=dst) if ":" not in src else IPv6(src=src, dst=dst)
    pkt = Ether(**MAC) / Dot1Q(vlan=vlan) / ip if vlan is not None else Ether(**MAC) / ip
    return bytes(pkt / TCP(sport=40000, dport=5432, flags="S"))


def pin_for(frame: bytes, rule_id: int = RULE_ACNP.rule_id, disposition: int = 1, at: float = T0,
            cookie: int = 0x0001_0000_0000_0abc, table: int = 20, in_port: int | None = 7) -> PacketIn:
    return PacketIn(reason=0, table_id=table, cookie=cookie, in_port=in_port, rule_id=rule_id,
                    reg7=disposition, userdata=b"", packet=frame, total_len=len(frame), received_at=at)


def build_record(ctx: RecordContext, pin: PacketIn, summary: Any, *, packets: int, bytes_: int,
                 first: float, last: float, offloaded_packets: int = 0, seq: int,
                 chain: str | None = None) -> dict[str, Any]:
    """RecordEncoder.encode as a dict with npaudit.seq (and npaudit.chain if given)."""
    text = RecordEncoder(ctx).encode(pin, summary, packets=packets, bytes_=bytes_, first=first, last=last,
                                     offloaded_packets=offloaded_packets)
    text.seq = seq
    record = text.record()
    if chain is not None:
        record["npaudit"]["chain"] = chain
    return record


def record_for(frame: bytes, context: RecordContext | None = None, **pin_kw: Any) -> dict[str, Any]:
    pin = pin_for(frame, **pin_kw)
    return build_record(context or ctx(), pin, decode_frame(frame), packets=1, bytes_=len(frame),
                        first=pin.received_at, last=pin.received_at, seq=42)


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")


def assert_published(record: dict[str, Any]) -> dict[str, Any]:
    """The record as a consumer reads it: one line, valid JSON, schema-valid, nothing null."""
    for path, value in walk(record):
        assert value is not None, path
        assert value not in ("", "<nil>", {}, []), path
    line = file_form(record)
    assert line.isascii() and line.splitlines() == [line] and "\n" not in line and "\r" not in line
    parsed = json.loads(line)
    assert parsed == record
    VALIDATOR.validate(parsed)
    return parsed


# ---- dispositions, directions, Pods ------------------------------------------------------------

VERDICTS = {0: ("allowed", ["connection", "allowed"], "Allow"), 1: ("dropped", ["connection", "denied"], "Drop"),
            2: ("rejected", ["connection", "denied"], "Reject"), 3: ("passed", ["connection"], "Pass")}


@pytest.mark.parametrize("disposition", sorted(VERDICTS), ids=[v[2] for v in VERDICTS.values()])
@pytest.mark.parametrize("rule", [RULE_ACNP, RULE_ANP], ids=["ingress", "egress"])
def test_disposition_and_direction(disposition: int, rule: RuleInfo) -> None:
    r = assert_published(record_for(frame_tcp(), rule_id=rule.rule_id, disposition=disposition))
    action, types, name = VERDICTS[disposition]
    assert r["event"] == {"id": FIXED_ID, "kind": "event", "category": ["network"], "type": types,
                          "action": action, "outcome": "success", "dataset": "npaudit.audit",
                          "start": "2026-11-30T02:14:03.512Z", "end": "2026-11-30T02:14:03.512Z"}
    assert r["npaudit"]["disposition"] == name
    assert r["network"] == {"transport": "tcp", "iana_number": "6", "type": "ipv4",
                            "direction": rule.direction.value, "packets": 1, "bytes": 54,
                            "community_id": community_id(CLIENT, SERVER, 6, 40000, 5432)}
    assert r["message"].startswith(f"{name} {rule.direction.value} tcp {CLIENT}:40000 -> {SERVER}:5432, 1 packet")
    # The applied-to Pod is the destination of ingress traffic, the source of egress traffic.
    assert r["orchestrator"]["namespace"] == ("backend" if rule.direction == Direction.INGRESS else "frontend")


def test_full_record_exactly() -> None:
    r = assert_published(record_for(frame_tcp(), disposition=1))
    # The flow hash, against the spec's own algorithm (tests/unit/auditlog/test_community_id.py), both ways round.
    assert r["network"]["community_id"] == community_id(CLIENT, SERVER, 6, 40000, 5432) \
        == community_id(SERVER, CLIENT, 6, 5432, 40000)
    r["network"]["community_id"] = "1:" + "x" * 27 + "="
    assert r == {
        "@timestamp": "2026-11-30T02:14:03.512Z",
        "ecs": {"version": "8.11.0"},
        "event": {"id": FIXED_ID, "kind": "event", "category": ["network"], "dataset": "npaudit.audit",
                  "type": ["connection", "denied"], "action": "dropped", "outcome": "success",
                  "start": "2026-11-30T02:14:03.512Z", "end": "2026-11-30T02:14:03.512Z"},
        "rule": {"name": "deny-db", "ruleset": "AntreaClusterNetworkPolicy:acnp-db", "category": "securityops",
                 "id": str(0x1001)},
        "source": {"ip": CLIENT, "port": 40000},
        "destination": {"ip": SERVER, "port": 5432},
        "network": {"transport": "tcp", "iana_number": "6", "type": "ipv4", "direction": "ingress",
                    "packets": 1, "bytes": 54, "community_id": "1:" + "x" * 27 + "="},
        "message": f"Drop ingress tcp {CLIENT}:40000 -> {SERVER}:5432, 1 packet, "
                   "by AntreaClusterNetworkPolicy:acnp-db rule deny-db",
        "observer": {"hostname": "node-a", "type": "switch", "vendor": "npaudit project",
                     "product": "Open vSwitch"},
        "orchestrator": {"type": "kubernetes", "cluster": {"name": "prod-eu"}, "namespace": "backend"},
        "related": {"ip": [CLIENT, SERVER]},
        "labels": {"log_label": "db-guard"},
        "npaudit": {
            "source": {"pod": {"name": "client-7d9f", "namespace": "frontend"}},
            "destination": {"pod": {"name": "api-0", "namespace": "backend"}},
            "disposition": "Drop", "priority": 5.5, "tier": "securityops",
            "aggregate": {"packets": 1, "bytes": 54, "first": "2026-11-30T02:14:03.512Z",
                          "last": "2026-11-30T02:14:03.512Z", "offloaded_packets": 0},
            "seq": 42, "chain_format": 2,
            "ovs": {"table": 20, "cookie": "0x0001000000000abc", "in_port": 7},
        },
    }
    assert next(iter(r)) == "@timestamp"


@pytest.mark.parametrize("known", ["both", "source", "destination", "none"])
def test_pod_names_only_when_known(known: str) -> None:
    pods = {ip: who for ip, who in PODS.items()
            if known == "both" or (known == "source" and ip == CLIENT) or (known == "destination" and ip == SERVER)}
    r = assert_published(record_for(frame_tcp(), context=ctx(pods=pods)))
    assert ("source" in r["npaudit"]) == (known in ("both", "source"))
    assert ("destination" in r["npaudit"]) == (known in ("both", "destination"))
    # Ingress: the namespace is the destination Pod's; a cluster policy has none to fall back on.
    if known in ("both", "destination"):
        assert r["orchestrator"]["namespace"] == "backend"
    else:
        assert "namespace" not in r["orchestrator"]
    assert r["source"]["ip"] == CLIENT and r["destination"]["ip"] == SERVER


def test_namespaced_policy_names_its_namespace_when_the_pod_is_unknown() -> None:
    r = assert_published(record_for(frame_tcp(), context=ctx(pods={}), rule_id=RULE_ANP.rule_id, disposition=0))
    assert r["orchestrator"]["namespace"] == "frontend"


def test_unknown_rule_still_yields_a_record() -> None:
    r = assert_published(record_for(frame_tcp(), rule_id=UNKNOWN_RULE_ID, disposition=1))
    assert r["rule"] == {"id": str(UNKNOWN_RULE_ID)}
    assert r["npaudit"]["rule_unknown"] is True
    assert r["event"]["action"] == "dropped"
    for absent in ("labels",):
        assert absent not in r
    assert "direction" not in r["network"] and "namespace" not in r["orchestrator"]
    assert not {"priority", "tier"} & set(r["npaudit"])
    assert r["npaudit"]["source"]["pod"]["name"] == "client-7d9f"  # Pods are still named


def test_packet_in_without_rule_id_has_no_rule_object() -> None:
    r = assert_published(record_for(frame_tcp(), rule_id=0, disposition=1))
    assert "rule" not in r and r["npaudit"]["rule_unknown"] is True


def test_k8s_policy_rule_has_no_tier_or_priority() -> None:
    r = assert_published(record_for(frame_tcp(), rule_id=RULE_K8S.rule_id, disposition=1))
    assert r["rule"] == {"name": "isolation", "ruleset": "K8sNetworkPolicy:backend/default-deny",
                         "id": str(RULE_K8S.rule_id)}
    assert not {"priority", "tier", "rule_unknown"} & set(r["npaudit"])
    assert "cluster" in r["orchestrator"]


def test_plain_string_rule_view_works_like_rule_info() -> None:
    plain = PlainRule(ruleset="AntreaNetworkPolicy:frontend/egress", policy_kind="AntreaNetworkPolicy",
                      namespace="frontend", policy_name="egress", rule_name="allow-api", tier="application",
                      priority=10.0, action="Allow", direction="egress", log_label="")
    a = record_for(frame_tcp(), context=ctx(rules=Rules().add(9, plain)), rule_id=9, disposition=0)
    b = record_for(frame_tcp(), context=ctx(rules=Rules().add(9, RULE_ANP)), rule_id=9, disposition=0)
    assert assert_published(a) == assert_published(b)


def test_real_rule_registry_is_a_rule_lookup() -> None:
    registry = RuleRegistry()
    registry.replace({RULE_ACNP.rule_id: RULE_ACNP})
    r = assert_published(record_for(frame_tcp(), context=ctx(rules=registry)))
    assert r["rule"]["ruleset"] == "AntreaClusterNetworkPolicy:acnp-db"


def test_icmp_record() -> None:
    frame = bytes(Ether(**MAC) / IP(src=CLIENT, dst=SERVER) / ICMP(type=8, code=0))
    r = assert_published(record_for(frame, disposition=2))
    assert r["npaudit"]["icmp"] == {"type": 8, "code": 0} and "icmp" not in r  # ECS has no icmp field set
    assert r["source"] == {"ip": CLIENT} and r["destination"] == {"ip": SERVER}
    assert r["network"]["transport"] == "icmp" and r["network"]["iana_number"] == "1"
    assert r["event"]["action"] == "rejected"


def test_ipv6_icmpv6_record() -> None:
    frame = bytes(Ether(**MAC) / IPv6(src=CLIENT6, dst=SERVER6) / ICMPv6EchoRequest())
    r = assert_published(record_for(frame))
    assert r["network"] == {"transport": "ipv6-icmp", "iana_number": "58", "type": "ipv6", "direction": "ingress",
                            "packets": 1, "bytes": len(frame),
                            "community_id": community_id(CLIENT6, SERVER6, 58, 128, 129)}  # echo: a two-way pair
    assert r["message"] == (f"Drop ingress ipv6-icmp {CLIENT6} -> {SERVER6} type 128 code 0, 1 packet, "
                            "by AntreaClusterNetworkPolicy:acnp-db rule deny-db")
    assert r["npaudit"]["icmp"] == {"type": 128, "code": 0}
    assert r["related"] == {"ip": [CLIENT6, SERVER6]}
    assert r["npaudit"]["destination"]["pod"] == {"name": "api-0", "namespace": "backend"}


def test_ipv6_tcp_record() -> None:
    r = assert_published(record_for(frame_tcp(CLIENT6, SERVER6)))
    assert r["source"] == {"ip": CLIENT6, "port": 40000} and r["destination"] == {"ip": SERVER6, "port": 5432}
    assert r["network"]["type"] == "ipv6" and "icmp" not in r["npaudit"]


def test_vlan_udp_record() -> None:
    frame = bytes(Ether(**MAC) / Dot1Q(vlan=10) / IP(src=CLIENT, dst=SERVER) / UDP(sport=5353, dport=53))
    r = assert_published(record_for(frame))
    assert r["network"]["vlan"] == {"id": "10"} and r["network"]["transport"] == "udp"


def test_non_ip_frame_has_no_endpoints() -> None:
    r = assert_published(record_for(bytes(Ether(**MAC) / ARP()), in_port=None))
    assert not {"source", "destination", "related"} & set(r) and "icmp" not in r["npaudit"]
    assert r["network"] == {"direction": "ingress", "packets": 1, "bytes": 42}
    assert "in_port" not in r["npaudit"]["ovs"]


def test_fragment_and_truncation_are_flagged() -> None:
    later = bytes(Ether(**MAC) / IP(src=CLIENT, dst=SERVER, frag=100, proto=17) / (b"x" * 16))
    r = assert_published(record_for(later))
    assert r["npaudit"]["fragment"] is True and "port" not in r["destination"]
    cut = frame_tcp()[:14 + 20 + 10]
    r = assert_published(record_for(cut))
    assert r["npaudit"]["truncated"] is True and r["destination"]["port"] == 5432


# ---- aggregate, ids, timestamps --------------------------------------------------------------


def test_aggregate_seq_chain_and_cookie() -> None:
    frame = frame_tcp()
    pin = pin_for(frame, cookie=0xFFFF_FFFF_FFFF_FFFF)
    r = assert_published(build_record(ctx(), pin, decode_frame(frame), packets=1500, bytes_=81_000, first=T0,
                                      last=T0 + 9.9995, offloaded_packets=1200, seq=7, chain="ab" * 32))
    assert r["npaudit"]["aggregate"] == {"packets": 1500, "bytes": 81_000, "first": "2026-11-30T02:14:03.512Z",
                                         "last": "2026-11-30T02:14:13.512Z", "offloaded_packets": 1200}
    # The same counts and times in their ECS places.
    assert (r["network"]["packets"], r["network"]["bytes"]) == (1500, 81_000)
    assert (r["event"]["start"], r["event"]["end"]) == ("2026-11-30T02:14:03.512Z", "2026-11-30T02:14:13.512Z")
    assert r["npaudit"]["seq"] == 7 and r["npaudit"]["chain"] == "ab" * 32
    assert r["npaudit"]["ovs"]["cookie"] == "0xffffffffffffffff"


def test_event_id_comes_from_the_context_and_is_unique_by_default() -> None:
    ids = iter(["a" * 32, "b" * 32])
    context = ctx(new_event_id=lambda: next(ids))
    assert [record_for(frame_tcp(), context=context)["event"]["id"] for _ in range(2)] == ["a" * 32, "b" * 32]
    default = RecordContext(node="node-a", rules=Rules(RULE_ACNP), pods=Pods(PODS))
    # Same packet, same millisecond, same seq: still distinct records.
    records = [assert_published(record_for(frame_tcp(), context=default)) for _ in range(100)]
    found = {r["event"]["id"] for r in records}
    assert len(found) == 100
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in found)
    # Another context (another agent process) draws another random prefix.
    other = RecordContext(node="node-a", rules=Rules(RULE_ACNP), pods=Pods(PODS))
    assert record_for(frame_tcp(), context=other)["event"]["id"] not in found
    assert all("cluster" not in r["orchestrator"] for r in records)  # "" means no cluster name


def stamp(at: float) -> str:
    """The @timestamp the encoder writes for a packet received at `at`."""
    return str(record_for(frame_tcp(), at=at)["@timestamp"])


@pytest.mark.parametrize("at, expected", [
    (T0, "2026-11-30T02:14:03.512Z"),
    (calendar.timegm((2026, 11, 30, 2, 14, 3)) + 0.0004, "2026-11-30T02:14:03.000Z"),  # rounds down
    (calendar.timegm((2026, 11, 30, 2, 14, 3)) + 0.0006, "2026-11-30T02:14:03.001Z"),  # rounds up
    (calendar.timegm((2026, 12, 31, 23, 59, 59)) + 0.9996, "2027-01-01T00:00:00.000Z"),  # carries into the year
    (calendar.timegm((2028, 2, 29, 12, 0, 0)), "2028-02-29T12:00:00.000Z"),
    (1_000_000_000.123, "2001-09-09T01:46:40.123Z"),
    (0.0, "1970-01-01T00:00:00.000Z"),
])
def test_timestamps_are_utc_rounded_to_the_millisecond(at: float, expected: str) -> None:
    assert stamp(at) == expected
    r = assert_published(record_for(frame_tcp(), at=at))
    assert r["@timestamp"] == r["npaudit"]["aggregate"]["first"] == r["npaudit"]["aggregate"]["last"] == expected


def test_timestamps_ignore_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/St_Johns")  # -03:30, with DST: any local leak shows
    time.tzset()
    try:
        assert stamp(T0) == "2026-11-30T02:14:03.512Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_every_millisecond_of_a_second_survives_float_noise() -> None:
    base = calendar.timegm((2026, 11, 30, 2, 14, 3))
    for ms in range(1000):
        assert stamp(base + ms / 1000) == "2026-11-30T02:14:03.%03dZ" % ms


# ---- hostile strings -------------------------------------------------------------------------

HOSTILE = [
    ("newline", "web\n{\"fake\":1}", None),
    ("crlf", "a\r\nb", None),
    ("quotes-backslash", 'say "hi" \\ \\u0041', None),
    ("nul", "nul\x00byte", None),
    ("controls", "".join(map(chr, range(1, 32))) + "\x7f", None),
    ("line-separators", "ls\u2028ps\u2029nel\x85end", None),
    ("vt-ff-fs", "a\x0bb\x0cc\x1cd\x1de\x1ef", None),
    ("ten-kilobytes", "x" * 10_240, None),
    ("non-bmp-and-bom", "\ufeffpod-😀-名前", None),
    ("lone-high-surrogate", "lone\ud800surrogate", "lone\ufffdsurrogate"),
    ("lone-low-surrogate", "\udfff", "\ufffd"),
    ("surrogate-pair-code-points", "pair\ud83d\ude00", "pair😀"),
    ("reversed-pair", "\ude00\ud83d", "\ufffd\ufffd"),
]


def hostile_ids() -> list[str]:
    return [h[0] for h in HOSTILE]


def with_replacements(value: Any, text: str, shown: str) -> Any:
    if isinstance(value, dict):
        return {k: with_replacements(v, text, shown) for k, v in value.items()}
    if isinstance(value, list):
        return [with_replacements(v, text, shown) for v in value]
    return value.replace(text, shown) if isinstance(value, str) else value


@pytest.mark.parametrize("name, text, shown", HOSTILE, ids=hostile_ids())
def test_hostile_strings_stay_one_valid_line(name: str, text: str, shown: str | None) -> None:
    rule = replace(RULE_ACNP, log_label=text, rule_name=text)
    pods = {CLIENT: (text, text), SERVER: ("backend", text)}
    record = record_for(frame_tcp(), context=ctx(pods=pods, rules=Rules(rule), node=text, cluster=text))
    expected = text if shown is None else shown
    # The record itself holds valid Unicode, whichever serialiser (this, or the chain's) writes it.
    assert record["labels"]["log_label"] == record["rule"]["name"] == record["observer"]["hostname"] == expected
    assert record["orchestrator"]["cluster"]["name"] == expected
    assert record["npaudit"]["source"]["pod"] == {"name": expected, "namespace": expected}
    assert record["npaudit"]["destination"]["pod"] == {"name": expected, "namespace": "backend"}
    line = file_form(record)
    assert line.isascii() and line.splitlines() == [line]
    parsed = json.loads(line)
    assert parsed == record
    VALIDATOR.validate(parsed)


def _no_constants(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(st.characters(exclude_categories=()), max_size=40), st.text(max_size=40))
def test_any_pod_name_and_label_give_a_schema_valid_line(name: str, label: str) -> None:
    rule = replace(RULE_ACNP, log_label=label)
    record = record_for(frame_tcp(), context=ctx(pods={SERVER: ("backend", name)}, rules=Rules(rule)))
    line = file_form(record)
    assert line.isascii() and line.splitlines() == [line]
    VALIDATOR.validate(json.loads(line))


# ---- robustness and boundaries -----------------------------------------------------------------


def test_non_finite_priority_is_left_out() -> None:
    rule = replace(RULE_ACNP, priority=float("nan"))
    r = assert_published(record_for(frame_tcp(), context=ctx(rules=Rules(rule))))
    assert "priority" not in r["npaudit"] and r["npaudit"]["tier"] == "securityops"


def test_reg7_outside_the_dispositions_falls_back_to_the_rule_action() -> None:
    r = assert_published(record_for(frame_tcp(), disposition=0x9))  # RULE_ACNP is a Drop rule
    assert r["npaudit"]["disposition"] == "Drop"
    with pytest.raises(ValueError, match="reg7=0x9"):
        record_for(frame_tcp(), rule_id=UNKNOWN_RULE_ID, disposition=0x9)


def test_reg7_bits_above_the_disposition_are_ignored() -> None:
    r = assert_published(record_for(frame_tcp(), disposition=0xF0 | 2))
    assert r["event"]["action"] == "rejected"


@pytest.mark.parametrize("broken, path", [
    ({"@timestamp": None}, "@timestamp"),
    ({"@timestamp": "2026-11-30T02:14:03Z"}, "no milliseconds"),
    ({"@timestamp": "2026-11-30T02:14:03.512+00:00"}, "offset instead of Z"),
    ({"event": {"action": "denied"}}, "event.action"),
    ({"network": {"transport": "TCP"}}, "network.transport"),
    ({"npaudit": {"disposition": "Deny"}}, "npaudit.disposition"),
    ({"npaudit": {"surprise": 1}}, "extra vendor field"),
    ({"source": {"ip": "not-an-ip"}}, "source.ip"),
    ({"event": {"action": "allowed"}}, "action disagrees with the disposition"),
    ({"labels": {"log_label": None}}, "null label"),
])
def test_schema_rejects_broken_records(broken: dict[str, Any], path: str) -> None:
    record = json.loads(file_form(record_for(frame_tcp())))
    VALIDATOR.validate(record)
    for key, value in broken.items():
        if isinstance(value, dict):
            record.setdefault(key, {}).update(value)
        else:
            record[key] = value
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(record)


def test_auditlog_does_not_import_policy_agent() -> None:
    code = ("import sys, auditlog.record, auditlog.packet; "
            "sys.exit(any(m.split('.')[0] == 'policy_agent' for m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT).returncode == 0


# ---- the encoder's text is the canonical form the chain hashes ---------------------------------

from auditlog.chain import GENESIS, check_line  # noqa: E402


def _frames() -> list[bytes]:
    return [frame_tcp(), frame_tcp(vlan=42), frame_tcp(CLIENT6, SERVER6),
            bytes(Ether(**MAC) / IP(src=CLIENT, dst=SERVER) / ICMP(type=8, code=0)),
            bytes(Ether(**MAC) / IPv6(src=CLIENT6, dst=SERVER6) / ICMPv6EchoRequest()),
            bytes(Ether(**MAC) / IP(src=SERVER, dst=CLIENT, flags="MF") / UDP(sport=53, dport=5353)),
            bytes(Ether(**MAC) / IP(src=CLIENT, dst=SERVER) / TCP(sport=1, dport=2))[:40],  # truncated
            bytes(Ether(**MAC) / ARP())]


texts = st.text(st.characters(exclude_categories=()), max_size=24)  # surrogates, controls, U+2028...


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(frame=st.sampled_from(_frames()), name=texts, namespace=texts, label=texts, tier=texts, node=texts,
       cluster=texts, priority=st.floats(allow_nan=True, allow_infinity=True),
       rule_id=st.sampled_from([RULE_ACNP.rule_id, RULE_ANP.rule_id, UNKNOWN_RULE_ID, 0]),
       disposition=st.integers(0, 3), packets=st.integers(1, 2**40), seq=st.integers(1, 2**53),
       in_port=st.one_of(st.none(), st.integers(0, 2**32 - 1)), cookie=st.integers(0, 2**64 - 1),
       first=st.floats(0, 4e9), span=st.floats(0, 5))
def test_encoder_text_is_canonical_and_seals_into_a_verifiable_line(
        frame, name, namespace, label, tier, node, cluster, priority, rule_id, disposition, packets, seq, in_port,
        cookie, first, span) -> None:
    rules = Rules(replace(RULE_ACNP, rule_name=name, log_label=label, tier=tier, priority=priority),
                  replace(RULE_ANP, namespace="ns" + namespace, policy_name="p" + name))
    pods = {CLIENT: (namespace, name), SERVER: ("backend", name), CLIENT6: ("", name), SERVER6: (namespace, "")}
    context = RecordContext(node="n" + node, cluster=cluster, rules=rules, pods=Pods(pods),
                            new_event_id=lambda: FIXED_ID)
    pin = pin_for(frame, rule_id=rule_id, disposition=disposition, at=first, cookie=cookie, in_port=in_port)
    text = RecordEncoder(context).encode(pin, decode_frame(frame), packets=packets, bytes_=packets * 60,
                                         first=first, last=first + span)
    body = text.body(seq)
    record = json.loads(body, parse_constant=_no_constants)
    assert canonical(record) == body  # RFC 8785: sorted keys, minimal escapes, ECMAScript numbers
    line, chain = text.seal(GENESIS, seq)
    assert check_line(line, GENESIS, seq - 1) == (seq, chain)
    assert chain == hashlib.sha256(f"{GENESIS}\n{body}".encode("utf-8")).hexdigest()
    record["npaudit"]["chain"] = chain
    # The line: the same text with the chain, non-ASCII escaped; JCS itself for an ASCII record.
    assert json.loads(line) == record and line.isascii() and line.splitlines() == [line]
    assert (line == canonical(record)) == body.isascii()
    assert text.record() == {**record, "npaudit": {k: v for k, v in record["npaudit"].items() if k != "chain"}}
    VALIDATOR.validate(record)


def test_encoder_follows_rule_and_pod_changes() -> None:
    rules = Rules(RULE_ACNP)
    pods = {CLIENT: ("frontend", "client-1"), SERVER: ("backend", "api-0")}
    encoder = RecordEncoder(RecordContext(node="n", rules=rules, pods=Pods(pods), new_event_id=lambda: FIXED_ID))
    frame = frame_tcp()

    def record() -> dict[str, Any]:
        text = encoder.encode(pin_for(frame), decode_frame(frame), packets=1, bytes_=1, first=T0, last=T0)
        return text.record()

    assert record()["rule"]["name"] == "deny-db"
    rules.add(RULE_ACNP.rule_id, replace(RULE_ACNP, rule_name="deny-db-v2", log_label="v2"))  # a new round
    pods[SERVER] = ("backend", "api-1")  # the address went to another Pod
    r = record()
    assert r["rule"]["name"] == "deny-db-v2" and r["labels"] == {"log_label": "v2"}
    assert r["npaudit"]["destination"]["pod"]["name"] == "api-1"
    del pods[CLIENT]
    assert "source" not in record()["npaudit"]


@pytest.mark.parametrize("event_id", ["", "id with \"quotes\"\n", "\ud800", "名前"])
def test_an_odd_event_id_from_an_injected_source_is_still_canonical_text(event_id: str) -> None:
    context = RecordContext(node="n", rules=Rules(RULE_ACNP), pods=Pods(PODS), new_event_id=lambda: event_id)
    frame = frame_tcp()
    text = RecordEncoder(context).encode(pin_for(frame), decode_frame(frame), packets=1, bytes_=1, first=T0, last=T0)
    body = text.body(7)
    assert canonical(json.loads(body)) == body
    line, _ = text.seal(GENESIS, 7)
    assert line.isascii() and json.loads(line)["event"]["id"] == json.loads(body)["event"]["id"]
