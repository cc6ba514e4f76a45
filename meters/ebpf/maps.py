"""The XDP offload's map keys and values as bytes: a pure codec of the layout in xdp_offload.c."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address

from meters.errors import InvalidOffloadEntry

FAMILY_IPV4 = 4
FAMILY_IPV6 = 6
# The protocols the program keys on (xdp_offload.c `parse`); anything else is never cached.
IPPROTO_ICMP = 1
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_SCTP = 132
IPPROTO_ICMPV6 = 58
PORT_PROTOCOLS = frozenset({IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP})
ICMP_PROTOCOLS = frozenset({IPPROTO_ICMP, IPPROTO_ICMPV6})

NS_PER_TOKEN = 1_000_000_000  # the program's bucket counts nano-packets
# The program's refill multiplies an elapsed time of up to 10 s by the rate; this
# bound keeps that product inside 64 bits with a wide margin.
MAX_RATE_PPS = 1_000_000
MAX_BURST = 1_000_000
U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF

# Indexes of the per-CPU offload_stats array.
STAT_EXPIRED = 0   # a key was found but had expired: passed
STAT_NO_STATE = 1  # the state map was full: passed (never dropped uncounted)
STAT_NAMES = ("expired", "no_state")

# Native byte order and no implicit padding ("="), as the BPF maps store them.
_KEY = struct.Struct("=IBB2s16s16s")
_RULE = struct.Struct("=QIIII")
_STATE = struct.Struct("=QQQQQQ")
KEY_SIZE, RULE_SIZE, STATE_SIZE = _KEY.size, _RULE.size, _STATE.size


def icmp_port(icmp_type: int, code: int) -> int:
    """The key's port field for ICMP/ICMPv6: type in the high byte, code in the low one."""
    return (icmp_type << 8) | code


@dataclass(frozen=True, slots=True)
class OffloadKey:
    """One flow as the program sees it arriving on a veth.

    `port` is the L4 destination port for TCP/UDP/SCTP and `icmp_port(type, code)`
    for ICMP/ICMPv6; `ifindex` is the host-side veth's index in its own namespace.
    """

    ifindex: int
    src: IPv4Address | IPv6Address
    dst: IPv4Address | IPv6Address
    proto: int
    port: int

    @classmethod
    def make(cls, ifindex: int, src: str, dst: str, proto: int, port: int) -> OffloadKey:
        try:
            key = cls(ifindex, ip_address(src), ip_address(dst), proto, port)
        except ValueError as exc:
            raise InvalidOffloadEntry(f"offload key: {exc}") from exc
        key.validate()
        return key

    @property
    def family(self) -> int:
        return FAMILY_IPV4 if self.src.version == 4 else FAMILY_IPV6

    def validate(self) -> None:
        if not 0 < self.ifindex <= U32_MAX:
            raise InvalidOffloadEntry(f"offload key: ifindex must be in 1..{U32_MAX}, got {self.ifindex}")
        if self.src.version != self.dst.version:
            raise InvalidOffloadEntry(f"offload key: src {self.src} and dst {self.dst} differ in family")
        if self.proto not in PORT_PROTOCOLS | ICMP_PROTOCOLS:
            raise InvalidOffloadEntry(f"offload key: proto {self.proto} is not TCP, UDP, SCTP, ICMP or ICMPv6")
        if not 0 <= self.port <= 0xFFFF:
            raise InvalidOffloadEntry(f"offload key: port must be in 0..65535, got {self.port}")

    def describe(self) -> str:
        return f"if{self.ifindex} {self.src}->{self.dst} proto {self.proto} port {self.port}"


def encode_key(key: OffloadKey) -> bytes:
    key.validate()
    return _KEY.pack(key.ifindex, key.family, key.proto, key.port.to_bytes(2, "big"),
                     key.src.packed.ljust(16, b"\0"), key.dst.packed.ljust(16, b"\0"))


