"""FastEncoder.encode_raw (auditlog/_record_fast.c): a lone packet-in's record built from its NXT_PACKET_IN2 bytes and
a template of the texts encode worked out for its key, is exactly the record encode makes of the decoded packet-in,
or None (nothing done) where it cannot say so: no template for the key, the rule or the Pod table changed since,
a frame off decode_frame's fast path, a message decode_packet_in2 refuses."""

from __future__ import annotations

import random
import re
from types import MappingProxyType
from typing import Any

import pytest

from auditlog import record_fast
from auditlog.packet import decode_frame
from packetin.errors import DecodeError
from packetin.wire import decode_packet_in2
from policy_agent.policy.rules import RuleRegistry
from tests.support.fast_records import ODD, PODS, RENAMED, RULES, T0, V4, Pods, encoder
from tests.support.packet_ins import frame, message

_ID = re.compile(r'"id":"0123456789abcdef([0-9a-f]{16})"')


def _stack() -> tuple[RuleRegistry, Pods, Any]:
    rules = RuleRegistry()
    rules.replace(dict(RULES))
    pods = Pods()
    fast = record_fast.fast_encoder(encoder(rules, pods))
    assert type(fast).__name__ == "FastEncoder"
    return rules, pods, fast


def _by_encode(fast: Any, raw: bytes, wall: float) -> tuple[Any, int]:
    """encode's record of `raw` (decoded as the reader and the pipeline decode it) and the event id it drew."""
    pin = decode_packet_in2(raw, wall)
    record = fast.encode(pin, decode_frame(pin.packet), 1, pin.total_len, wall, wall, 0)
    record.received = wall  # as encode_run sets it for a record that is no aggregate
    found = _ID.search(record.head)
    assert found is not None, record.head
    return record, int(found.group(1), 16)


def _primed(fast: Any, raw: bytes, wall: float) -> tuple[Any, int]:
    """_by_encode twice: the first record of a key goes to the Python encoder, which fills the caches the C part
    reads; the second is built in C, which keeps the key's template."""
    _by_encode(fast, raw, wall)
    return _by_encode(fast, raw, wall)


def _texts(record: Any) -> tuple:
    return (record.head, record.mid, record.tail, record.verdict, record.seq, record.received, type(record))


def _raw(rng: random.Random, src: str, dst: str) -> bytes:
    l4 = rng.choice(["udp", "udp", "tcp", "tcpopt", "tcpcut"])
    return message(frame(src, dst, l4, rng.randrange(1, 65536), payload=rng.choice([0, 8, 900])),
                   in_port=rng.choice([1, 100]), reg6=rng.choice([0x1001, 0x1002, 0x1003]),
                   reg7=rng.choice([0, 1, 2, 3]), cookie=rng.choice([3, 2**64 - 1]),
                   nxm_regs=rng.random() < 0.3, full_len=rng.choice([None, 1500]))


def test_a_raw_record_is_encodes_record_byte_for_byte() -> None:
    rules, pods, fast = _stack()
    rng = random.Random(7)
    built = 0
    for i in range(400):
        src, dst = rng.sample(V4, 2)
        raw = _raw(rng, src, dst)
        wall = T0 + i * 0.0137
        expected, event_id = _primed(fast, raw, wall)  # stores the key's template (or finds it stored)
        raw2 = _raw(random.Random(i), src, dst)  # another packet: its key may have no template yet
        got = fast.encode_raw(raw, wall, event_id, rules.mapping(), pods.ip_table())
        assert got is not None and _texts(got) == _texts(expected), i
        built += 1
        later = fast.encode_raw(raw2, wall + 1.0, event_id + 1, rules.mapping(), pods.ip_table())
        if later is not None:
            assert _texts(later) == _texts(_by_encode(fast, raw2, wall + 1.0)[0]), i
    assert built == 400


def test_a_raw_record_needs_its_keys_template_and_the_same_rule_and_pods() -> None:
    rules, pods, fast = _stack()
    raw = message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1001, reg7=1)
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is None  # no template yet
    _primed(fast, raw, T0)
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is not None
    other_port = message(frame(V4[0], V4[1], "udp", 5354), reg6=0x1001, reg7=1)
    assert fast.encode_raw(other_port, T0, 1, rules.mapping(), pods.ip_table()) is not None  # the same key
    for other in (message(frame(V4[1], V4[0], "udp", 5353), reg6=0x1001, reg7=1),  # other addresses
                  message(frame(V4[0], V4[1], "tcp", 5353), reg6=0x1001, reg7=1),  # other protocol
                  message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1003, reg7=1),  # other rule
                  message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1001, reg7=0),  # other disposition
                  message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1001, reg7=1, in_port=9),  # other port
                  message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1001, reg7=1, cookie=4)):  # other flow
        assert fast.encode_raw(other, T0, 1, rules.mapping(), pods.ip_table()) is None
    pods.table = MappingProxyType(dict(PODS))  # the same Pods, a new table: worked out again first
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is None
    _primed(fast, raw, T0)
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is not None
    rules.replace(dict(RENAMED))  # a new rule object for 0x1001: its texts may differ
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is None
    renamed, event_id = _primed(fast, raw, T0)
    assert "deny-renamed" in renamed.tail + renamed.head
    assert _texts(fast.encode_raw(raw, T0, event_id, rules.mapping(), pods.ip_table())) == _texts(renamed)


