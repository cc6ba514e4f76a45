"""Trace tags: one DSCP value per running trace, least recently used first; trace packets recognised exactly."""

from __future__ import annotations

import pytest
from scapy.all import ICMP, IP, TCP, UDP, Ether, raw

from policy_agent.traceflow.tags import TAG_VALUES, TagRegistry, TagsExhausted, identity


def frame(dscp: int, src: str = "10.0.0.1", dst: str = "10.0.0.2", udp: bool = False, sport: int = 40000) -> bytes:
    l4 = UDP(sport=sport, dport=53) if udp else TCP(sport=sport, dport=80, flags="S")
    return raw(Ether() / IP(src=src, dst=dst, tos=dscp << 2) / l4)


def test_tags_avoid_the_standard_per_hop_behaviours() -> None:
    assert not {0, 1, 8, 10, 18, 26, 34, 46, 48} & set(TAG_VALUES)
    assert len(TAG_VALUES) == len(set(TAG_VALUES)) > 30 and all(0 < v < 64 for v in TAG_VALUES)


def test_running_traces_get_distinct_tags_and_exhaustion_is_an_error() -> None:
    reg = TagRegistry(values=(3, 5))
    assert {reg.allocate(), reg.allocate()} == {3, 5} and reg.running == 2
    with pytest.raises(TagsExhausted, match="all 2 trace tags are in use"):
        reg.allocate()


def test_a_released_tag_is_reused_after_every_other_free_tag() -> None:
    reg = TagRegistry(values=(3, 5, 7))
    first = reg.allocate()
    reg.release(first)
    reg.release(first)  # twice: still once in the pool
    assert [reg.allocate() for _ in range(3)] == [5, 7, 3]


def test_a_trace_packet_is_recognised_until_forgotten_even_after_its_tag_is_reused() -> None:
    reg = TagRegistry(values=(3,))
    assert reg.match(frame(3)) is None  # nothing held: not even parsed
    tag = reg.allocate()
    key = reg.hold(frame(tag))
    reg.release(tag)
    again = reg.allocate()  # the same DSCP, another trace packet
    reg.hold(frame(again, udp=True))
    assert reg.match(frame(3)) == 3 and reg.match(frame(3, udp=True)) == 3
    reg.forget(key)
    assert reg.match(frame(3)) is None and reg.match(frame(3, udp=True)) == 3


def test_only_the_exact_trace_packet_is_recognised() -> None:
    reg = TagRegistry()
    tag = reg.allocate()
    reg.hold(frame(tag))
    assert reg.match(frame(tag)) == tag
    assert reg.match(frame(tag, src="10.0.0.3")) is None  # real traffic with that DSCP
    assert reg.match(frame(tag, dst="10.0.0.3")) is None
    assert reg.match(frame(tag, sport=40001)) is None
    assert reg.match(frame(tag, udp=True)) is None
    assert reg.match(frame(0)) is None
    assert reg.match(b"\x00" * 20) is None and reg.match(frame(tag)[:30]) is None


def test_identity_of_icmp_is_type_and_code_and_non_ipv4_has_none() -> None:
    echo = raw(Ether() / IP(src="10.0.0.1", dst="10.0.0.2", tos=12) / ICMP(type=8, id=7))
    assert identity(echo) == bytes([12, 1]) + bytes([10, 0, 0, 1, 10, 0, 0, 2]) + bytes([8, 0])
    assert identity(raw(Ether(type=0x86DD) / (b"\x00" * 40))) is None
    with pytest.raises(ValueError):
        TagRegistry().hold(b"\x00" * 60)


def test_packet_ports() -> None:
    from policy_agent.traceflow.tags import packet_ports

    assert packet_ports(frame(0, sport=41000)) == (41000, 80)
    assert packet_ports(raw(Ether() / IP() / ICMP())) == (None, None)
    assert packet_ports(b"") == (None, None)
