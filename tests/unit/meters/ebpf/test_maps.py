"""The XDP offload's map codec: keys, rules and state as the program lays them out (checked against bcc in integration)."""

from __future__ import annotations

import struct
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meters.ebpf import maps
from meters.ebpf.maps import OffloadCounts, OffloadKey, OffloadRule, icmp_port, rule_until
from meters.errors import InvalidOffloadEntry, MeterError

addresses = st.one_of(st.tuples(st.ip_addresses(v=4), st.ip_addresses(v=4)),
                      st.tuples(st.ip_addresses(v=6), st.ip_addresses(v=6)))
keys = st.builds(lambda ifindex, pair, proto, port: OffloadKey(ifindex, pair[0], pair[1], proto, port),
                 st.integers(1, 2**32 - 1), addresses,
                 st.sampled_from(sorted(maps.PORT_PROTOCOLS | maps.ICMP_PROTOCOLS)), st.integers(0, 0xFFFF))
rules = st.builds(OffloadRule, st.integers(0, 2**32 - 1), st.integers(0, maps.MAX_RATE_PPS),
                  st.integers(0, maps.MAX_BURST), st.integers(0, 2**64 - 1))


def test_an_ipv4_udp_key_is_laid_out_as_the_program_reads_it() -> None:
    key = OffloadKey.make(7, "10.244.0.2", "10.244.0.3", maps.IPPROTO_UDP, 5353)
    raw = maps.encode_key(key)
    assert len(raw) == maps.KEY_SIZE == 40
    assert raw[:4] == struct.pack("=I", 7)
    assert raw[4:6] == bytes([4, 17])
    assert raw[6:8] == b"\x14\xe9"  # 5353 in network order: the bytes the program copies from the header
    assert raw[8:24] == bytes([10, 244, 0, 2]) + bytes(12)
    assert raw[24:40] == bytes([10, 244, 0, 3]) + bytes(12)


def test_an_icmp_key_carries_type_then_code_where_the_port_goes() -> None:
    raw = maps.encode_key(OffloadKey.make(1, "fd00::1", "fd00::2", maps.IPPROTO_ICMPV6, icmp_port(128, 0)))
    assert raw[4:8] == bytes([6, 58, 128, 0])
    assert raw[8:24] == IPv6Address("fd00::1").packed


def test_a_rule_is_expiry_then_rule_bucket_and_a_zero_word() -> None:
    raw = maps.encode_rule(OffloadRule(rule_id=0xC0FFEE01, rate_pps=10, burst=20, expires_ns=123))
    assert raw == struct.pack("=QIIII", 123, 0xC0FFEE01, 10, 20, 0)
    assert len(raw) == maps.RULE_SIZE == 24


def test_a_rule_until_expires_ttl_after_the_given_now() -> None:
    assert rule_until(5, 10, 20, now_ns=1_000, ttl_ns=3_000_000_000) == OffloadRule(5, 10, 20, 3_000_001_000)


def test_state_decodes_the_bucket_and_the_four_counts() -> None:
    state = maps.decode_state(struct.pack("=QQQQQQ", 5 * maps.NS_PER_TOKEN, 99, 1000, 49000, 7, 343))
    assert (state.tokens, state.last_ns) == (5 * maps.NS_PER_TOKEN, 99)
    assert state.counts == OffloadCounts(dropped_packets=1000, dropped_bytes=49000, passed_packets=7, passed_bytes=343)
    assert state.counts.packets == 1007
    assert state.counts + state.counts == OffloadCounts(2000, 98000, 14, 686)


@given(keys)
def test_keys_round_trip(key: OffloadKey) -> None:
    assert maps.decode_key(maps.encode_key(key)) == key


@given(rules)
def test_rules_round_trip(rule: OffloadRule) -> None:
    assert maps.decode_rule(maps.encode_rule(rule)) == rule


@given(st.binary(min_size=maps.KEY_SIZE, max_size=maps.KEY_SIZE))
def test_decoding_any_key_bytes_gives_a_key_or_raises_only_our_error(raw: bytes) -> None:
    try:
        key = maps.decode_key(raw)
    except InvalidOffloadEntry:
        return
    assert maps.encode_key(key) == raw


@given(st.binary(max_size=64).filter(lambda b: len(b) not in (maps.KEY_SIZE, maps.RULE_SIZE, maps.STATE_SIZE)))
def test_wrong_sizes_are_refused_by_every_decoder(raw: bytes) -> None:
    for decode in (maps.decode_key, maps.decode_rule, maps.decode_state):
        with pytest.raises(InvalidOffloadEntry):
            decode(raw)


@pytest.mark.parametrize(("args", "field"), [
    ((0, "10.0.0.1", "10.0.0.2", 17, 53), "ifindex"),
    ((1, "10.0.0.1", "fd00::2", 17, 53), "family"),
    ((1, "10.0.0.1", "10.0.0.2", 47, 0), "proto 47"),
    ((1, "10.0.0.1", "10.0.0.2", 17, 70000), "port"),
    ((1, "10.0.0.300", "10.0.0.2", 17, 53), "10.0.0.300"),
])
def test_a_bad_key_is_refused_naming_the_field(args: tuple, field: str) -> None:
    with pytest.raises(InvalidOffloadEntry, match=field) as err:
        OffloadKey.make(*args)
    assert isinstance(err.value, MeterError)


@pytest.mark.parametrize(("rule", "field"), [
    (OffloadRule(2**32, 1, 1, 0), "rule_id"),
    (OffloadRule(1, maps.MAX_RATE_PPS + 1, 1, 0), "rate_pps"),
    (OffloadRule(1, 1, -1, 0), "burst"),
    (OffloadRule(1, 1, 1, 2**64), "expires_ns"),
])
def test_a_bad_rule_is_refused_naming_the_field(rule: OffloadRule, field: str) -> None:
    with pytest.raises(InvalidOffloadEntry, match=field):
        maps.encode_rule(rule)


def test_ipv4_padding_must_be_zero() -> None:
    raw = bytearray(maps.encode_key(OffloadKey(1, IPv4Address("10.0.0.1"), IPv4Address("10.0.0.2"), 6, 80)))
    raw[20] = 1
    with pytest.raises(InvalidOffloadEntry, match="padding"):
        maps.decode_key(bytes(raw))
