"""Trace tags: one DSCP value per running trace, exact-packet recognition, lingering before reuse."""

from __future__ import annotations

import pytest
from scapy.all import IP, TCP, UDP, Ether, raw

from policy_agent.traceflow.tags import TAG_VALUES, TagRegistry, TagsExhausted


def frame(dscp: int, src: str = "10.0.0.1", dst: str = "10.0.0.2", udp: bool = False) -> bytes:
    l4 = UDP(sport=40000, dport=53) if udp else TCP(sport=40000, dport=80, flags="S")
    return raw(Ether() / IP(src=src, dst=dst, tos=dscp << 2) / l4)


def test_tags_avoid_the_standard_per_hop_behaviours() -> None:
    assert not {0, 1, 8, 10, 18, 26, 34, 46, 48} & set(TAG_VALUES)
    assert len(TAG_VALUES) == len(set(TAG_VALUES)) > 30 and all(0 < v < 64 for v in TAG_VALUES)


def test_concurrent_traces_get_distinct_tags_and_exhaustion_is_an_error() -> None:
    reg = TagRegistry(values=(3, 5))
    a = reg.allocate("10.0.0.1", "10.0.0.2", 6, 40000, 80)
    b = reg.allocate("10.0.0.1", "10.0.0.2", 6, 40000, 80)
    assert {a.dscp, b.dscp} == {3, 5}
    with pytest.raises(TagsExhausted, match="all 2 trace tags are in use"):
        reg.allocate("10.0.0.1", "10.0.0.3", 6, 1, 2)


def test_a_forgotten_tag_is_reused_last_and_no_longer_recognised() -> None:
    reg = TagRegistry(values=(3, 5, 7))
    a = reg.allocate("10.0.0.1", "10.0.0.2", 6, 40000, 80)
    assert reg.match(frame(a.dscp)) == a
    reg.forget(a)
    assert reg.match(frame(a.dscp)) is None and len(reg) == 0
    assert [reg.allocate("10.0.0.1", "10.0.0.2", 6, 1, 2).dscp for _ in range(3)] == [5, 7, 3]


def test_forgetting_a_stale_tag_leaves_its_successor_alone() -> None:
    reg = TagRegistry(values=(3,))
    a = reg.allocate("10.0.0.1", "10.0.0.2", 6, 40000, 80)
    reg.forget(a)
    b = reg.allocate("10.0.0.9", "10.0.0.2", 17, 1, 53)
    reg.forget(a)  # a late second forget of the old trace
    assert reg.match(frame(3, src="10.0.0.9", udp=True)) == b


def test_only_the_exact_trace_packet_is_recognised() -> None:
    reg = TagRegistry()
    assert reg.match(frame(TAG_VALUES[0])) is None  # nothing running: not even looked at
    tag = reg.allocate("10.0.0.1", "10.0.0.2", 6, 40000, 80)
    assert reg.match(frame(tag.dscp)) == tag
    assert reg.match(frame(tag.dscp, src="10.0.0.3")) is None  # real traffic with that DSCP
    assert reg.match(frame(tag.dscp, dst="10.0.0.3")) is None
    assert reg.match(frame(tag.dscp, udp=True)) is None
    assert reg.match(frame(0)) is None
    assert reg.match(b"\x00" * 20) is None and reg.match(frame(tag.dscp)[:30]) is None