@pytest.mark.parametrize("raw", [
    message(frame(V4[0], V4[1], "icmp", 8), reg6=0x1001, reg7=1),  # ICMP: decode_frame's slow path
    message(frame(V4[0], V4[1], "udp", 5353, frag=0x2000), reg6=0x1001, reg7=1),  # a fragment
    message(frame(V4[0], V4[1], "udp", 5353, vlan=True), reg6=0x1001, reg7=1),  # tagged
    message(frame(V4[0], ODD, "udp", 5353), reg6=0x1001, reg7=1),  # a Pod name encode hands to Python
    message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1004, reg7=1),  # a rule text encode hands to Python
    message(frame(V4[0], V4[1], "udp", 5353), reg6=0, reg7=1),  # no rule
])
def test_what_encode_does_not_build_itself_has_no_raw_record(raw: bytes) -> None:
    rules, pods, fast = _stack()
    _primed(fast, raw, T0)
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is None


def test_a_message_decode_refuses_has_no_raw_record() -> None:
    rules, pods, fast = _stack()
    raw = message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1001, reg7=1)
    _primed(fast, raw, T0)
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is not None
    for bad in (raw[:-3], raw[:15], raw[:2] + (len(raw) + 8).to_bytes(2, "big") + raw[4:] + bytes(8),
                raw[:16] + b"\x00\x00\x00\x02" + raw[20:]):  # the packet property claims 2 bytes
        with pytest.raises(DecodeError):
            decode_packet_in2(bad, T0)
        assert fast.encode_raw(bad, T0, 1, rules.mapping(), pods.ip_table()) is None


def test_templates_outlive_being_emptied() -> None:
    """Many keys: the templates are emptied when half the slots are taken, and worked out again."""
    rules, pods, fast = _stack()
    table = dict(PODS)
    for i in range(700):
        table[f"10.20.{i // 250}.{i % 250 + 1}"] = ("ns", f"p{i}")
    pods.table = MappingProxyType(table)
    for i in range(700):
        raw = message(frame(f"10.20.{i // 250}.{i % 250 + 1}", V4[1], "udp", 80), reg6=0x1001, reg7=1)
        expected, event_id = _primed(fast, raw, T0 + i)
        assert _texts(fast.encode_raw(raw, T0 + i, event_id, rules.mapping(), pods.ip_table())) == _texts(expected)


def test_without_an_event_id_the_next_is_drawn_once_the_record_is_certain() -> None:
    """event_id None: encode_raw draws the encoder's next id, as encode does, and only when it builds the record."""
    rules, pods, fast = _stack()
    raw = message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1001, reg7=1)
    _, last = _primed(fast, raw, T0)
    assert fast.encode_raw(message(frame(V4[1], V4[0], "udp", 1), reg6=0x1001, reg7=1), T0, None, rules.mapping(),
                           pods.ip_table()) is None  # no template: no id drawn
    got = fast.encode_raw(raw, T0, None, rules.mapping(), pods.ip_table())
    assert got is not None and _ID.search(got.head).group(1) == f"{last + 1:016x}"  # type: ignore[union-attr]
    assert _by_encode(fast, raw, T0)[1] == last + 2


class _Table(dict):  # type: ignore[type-arg]
    """A Pod table a weak reference can follow."""


def test_a_new_pod_table_empties_the_templates_and_lets_the_old_table_go() -> None:
    import gc
    import weakref

    rules, pods, fast = _stack()
    pods.table = _Table(PODS)
    raw = message(frame(V4[0], V4[1], "udp", 5353), reg6=0x1001, reg7=1)
    _primed(fast, raw, T0)
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is not None
    old = weakref.ref(pods.table)
    pods.table = _Table(PODS)
    _primed(fast, message(frame(V4[1], V4[0], "udp", 53), reg6=0x1001, reg7=1), T0)  # kept for the new table
    gc.collect()
    assert old() is None  # no template keeps the old table alive
    assert fast.encode_raw(raw, T0, 1, rules.mapping(), pods.ip_table()) is None  # its texts went with it
