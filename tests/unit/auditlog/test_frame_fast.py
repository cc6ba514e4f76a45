"""decode_frame's common case in C (auditlog._record_fast.FrameDecoder, through record_fast.frame_decoder): the
summary decode_frame gives, field for field and type for type, for the frames C takes and for every frame it
hands back; that it takes exactly decode_frame's one-unpack frames; and the pure-Python path."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet, Raw

from auditlog import record_fast
from auditlog.aggregate import Aggregator
from auditlog.packet import PacketSummary, decode_frame
from auditlog.pipeline import AuditPipeline
from auditlog.record import RecordContext
from policy_agent.policy.rules import RuleRegistry

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)


def _decoder() -> Any:
    assert record_fast.built(), "auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev)"
    return record_fast._record_fast.FrameDecoder(PacketSummary, decode_frame)


def typed(s: tuple) -> list[tuple[type, object]]:
    """A summary's fields with their types: True == 1 and 6 == 6.0, but a record writes them differently."""
    return [(type(v), v) for v in s]


def same(decoder: Any, frame: Any) -> PacketSummary:
    got, want = decoder.decode(frame), decode_frame(frame)
    assert type(got) is PacketSummary
    assert typed(got) == typed(want), frame
    return got


def one_unpack(frame: bytes) -> bool:
    """The frames decode_frame reads with its one unpack (and C builds): untagged IPv4 without options, not a
    fragment, UDP with 42 bytes or TCP with 54."""
    return (len(frame) >= 42 and frame[12:14] == b"\x08\x00" and frame[14] == 0x45
            and not int.from_bytes(frame[20:22], "big") & 0x3FFF
            and (frame[23] == 17 or (frame[23] == 6 and len(frame) >= 54)))


def eth(*layers: Packet) -> bytes:
    pkt: Packet = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    for layer in layers:
        pkt = pkt / layer
    return bytes(pkt)


def test_udp_and_tcp_frames_are_built_in_c_as_decode_frame_gives_them() -> None:
    decoder = _decoder()
    udp = eth(IP(src="10.10.1.5", dst="10.10.2.7"), UDP(sport=40000, dport=53), Raw(b"q"))
    tcp = eth(IP(src="10.10.1.5", dst="10.10.2.7"), TCP(sport=40000, dport=443, flags="S"))
    for frame in (udp, tcp, udp):
        same(decoder, frame)
    assert decoder.counts() == {"fast": 3, "python": 0}
    s = decoder.decode(tcp)
    assert (s.src_ip, s.dst_ip, s.protocol, s.transport, s.src_port, s.dst_port, s.tcp_flags, s.length) == \
        ("10.10.1.5", "10.10.2.7", 6, "tcp", 40000, 443, 0x002, len(tcp))
    # the address pair's texts come from the decoder's cache: the same str objects each time
    assert decoder.decode(udp).src_ip is decoder.decode(udp).src_ip


def test_every_other_kind_of_frame_and_every_cut_is_handed_to_decode_frame() -> None:
    decoder = _decoder()
    frames = [eth(IP(src="10.0.0.1", dst="10.0.0.2", options=b"\x01\x01\x01\x00"), UDP(dport=9)),  # options
              eth(IP(src="10.0.0.1", dst="10.0.0.2", flags="MF"), UDP(dport=9)),  # a first fragment
              eth(IP(src="10.0.0.1", dst="10.0.0.2", frag=5), Raw(b"x" * 20)),  # a later one
              eth(Dot1Q(vlan=7), IP(src="10.0.0.1", dst="10.0.0.2"), UDP(dport=9)),
              eth(IP(src="10.0.0.1", dst="10.0.0.2"), ICMP(type=8)),
              eth(IPv6(src="fd00::1", dst="fd00::2"), UDP(dport=9)),
              eth(IP(src="10.0.0.1", dst="10.0.0.2"), TCP(dport=22, dataofs=15))]  # options announced, cut
    for frame in frames:
        for n in range(len(frame) + 1):
            same(decoder, frame[:n])
    udp = eth(IP(src="10.0.0.1", dst="10.0.0.2"), UDP(dport=9))
    for other in (bytearray(udp), memoryview(udp)):  # not bytes: decode_frame takes them
        same(decoder, other)
    counts = decoder.counts()
    taken = sum(1 for f in frames for n in range(len(f) + 1) if one_unpack(f[:n]))
    assert counts["fast"] == taken and counts["python"] == sum(len(f) + 1 for f in frames) - taken + 2


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(ihl=st.sampled_from([0x45, 0x45, 0x46, 0x44, 0x55]),
       flags_frag=st.sampled_from([0, 0x4000, 0x2000, 0x0001, 0x6000, 0x8000]),
       proto=st.sampled_from([6, 6, 17, 17, 1, 132, 50]), doff=st.integers(0, 15), ns=st.integers(0, 1),
       cut=st.integers(0, 64), ethertype=st.sampled_from([b"\x08\x00", b"\x08\x00", b"\x86\xdd", b"\x81\x00"]),
       addrs=st.binary(min_size=8, max_size=8))
