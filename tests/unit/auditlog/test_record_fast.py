"""auditlog._record_fast (C) writes exactly what auditlog.record's Python encoder writes, record for record.

The C part builds the common record from the Python encoder's caches and hands everything else to it; these
tests feed the same stream (records of every kind, Pod table swaps, rule changes) to a FastEncoder and to a
plain RecordEncoder and compare every text, verdict and error. They also check its own SHA-1 and Community
ID against hashlib and the reference implementation, that it really builds the common record (not only
falls back), and the pure-Python path a machine without a compiler (or NPAUDIT_PURE_PYTHON) takes.
"""

from __future__ import annotations

import hashlib
import logging
from types import MappingProxyType
from typing import Any, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditlog import record_fast
from auditlog.community_id import community_id
from auditlog.packet import PacketSummary, transport_name
from auditlog.pipeline import AuditPipeline
from auditlog.aggregate import Aggregator
from auditlog.record import RecordContext, RecordEncoder
from packetin.model import PacketIn
from policy_agent.policy.rules import RuleInfo, RuleRegistry
from tests.support.fast_records import ODD, PODS, RENAMED, RULES, T0, V4, V6, Pods, encoder

def pair() -> tuple[RuleRegistry, Pods, Any, RecordEncoder]:
    """(rules, pods, a FastEncoder, a plain RecordEncoder) over the same rules and Pods."""
    rules = RuleRegistry()
    rules.replace(dict(RULES))
    pods = Pods()
    fast = record_fast.fast_encoder(encoder(rules, pods))
    assert type(fast).__name__ == "FastEncoder"
    return rules, pods, fast, encoder(rules, pods)


def outcome(encode: Any, args: tuple) -> tuple:
    try:
        text = encode(*args)
    except ValueError as exc:
        return ("error", str(exc))
    return (text.head, text.mid, text.tail, text.verdict, text.seq, text.received,  # what the C encoder makes
            type(text), type(text.seq), type(text.received))                      # is a RecordText as __init__'s


addresses = st.one_of(st.sampled_from(V4), st.sampled_from(V6), st.none(), st.just(ODD))
ports = st.one_of(st.none(), st.integers(0, 65535), st.sampled_from([53, 80, 443]))
small = st.one_of(st.none(), st.integers(0, 255))


def mostly(common: Any, other: Any) -> Any:
    """`common` nine times in ten: most records are the kind the C part builds, the rest cover the others."""
    return st.sampled_from(range(10)).flatmap(lambda i: other if i == 9 else common)


@st.composite
def records(draw: Any) -> tuple:
    v6 = draw(st.booleans())
    src = draw(mostly(st.sampled_from(V6 if v6 else V4), addresses))
    dst = draw(mostly(st.sampled_from(V6 if v6 else V4), addresses))
    protocol = draw(mostly(st.sampled_from([6, 17, 132, 1, 58]), st.sampled_from([47, None])))
    transport = draw(mostly(st.just(transport_name(protocol)), st.sampled_from([None, ""])))
    icmp = protocol in (1, 58) and draw(mostly(st.just(True), st.just(False)))
    summary = PacketSummary(
        eth_type=0x86DD if v6 else 0x800, vlan=draw(st.one_of(st.none(), st.integers(0, 4095))),
        ip_version=draw(mostly(st.just(6 if v6 else 4), st.none())), src_ip=src, dst_ip=dst, protocol=protocol,
        transport=transport, src_port=None if icmp else draw(ports), dst_port=None if icmp else draw(ports),
        icmp_type=draw(small) if icmp else None, icmp_code=draw(st.one_of(st.just(0), small)) if icmp else None,
        tcp_flags=None, fragment=draw(st.booleans()), truncated=draw(st.booleans()), length=draw(st.integers(0, 9000)))
    pin = PacketIn(reason=0, table_id=draw(st.sampled_from([20, 40])), cookie=draw(st.sampled_from([1, 2**64 - 1])),
                   in_port=draw(st.sampled_from([None, 3, 100])),
                   rule_id=draw(mostly(st.sampled_from([0x1001, 0x1002, 0x1003]), st.sampled_from([0, 0x1004, 0xDEAD]))),
                   reg7=draw(mostly(st.sampled_from([0, 1, 2, 3]), st.sampled_from([0x11, 7]))), userdata=b"",
                   packet=b"", total_len=64, received_at=T0)
    packets = draw(mostly(st.sampled_from([1, 2, 40]), st.sampled_from([2**53, 2**53 + 1])))
    # mostly today's clock; else any time the record can carry (1970 to the year 9999's end, leap days among them)
    first = draw(mostly(st.sampled_from([0.0, 0.0005, 0.0015, 0.9995, 1.25, 3600.0001]).map(lambda d: T0 + d),
                        st.floats(0.0, 253402300799.0)))
    last = first + draw(st.sampled_from([0.0, 0.0, 0.0004999, 0.75, 2.0]))
    counts = (packets, draw(mostly(st.sampled_from([64, 1500 * packets]), st.just(2**60))),
              draw(st.sampled_from([0, 0, 7])))
    args = (pin, summary, *counts[:2], first, last, counts[2])
    if draw(st.integers(0, 5)) == 0:  # a record of the overload mode
        args = (*args, draw(st.sampled_from(["ports", "peers"])), draw(st.integers(1, 500)))
    return args