def decode_key(raw: bytes) -> OffloadKey:
    if len(raw) != KEY_SIZE:
        raise InvalidOffloadEntry(f"offload key: {len(raw)} bytes, expected {KEY_SIZE}")
    ifindex, family, proto, port, src, dst = _KEY.unpack(raw)
    if family == FAMILY_IPV4:
        if src[4:].strip(b"\0") or dst[4:].strip(b"\0"):
            raise InvalidOffloadEntry("offload key: IPv4 address with non-zero padding")
        addrs: tuple[IPv4Address | IPv6Address, ...] = (IPv4Address(src[:4]), IPv4Address(dst[:4]))
    elif family == FAMILY_IPV6:
        addrs = (IPv6Address(src), IPv6Address(dst))
    else:
        raise InvalidOffloadEntry(f"offload key: family {family} is neither 4 nor 6")
    key = OffloadKey(ifindex, addrs[0], addrs[1], proto, int.from_bytes(port, "big"))
    key.validate()
    return key


@dataclass(frozen=True, slots=True)
class OffloadRule:
    """What the agent writes for a key: the judging rule, an expiry and the sampling bucket.

    `expires_ns` is CLOCK_MONOTONIC nanoseconds (Python's time.monotonic_ns(), the
    kernel's bpf_ktime_get_ns()). `rate_pps` packets/s (after a burst of `burst`)
    still go on to OVS, so the slow path keeps deciding and logging samples.
    """

    rule_id: int
    rate_pps: int
    burst: int
    expires_ns: int

    def validate(self) -> None:
        if not 0 <= self.rule_id <= U32_MAX:
            raise InvalidOffloadEntry(f"offload rule {self.rule_id}: rule_id must fit 32 bits")
        if not 0 <= self.rate_pps <= MAX_RATE_PPS:
            raise InvalidOffloadEntry(f"offload rule {self.rule_id}: rate_pps must be in 0..{MAX_RATE_PPS}, "
                                      f"got {self.rate_pps}")
        if not 0 <= self.burst <= MAX_BURST:
            raise InvalidOffloadEntry(f"offload rule {self.rule_id}: burst must be in 0..{MAX_BURST}, got {self.burst}")
        if not 0 <= self.expires_ns <= U64_MAX:
            raise InvalidOffloadEntry(f"offload rule {self.rule_id}: expires_ns must fit 64 bits")


def rule_until(rule_id: int, rate_pps: int, burst: int, now_ns: int, ttl_ns: int) -> OffloadRule:
    """A rule that expires `ttl_ns` after `now_ns` (the caller's monotonic clock)."""
    rule = OffloadRule(rule_id, rate_pps, burst, now_ns + ttl_ns)
    rule.validate()
    return rule


def encode_rule(rule: OffloadRule) -> bytes:
    rule.validate()
    return _RULE.pack(rule.expires_ns, rule.rule_id, rule.rate_pps, rule.burst, 0)


def decode_rule(raw: bytes) -> OffloadRule:
    if len(raw) != RULE_SIZE:
        raise InvalidOffloadEntry(f"offload rule: {len(raw)} bytes, expected {RULE_SIZE}")
    expires_ns, rule_id, rate_pps, burst, _reserved = _RULE.unpack(raw)
    return OffloadRule(rule_id, rate_pps, burst, expires_ns)


@dataclass(frozen=True, slots=True)
class OffloadCounts:
    """What the program counted for one key: dropped before OVS, and passed on to it."""

    dropped_packets: int = 0
    dropped_bytes: int = 0
    passed_packets: int = 0
    passed_bytes: int = 0

    @property
    def packets(self) -> int:
        return self.dropped_packets + self.passed_packets

    def __add__(self, other: OffloadCounts) -> OffloadCounts:
        return OffloadCounts(self.dropped_packets + other.dropped_packets, self.dropped_bytes + other.dropped_bytes,
                             self.passed_packets + other.passed_packets, self.passed_bytes + other.passed_bytes)


@dataclass(frozen=True, slots=True)
class OffloadState:
    """The program's per-key state: the bucket (nano-packets, last refill) and the counts."""

    tokens: int
    last_ns: int
    counts: OffloadCounts


def decode_state(raw: bytes) -> OffloadState:
    if len(raw) != STATE_SIZE:
        raise InvalidOffloadEntry(f"offload state: {len(raw)} bytes, expected {STATE_SIZE}")
    tokens, last_ns, *counts = _STATE.unpack(raw)
    return OffloadState(tokens, last_ns, OffloadCounts(*counts))