@example(ihl=0x45, flags_frag=0, proto=6, doff=6, ns=1, cut=20, ethertype=b"\x08\x00", addrs=bytes(8))  # 54 bytes
@example(ihl=0x45, flags_frag=0, proto=6, doff=6, ns=0, cut=19, ethertype=b"\x08\x00", addrs=bytes(8))  # 53
@example(ihl=0x45, flags_frag=0, proto=17, doff=0, ns=0, cut=8, ethertype=b"\x08\x00", addrs=b"\xff" * 8)  # 42
@example(ihl=0x45, flags_frag=0, proto=17, doff=0, ns=0, cut=7, ethertype=b"\x08\x00", addrs=b"\xff" * 8)  # 41
def test_near_the_one_unpack_frames_c_takes_exactly_those_and_gives_decode_frames_summary(
        ihl: int, flags_frag: int, proto: int, doff: int, ns: int, cut: int, ethertype: bytes, addrs: bytes) -> None:
    decoder = _decoder()
    header = bytes([ihl, 0, 0, 60, 0, 1]) + flags_frag.to_bytes(2, "big") + bytes([64, proto, 0, 0])
    transport = bytes([4, 0, 0, 53, 0, 0, 0, 1, 0, 0, 0, 0, doff << 4 | ns, 0x12]) + bytes(range(50))
    frame = b"\x02" * 12 + ethertype + header + addrs + transport[:cut]
    same(decoder, frame)
    assert decoder.counts()["fast"] == (1 if one_unpack(frame) else 0)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=120))
def test_arbitrary_bytes_give_decode_frames_summary(frame: bytes) -> None:
    same(_decoder(), frame)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.ip_addresses(v=4).map(str), st.ip_addresses(v=4).map(str), st.integers(0, 65535), st.integers(0, 65535),
       st.sampled_from(["udp", "tcp"]), st.integers(0, 0x1FF), st.binary(max_size=30))
def test_drawn_udp_and_tcp_frames_are_taken_and_match(src: str, dst: str, sport: int, dport: int, kind: str,
                                                      flags: int, payload: bytes) -> None:
    decoder = _decoder()
    l4 = UDP(sport=sport, dport=dport) if kind == "udp" else TCP(sport=sport, dport=dport, flags=flags)
    frame = eth(IP(src=src, dst=dst), l4, Raw(payload))
    s = same(decoder, frame)
    assert decoder.counts() == {"fast": 1, "python": 0}
    assert (s.src_ip, s.dst_ip, s.src_port, s.dst_port) == (src, dst, sport, dport)


def test_the_address_cache_is_bounded_and_stays_right_once_emptied() -> None:
    decoder = _decoder()

    def frame(i: int) -> bytes:
        udp = struct.pack("!HHHH", 5000, 53, 8, 0)
        return (b"\x02" * 12 + b"\x08\x00" + bytes([0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0])
                + bytes([10, 0, 0, 1]) + i.to_bytes(4, "big") + udp)

    for i in range(10_000):  # past the 4,096 pairs at which the cache is emptied, twice
        assert decoder.decode(frame(i)).dst_ip == decode_frame(frame(i)).dst_ip
    same(decoder, frame(3))
    assert decoder.counts()["fast"] == 10_001


class NoPods:
    def by_ip(self, ip: str) -> None:
        return None


def test_the_pipeline_decodes_in_c_and_in_pure_python_under_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = RecordContext(node="node-a", rules=RuleRegistry(), pods=NoPods())
    fast = AuditPipeline(ctx, writer=None, aggregator=Aggregator())  # type: ignore[arg-type]
    assert type(fast._decode_frame).__name__ == "builtin_function_or_method"
    assert isinstance(fast._decode_frame.__self__, record_fast._record_fast.FrameDecoder)
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")
    assert AuditPipeline(ctx, writer=None, aggregator=Aggregator())._decode_frame is decode_frame  # type: ignore[arg-type]
    monkeypatch.setattr(record_fast, "_record_fast", None)  # a machine without the module
    monkeypatch.delenv(record_fast.PURE_PYTHON_ENV)
    assert record_fast.frame_decoder() is decode_frame