events = st.lists(st.one_of(records(), records(), records(), st.sampled_from(["swap-pods", "rename-rule"])),
                  min_size=1, max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events)
def test_the_c_part_writes_the_python_encoders_text_for_any_stream(stream: list) -> None:
    rules, pods, fast, plain = pair()
    for event in stream:
        if event == "swap-pods":  # a new table, as the engine makes on a change of Pods
            pods.table = MappingProxyType({**PODS, "10.10.3.10": ("late", "newcomer-0")})
        elif event == "rename-rule":  # the registry hands out a new object for a known id
            rules.replace(dict(RENAMED))
        else:
            # each side's first look at a pair, a rule or a flow fills its caches, so encode twice
            for _ in range(2):
                assert outcome(fast.encode, event) == outcome(plain.encode_positional, event)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events)
def test_within_a_batch_the_c_part_writes_the_same_text_asking_for_pods_and_rules_once(stream: list) -> None:
    """Between begin_batch and end_batch (one read's records) the C part asks for the Pod table once and for each
    rule id once; the Pods and rules change only between batches (the engine swaps them between reads)."""
    rules, pods, fast, plain = pair()
    fast.begin_batch()
    for event in stream:
        if event in ("swap-pods", "rename-rule"):
            fast.end_batch()
            if event == "swap-pods":
                pods.table = MappingProxyType({**PODS, "10.10.3.10": ("late", "newcomer-0")})
            else:
                rules.replace(dict(RENAMED))
            fast.begin_batch()
        else:
            for _ in range(2):
                assert outcome(fast.encode, event) == outcome(plain.encode_positional, event)
    fast.end_batch()


def test_a_batch_asks_for_the_pod_table_once_and_for_each_rule_once_and_sees_what_changed_after_it() -> None:
    asked = {"table": 0, "rules": 0}

    class Counting(Pods):
        def ip_table(self) -> Mapping[str, tuple[str, str]]:
            asked["table"] += 1
            return self.table

    class CountingRules(RuleRegistry):
        def get(self, rule_id: int) -> RuleInfo | None:
            asked["rules"] += 1
            return super().get(rule_id)

    rules = CountingRules()
    rules.replace(dict(RULES))
    pods = Counting()
    fast = record_fast.fast_encoder(encoder(rules, pods))
    summary = PacketSummary(eth_type=0x800, ip_version=4, src_ip=V4[0], dst_ip=V4[1], protocol=17, transport="udp",
                            src_port=1000, dst_port=53, fragment=False, truncated=False, length=74)

    def args(port: int) -> tuple:
        pin = PacketIn(reason=0, table_id=40, cookie=1, in_port=3, rule_id=0x1001, reg7=1, userdata=b"", packet=b"",
                       total_len=74, received_at=T0)
        return (pin, summary._replace(dst_port=port), 1, 74, T0, T0, 0)

    fast.encode(*args(1))  # fills the caches
    asked.update(table=0, rules=0)
    built = fast.counts()["fast"]
    fast.begin_batch()
    texts = [fast.encode(*args(port)) for port in range(2, 50)]
    assert asked == {"table": 1, "rules": 1}
    assert fast.counts()["fast"] == built + 48  # all built in C
    assert all('"api-0"' in t.head + t.mid + t.tail for t in texts)
    fast.end_batch()
    pods.table = MappingProxyType({**PODS, V4[1]: ("backend", "api-1")})  # as the engine swaps it, between reads
    moved = fast.encode(*args(50))
    assert '"api-1"' in moved.head + moved.mid + moved.tail and "deny-renamed" not in moved.head + moved.tail
    rules.replace(dict(RENAMED))
    renamed = fast.encode(*args(51))
    assert "deny-renamed" in renamed.head + renamed.mid + renamed.tail
    fast.begin_batch()
    pods.table = MappingProxyType(dict(PODS))
    assert '"api-1"' in (r := fast.encode(*args(52))).head + r.mid + r.tail  # within a batch: the table it began with
    fast.end_batch()
    assert asked["table"] >= 3 and asked["rules"] >= 3  # outside a batch: asked per record again


KINDS = [  # one of each kind of record the C part builds: (summary fields, pin fields, counts and times)
    ({}, {}, (1, 74, 0)),
    ({"src_port": None}, {}, (3, 222, 0)),  # a non-first fragment: no ports
    ({"dst_port": None, "src_port": None, "fragment": True}, {}, (1, 74, 0)),
    ({"truncated": True, "vlan": 7}, {"in_port": None}, (1, 74, 5)),
    ({"protocol": 1, "transport": "icmp", "src_port": None, "dst_port": None, "icmp_type": 8, "icmp_code": 0},
     {}, (1, 98, 0)),
    ({"protocol": 1, "transport": "icmp", "src_port": None, "dst_port": None, "icmp_type": 3, "icmp_code": None},
     {}, (1, 98, 0)),
    ({"protocol": 58, "transport": "icmpv6", "src_ip": V6[0], "dst_ip": V6[1], "ip_version": 6, "src_port": None,
      "dst_port": None, "icmp_type": 128, "icmp_code": 0}, {}, (2, 200, 0)),
    ({"protocol": 6, "transport": "tcp", "src_ip": V6[1], "dst_ip": V6[0], "ip_version": 6}, {}, (1, 74, 0)),
    ({"protocol": 132, "transport": "sctp", "src_ip": V4[1], "dst_ip": V4[1]}, {"rule_id": 0}, (9, 900, 0)),
    ({}, {"rule_id": 0x1002, "reg7": 0}, (1, 74, 0)),  # egress Allow: the source's Pod is the applied-to one
    ({}, {"rule_id": 0x1003, "reg7": 2}, (1, 74, 0)),  # a K8s rule: no tier, no priority
    ({}, {"rule_id": 0xDEAD, "reg7": 3}, (1, 74, 0)),  # an unknown rule, reg7 Pass
    ({"src_ip": V4[2]}, {}, (2**53, 2**53, 2**53)),  # the largest exact counts; no Pod at the source
]


def test_every_kind_of_record_it_builds_is_the_python_encoders() -> None:
    assert record_fast.built(), "auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev)"
    _, _, fast, plain = pair()
    base = udp_stream(1, fast)[0]
    for i, (fields, pin_fields, (packets, bytes_, offloaded)) in enumerate(KINDS):
        args = (base[0]._replace(**pin_fields), base[1]._replace(**fields), packets, bytes_,
                T0 + i * 0.0005, T0 + i * 0.75, offloaded)
        before = fast.counts()["fast"]
        for _ in range(2):  # the first may fill a cache through Python; the second is C's
            assert outcome(fast.encode, args) == outcome(plain.encode_positional, args), (fields, pin_fields)
        assert fast.counts()["fast"] > before, f"the C part did not build {fields} {pin_fields}"


def udp_stream(n: int, fast: Any) -> list[tuple]:
    summary = PacketSummary(eth_type=0x800, ip_version=4, src_ip=V4[0], dst_ip=V4[1], protocol=17, transport="udp",
                            src_port=40000, dst_port=53, length=74)
    pin = PacketIn(reason=0, table_id=40, cookie=1, in_port=3, rule_id=0x1001, reg7=1, userdata=b"", packet=b"",
                   total_len=74, received_at=T0)
    return [(pin, summary._replace(dst_port=1024 + i), 1, 74, T0 + i / 1000, T0 + i / 1000, 0) for i in range(n)]


def test_the_c_part_builds_the_common_record_itself() -> None:
    assert record_fast.built(), "auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev)"
    _, _, fast, plain = pair()
    for args in udp_stream(200, fast):
        assert outcome(fast.encode, args) == outcome(plain.encode_positional, args)
    # the first record fills the rule's, the Pods', the network's and the OVS texts; a new port is a new flow,
    # whose Community ID the C part works out itself
    assert fast.counts() == {"fast": 199, "python": 1}


def test_its_caches_stay_bounded_as_the_python_encoders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RecordEncoder, "MAX_CACHED", 8)
    rules = RuleRegistry()
    rules.replace(dict(RULES))
    served = encoder(rules, Pods())
    fast, plain = record_fast.fast_encoder(served), encoder(rules, Pods())
    for args in udp_stream(50, fast):
        assert outcome(fast.encode, args) == outcome(plain.encode_positional, args)
        assert len(served.c_parts()["community"]) <= 8  # type: ignore[index]
    assert fast.counts()["fast"] == 49


def test_records_are_made_in_place_without_recordtext_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C encoder fills RecordText's slots itself (no Python __init__ per record): with __init__ made to fail,
    its records are still made, the same as the plain encoder's made before."""
    from auditlog.chain import RecordText

    _, _, fast, plain = pair()
    first, *args = udp_stream(4, fast)
    assert outcome(fast.encode, first) == outcome(plain.encode_positional, first)  # fills the caches (Python)
    want = [outcome(plain.encode_positional, a) for a in args]

    def no_init(self: RecordText, *_: Any) -> None:
        raise AssertionError("RecordText.__init__ called")

    monkeypatch.setattr(RecordText, "__init__", no_init)
    assert [outcome(fast.encode, a) for a in args] == want
    assert fast.counts() == {"fast": 3, "python": 1}


def test_a_changed_rule_or_pod_is_in_the_very_next_record() -> None:
    rules, pods, fast, plain = pair()
    late = V4[2]  # no Pod yet
    args = udp_stream(1, fast)[0]
    args = (args[0], args[1]._replace(src_ip=late), *args[2:])

    def both() -> tuple:
        got = outcome(fast.encode, args)
        assert got == outcome(plain.encode_positional, args)
        return got

    both()
    head, _, tail, *_ = both()
    assert "deny-renamed" not in head and "newcomer-0" not in tail
    assert fast.counts() == {"fast": 1, "python": 1}
    rules.replace(dict(RENAMED))
    assert "deny-renamed" in both()[0]
    pods.table = MappingProxyType({**PODS, late: ("late", "newcomer-0")})
    assert "newcomer-0" in both()[2]
    both()
    assert fast.counts() == {"fast": 2, "python": 3}


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_its_sha1_is_sha1(data: bytes) -> None:
    from auditlog import _record_fast

    assert _record_fast.sha1(data) == hashlib.sha1(data).digest()


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([(V4, 32), (V6, 128)]).flatmap(
    lambda pool: st.tuples(st.sampled_from(pool[0]), st.sampled_from(pool[0]))),
    st.sampled_from([6, 17, 132]), st.integers(0, 65535), st.integers(0, 65535))
def test_its_community_id_is_the_specs(ends: tuple[str, str], proto: int, sport: int, dport: int) -> None:
    from auditlog import _record_fast

    expected = community_id(ends[0], ends[1], proto, sport, dport)
    assert _record_fast.community_id_ported(ends[0], ends[1], proto, sport, dport) == \
        f'"community_id":"{expected}",'


def test_community_id_refuses_what_cannot_be_packed() -> None:
    from auditlog import _record_fast

    for src, dst in [("10.0.0.1", "fd00::1"), ("10.0.0.300", "10.0.0.1"), ("pod", "10.0.0.1")]:
        with pytest.raises(ValueError):
            _record_fast.community_id_ported(src, dst, 17, 1, 2)


def test_without_the_module_records_are_python_and_the_log_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(record_fast, "_record_fast", None)
    rules = RuleRegistry()
    rules.replace(dict(RULES))
    pods = Pods()
    plain = encoder(rules, pods)
    with caplog.at_level(logging.WARNING, logger="auditlog.record_fast"):
        slow = record_fast.fast_encoder(encoder(rules, pods))
    assert "not built" in caplog.text and "pure Python" in caplog.text
    assert record_fast.mode() == "python"  # npaudit_build_info's record_encoder
    for args in udp_stream(20, slow):
        assert outcome(slow.encode, args) == outcome(plain.encode_positional, args)
    assert slow.counts() == {"fast": 0, "python": 20}


def test_npaudit_pure_python_turns_the_c_part_off_loudly(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")
    rules = RuleRegistry()
    rules.replace(dict(RULES))
    with caplog.at_level(logging.WARNING, logger="auditlog.record_fast"):
        pipeline = AuditPipeline(RecordContext(node="n", rules=rules, pods=Pods()), _Sink(), Aggregator(window=0))
    assert record_fast.PURE_PYTHON_ENV in caplog.text and record_fast.mode() == "python"
    assert pipeline.encoder.counts() == {"fast": 0, "python": 0}
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "0")  # "0" or "" is off
    assert record_fast.mode() == "c"
    assert type(AuditPipeline(RecordContext(node="n", rules=rules, pods=Pods()), _Sink(),
                              Aggregator(window=0)).encoder).__name__ == "FastEncoder"


def test_an_encoder_the_c_part_cannot_serve_stays_python() -> None:
    rules = RuleRegistry()
    rules.replace(dict(RULES))
    custom_ids = RecordEncoder(RecordContext(node="n", rules=rules, pods=Pods(), new_event_id=lambda: "x" * 32))
    no_table = RecordEncoder(RecordContext(node="n", rules=rules, pods=type("P", (), {"by_ip": lambda s, ip: None})()))
    for enc in (custom_ids, no_table):
        assert enc.c_parts() is None
        assert record_fast.fast_encoder(enc).counts() == {"fast": 0, "python": 0}


class _Sink:
    def submit(self, record: Any) -> bool:
        return True
