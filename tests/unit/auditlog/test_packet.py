"""auditlog.packet: frame summaries for every protocol case, truncations, and arbitrary bytes.

Frames come from three places: scapy (built the way the datapath would hand them
over, one per protocol case, with the exact summary expected), the recording of
real OVS 3.1 packet-ins (tests/unit/data), and hypothesis (arbitrary bytes,
corrupted catalogue frames, and scapy frames built from drawn parameters).
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)  # "MAC address not found" noise

from scapy.layers.inet import ICMP, IP, TCP, UDP, fragment  # noqa: E402
from scapy.layers.inet6 import (  # noqa: E402
    ICMPv6DestUnreach, ICMPv6EchoRequest, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, fragment6,
)
from scapy.layers.ipsec import AH  # noqa: E402
from scapy.layers.l2 import ARP, LLC, Dot1AD, Dot1Q, Dot3, Ether  # noqa: E402
from scapy.layers.sctp import SCTP  # noqa: E402
from scapy.packet import Packet, Raw  # noqa: E402

from auditlog.packet import PacketSummary, decode_frame, flow_key  # noqa: E402
from packetin import wire  # noqa: E402

MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}
V4 = {"src": "10.10.1.5", "dst": "10.10.2.7"}
V6 = {"src": "fd00:10:10:1::5", "dst": "fd00:10:10:2::7"}
PAYLOAD = Raw(b"payload-bytes-that-are-no-header")


def eth(*layers: Packet, **kw: object) -> Packet:
    pkt = Ether(**{**MAC, **kw})
    for layer in layers:
        pkt = pkt / layer
    return pkt


def v4(**kw: object) -> PacketSummary:
    base = dict(eth_type=0x0800, ip_version=4, src_ip=V4["src"], dst_ip=V4["dst"])
    return PacketSummary(**{**base, **kw})  # type: ignore[arg-type]


def v6(**kw: object) -> PacketSummary:
    base = dict(eth_type=0x86DD, ip_version=6, src_ip=V6["src"], dst_ip=V6["dst"])
    return PacketSummary(**{**base, **kw})  # type: ignore[arg-type]


def header_end(pkt: Packet, layer: type[Packet], size: int) -> int:
    """Offset where the headers the decoder reads end: `size` bytes into `layer`."""
    return len(bytes(pkt)) - len(bytes(pkt[layer])) + size


@dataclass(frozen=True)
class Case:
    name: str
    frame: bytes
    expected: PacketSummary  # without `length`, which is always len(frame)
    headers: int  # bytes of header the decoder reads; shorter frames are truncated


def case(name: str, pkt: Packet, expected: PacketSummary, headers: int | None = None) -> Case:
    frame = bytes(pkt)
    return Case(name, frame, expected, len(frame) if headers is None else headers)


def l4_case(name: str, pkt: Packet, layer: type[Packet], size: int | None, expected: PacketSummary) -> Case:
    """size None: the TCP header length the built segment announces (its data offset)."""
    if size is None:
        size = Ether(bytes(pkt))[TCP].dataofs * 4
    return case(name, pkt, expected, header_end(pkt, layer, size))


TCP_SYN = TCP(sport=40000, dport=8080, flags="S", options=[("MSS", 1460), ("NOP", None), ("WScale", 7)])
TCP_SYN_FLAGS = 0x002
TCP_ECN_SYN = TCP(sport=40001, dport=443, flags="SEC")  # CWR|ECE|SYN
SCTP_INIT = SCTP(sport=3868, dport=3868, tag=0)


def ipv4_fragments() -> list[Packet]:
    datagram = IP(**V4, id=0x1234) / UDP(sport=5353, dport=9999) / Raw(b"x" * 2400)
    return [eth(f) for f in fragment(datagram, fragsize=1000)]


def ipv6_fragments() -> list[Packet]:
    datagram = IPv6(**V6) / IPv6ExtHdrHopByHop() / IPv6ExtHdrFragment(id=77) / TCP(sport=1, dport=2) / Raw(b"y" * 2400)
    return [eth(f) for f in fragment6(datagram, 1280)]


def catalogue() -> list[Case]:
    tcp_flags = int(TCP_ECN_SYN.flags)
    frags4, frags6 = ipv4_fragments(), ipv6_fragments()
    ah = AH(nh=60, payloadlen=4, spi=0x100, seq=1, icv=b"\x00" * 12)  # (12 + 12) / 4 - 2 = 4
    cases = [
        l4_case("ipv4-tcp-syn-options", eth(IP(**V4), TCP_SYN, PAYLOAD), TCP, None,
                v4(protocol=6, transport="tcp", src_port=40000, dst_port=8080, tcp_flags=TCP_SYN_FLAGS)),
        l4_case("ipv4-tcp-ecn-flags", eth(IP(**V4), TCP_ECN_SYN), TCP, 20,
                v4(protocol=6, transport="tcp", src_port=40001, dst_port=443, tcp_flags=tcp_flags)),
        l4_case("ipv4-udp", eth(IP(**V4), UDP(sport=5353, dport=53), PAYLOAD), UDP, 8,
                v4(protocol=17, transport="udp", src_port=5353, dst_port=53)),
        l4_case("ipv4-sctp", eth(IP(**V4), SCTP_INIT, PAYLOAD), SCTP, 12,
                v4(protocol=132, transport="sctp", src_port=3868, dst_port=3868)),
        l4_case("ipv4-icmp-echo", eth(IP(**V4), ICMP(type=8, code=0, id=1, seq=1), PAYLOAD), ICMP, 8,
                v4(protocol=1, transport="icmp", icmp_type=8, icmp_code=0)),
        # What a Reject answers with: admin-prohibited, quoting the offending header.
        l4_case("ipv4-icmp-unreachable", eth(IP(**V4), ICMP(type=3, code=13), IP(**V4), UDP(dport=53)), ICMP, 8,
                v4(protocol=1, transport="icmp", icmp_type=3, icmp_code=13)),
        l4_case("ipv4-options-tcp", eth(IP(**V4, options=[b"\x94\x04\x00\x00"]), TCP_SYN), TCP, None,
                v4(protocol=6, transport="tcp", src_port=40000, dst_port=8080, tcp_flags=TCP_SYN_FLAGS)),
        l4_case("ipv4-dont-fragment", eth(IP(**V4, flags="DF"), UDP(sport=1, dport=2)), UDP, 8,
                v4(protocol=17, transport="udp", src_port=1, dst_port=2)),
        l4_case("dot1q-tcp", eth(Dot1Q(vlan=10), IP(**V4), TCP_SYN), TCP, None,
                v4(vlan=10, protocol=6, transport="tcp", src_port=40000, dst_port=8080, tcp_flags=TCP_SYN_FLAGS)),
        l4_case("qinq-8021ad-udp", eth(Dot1AD(vlan=100), Dot1Q(vlan=200), IP(**V4), UDP(sport=7, dport=9)), UDP, 8,
                v4(vlan=100, protocol=17, transport="udp", src_port=7, dst_port=9)),
        l4_case("qinq-9100-icmp", eth(Dot1Q(vlan=300), Dot1Q(vlan=5), IP(**V4), ICMP(), type=0x9100), ICMP, 8,
                v4(vlan=300, protocol=1, transport="icmp", icmp_type=8, icmp_code=0)),
        l4_case("dot1q-vid-4095-pcp", eth(Dot1Q(vlan=4095, prio=7, dei=1), IP(**V4), UDP(sport=1, dport=2)), UDP, 8,
                v4(vlan=4095, protocol=17, transport="udp", src_port=1, dst_port=2)),
        case("ipv4-fragment-first", frags4[0],
             v4(protocol=17, transport="udp", src_port=5353, dst_port=9999, fragment=True), 14 + 20 + 8),
        case("ipv4-fragment-later", frags4[1], v4(protocol=17, transport="udp", fragment=True), 34),
        case("ipv4-fragment-last", frags4[-1], v4(protocol=17, transport="udp", fragment=True), 34),
        case("ipv4-gre-unknown-transport", eth(IP(**V4, proto=47), PAYLOAD), v4(protocol=47), 34),
        l4_case("ipv6-tcp", eth(IPv6(**V6), TCP_SYN), TCP, None,
                v6(protocol=6, transport="tcp", src_port=40000, dst_port=8080, tcp_flags=TCP_SYN_FLAGS)),
        l4_case("ipv6-udp", eth(IPv6(**V6), UDP(sport=546, dport=547), PAYLOAD), UDP, 8,
                v6(protocol=17, transport="udp", src_port=546, dst_port=547)),
        l4_case("ipv6-sctp", eth(IPv6(**V6), SCTP_INIT), SCTP, 12,
                v6(protocol=132, transport="sctp", src_port=3868, dst_port=3868)),
        l4_case("ipv6-icmpv6-echo", eth(IPv6(**V6), ICMPv6EchoRequest(id=3, seq=4)), ICMPv6EchoRequest, 4,
                v6(protocol=58, transport="ipv6-icmp", icmp_type=128, icmp_code=0)),
        l4_case("ipv6-icmpv6-unreachable", eth(IPv6(**V6), ICMPv6DestUnreach(code=1), IPv6(**V6), UDP()),
                ICMPv6DestUnreach, 4, v6(protocol=58, transport="ipv6-icmp", icmp_type=1, icmp_code=1)),
        l4_case("ipv6-ext-chain-hbh-rh-dst-tcp",
                eth(IPv6(**V6), IPv6ExtHdrHopByHop(), IPv6ExtHdrRouting(addresses=["fd00::99"]),
                    IPv6ExtHdrDestOpt(), TCP_SYN), TCP, None,
                v6(protocol=6, transport="tcp", src_port=40000, dst_port=8080, tcp_flags=TCP_SYN_FLAGS)),
        l4_case("ipv6-ext-chain-hbh-ah-dst-udp",
                eth(IPv6(**V6), IPv6ExtHdrHopByHop(), ah, IPv6ExtHdrDestOpt(nh=17), UDP(sport=4500, dport=4500)),
                UDP, 8, v6(protocol=17, transport="udp", src_port=4500, dst_port=4500)),
        l4_case("ipv6-atomic-fragment", eth(IPv6(**V6), IPv6ExtHdrFragment(m=0, offset=0), UDP(sport=3, dport=4)),
                UDP, 8, v6(protocol=17, transport="udp", src_port=3, dst_port=4)),
        case("ipv6-fragment-first-after-hbh", frags6[0],
             v6(protocol=6, transport="tcp", src_port=1, dst_port=2, tcp_flags=0x002, fragment=True),
             14 + 40 + 8 + 8 + 20),
        case("ipv6-fragment-later", frags6[1], v6(protocol=6, transport="tcp", fragment=True), 14 + 40 + 8 + 8),
        case("ipv6-no-next-header", eth(IPv6(**V6, nh=59)), v6(protocol=59), 54),
        case("ipv6-hbh-then-no-next-header", eth(IPv6(**V6), IPv6ExtHdrHopByHop(nh=59), PAYLOAD),
             v6(protocol=59), 62),
        case("ipv6-unknown-protocol", eth(IPv6(**V6, nh=253), PAYLOAD), v6(protocol=253), 54),
        case("arp", eth(ARP(psrc=V4["src"], pdst=V4["dst"]), dst="ff:ff:ff:ff:ff:ff"),
             PacketSummary(eth_type=0x0806), 14),
        case("arp-in-vlan", eth(Dot1Q(vlan=42), ARP()), PacketSummary(eth_type=0x0806, vlan=42), 18),
        case("ieee-802.3-llc", Dot3(**MAC) / LLC() / PAYLOAD, PacketSummary(), 14),
    ]
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)  # test-suite sanity, not product validation
    return cases


CASES = catalogue()
CASE_IDS = [c.name for c in CASES]


@pytest.mark.parametrize("c", CASES, ids=CASE_IDS)
def test_catalogue_frame_summary_is_exact(c: Case) -> None:
    assert decode_frame(c.frame) == c.expected._replace(length=len(c.frame))


@pytest.mark.parametrize("c", CASES, ids=CASE_IDS)
def test_every_truncation_never_raises_and_is_marked(c: Case) -> None:
    full = decode_frame(c.frame)
    for n in range(len(c.frame)):
        cut = decode_frame(c.frame[:n])
        assert cut.length == n
        if n >= c.headers:
            # Only payload was cut: the summary is the same.
            assert cut == full._replace(length=n), n
            continue
        assert cut.truncated, n
        # What a cut frame does report agrees with the whole frame.
        for name in ("eth_type", "vlan", "ip_version", "src_ip", "dst_ip", "protocol", "transport",
                     "src_port", "dst_port", "icmp_type", "icmp_code", "tcp_flags"):
            value = getattr(cut, name)
            assert value is None or value == getattr(full, name), (n, name)
        assert not cut.fragment or full.fragment


def test_memoryview_and_bytearray_decode_like_bytes() -> None:
    frame = CASES[0].frame
    assert decode_frame(memoryview(frame)) == decode_frame(bytearray(frame)) == decode_frame(frame)


@pytest.mark.parametrize("frame", [b"", b"\x00", bytes(13)], ids=["empty", "1-byte", "13-bytes"])
def test_shorter_than_an_ethernet_header(frame: bytes) -> None:
    assert decode_frame(frame) == PacketSummary(truncated=True, length=len(frame))


def test_ipv4_that_is_not_ipv4_claims_only_the_ethertype() -> None:
    good = bytes(eth(IP(**V4), UDP()))
    version_6 = good[:14] + bytes([0x65]) + good[15:]
    ihl_4 = good[:14] + bytes([0x44]) + good[15:]
    for frame in (version_6, ihl_4):
        assert decode_frame(frame) == PacketSummary(eth_type=0x0800, length=len(frame))


def test_ipv6_that_is_not_ipv6_claims_only_the_ethertype() -> None:
    good = bytes(eth(IPv6(**V6), UDP()))
    frame = good[:14] + bytes([0x45]) + good[15:]
    assert decode_frame(frame) == PacketSummary(eth_type=0x86DD, length=len(frame))


@pytest.mark.parametrize("address", ["::ffff:10.1.2.3", "::10.1.2.3", "::", "::1", "::ffff:0:a01:203",
                                     "64:ff9b::a01:203", "2001:db8::1:0:0:1", "fe80::1"])
def test_ipv6_addresses_are_written_as_ipaddress_writes_them(address: str) -> None:
    s = decode_frame(bytes(eth(IPv6(src=address, dst=address), UDP())))
    assert s.src_ip == s.dst_ip == str(ipaddress.IPv6Address(address))


def test_flow_key_uses_dst_port_or_icmp_type() -> None:
    by_name = {c.name: decode_frame(c.frame) for c in CASES}
    assert flow_key(by_name["ipv4-udp"]) == (V4["src"], V4["dst"], 17, 53)
    assert flow_key(by_name["ipv4-icmp-unreachable"]) == (V4["src"], V4["dst"], 1, 3)
    assert flow_key(by_name["ipv6-icmpv6-echo"]) == (V6["src"], V6["dst"], 58, 128)
    assert flow_key(by_name["ipv4-fragment-later"]) == (V4["src"], V4["dst"], 17, None)
    assert flow_key(by_name["arp"]) == (None, None, None, None)
    port_zero = decode_frame(bytes(eth(IP(**V4), UDP(sport=9, dport=0))))
    assert flow_key(port_zero) == (V4["src"], V4["dst"], 17, 0)


# ---- recorded OVS packet-ins ---------------------------------------------------------------

RECORDED = [wire.decode_packet_in2(m, 0.0) for m in
            wire.Framer().feed((Path(__file__).resolve().parents[1] / "data" / "ovs31_packet_in2_stream.bin").read_bytes())]


@pytest.mark.parametrize("index", range(len(RECORDED)))
def test_recorded_ovs_packets_agree_with_scapy(index: int) -> None:
    frame = RECORDED[index].packet
    s = decode_frame(frame)
    parsed = Ether(frame)
    assert s.length == len(frame) and not s.truncated
    assert s.eth_type == parsed.type
    if IP in parsed:
        ip = parsed[IP]
        assert (s.ip_version, s.src_ip, s.dst_ip, s.protocol) == (4, ip.src, ip.dst, ip.proto)
    if ICMP in parsed:
        assert (s.transport, s.icmp_type, s.icmp_code) == ("icmp", parsed[ICMP].type, parsed[ICMP].code)
    if ARP in parsed:
        assert s == PacketSummary(eth_type=0x0806, length=len(frame))


# ---- hypothesis --------------------------------------------------------------------------

def check_invariants(frame: bytes, s: PacketSummary) -> None:
    """What any summary must satisfy, whatever bytes it came from."""
    assert isinstance(s, PacketSummary)
    assert s.length == len(frame)
    assert s.vlan is None or 0 <= s.vlan <= 4095
    assert s.ip_version in (None, 4, 6)
    for port in (s.src_port, s.dst_port):
        assert port is None or 0 <= port <= 0xFFFF
    for small in (s.protocol, s.icmp_type, s.icmp_code):
        assert small is None or 0 <= small <= 0xFF
    assert s.tcp_flags is None or 0 <= s.tcp_flags <= 0x1FF
    if s.ip_version is not None:
        for ip in (s.src_ip, s.dst_ip):
            assert ip is not None
            parsed = ipaddress.ip_address(ip)
            assert parsed.version == s.ip_version and str(parsed) == ip
    else:
        assert s.src_ip is s.dst_ip is s.protocol is s.transport is None
    expected_transport = {1: "icmp", 6: "tcp", 17: "udp", 58: "ipv6-icmp", 132: "sctp"}.get(s.protocol or -1)
    assert s.transport == expected_transport
    if s.src_port is not None:
        assert s.transport in ("tcp", "udp", "sctp") and s.icmp_type is None
    if s.icmp_type is not None:
        assert s.transport in ("icmp", "ipv6-icmp")
    assert len(flow_key(s)) == 4


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(frame: bytes) -> None:
    check_invariants(frame, decode_frame(frame))


PREFIXES = {
    "ipv4": lambda p: eth(IP(**V4, proto=p)),
    "ipv4-fragment": lambda p: eth(IP(**V4, proto=p, frag=185)),
    "ipv6": lambda p: eth(IPv6(**V6, nh=p)),
    "dot1q-ipv6": lambda p: eth(Dot1Q(vlan=3), IPv6(**V6, nh=p)),
    "qinq-ipv4": lambda p: eth(Dot1AD(vlan=3), Dot1Q(vlan=4), IP(**V4, proto=p)),
}
INTERESTING_PROTOCOLS = [0, 1, 6, 17, 43, 44, 51, 58, 59, 60, 132, 135, 139, 140]


@settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(PREFIXES)),
       st.one_of(st.sampled_from(INTERESTING_PROTOCOLS), st.integers(0, 255)), st.binary(max_size=120))
def test_valid_headers_followed_by_arbitrary_bytes_never_raise(prefix: str, proto: int, tail: bytes) -> None:
    # Random bytes after a real IP header drive the extension-header and L4 paths.
    frame = bytes(PREFIXES[prefix](proto)) + tail
    check_invariants(frame, decode_frame(frame))


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       st.integers(0, 10_000))
def test_corrupted_catalogue_frames_never_raise(c: Case, edits: list[tuple[int, int]], cut: int) -> None:
    frame = bytearray(c.frame)
    for pos, value in edits:
        frame[pos % len(frame)] = value
    frame = frame[: cut % (len(frame) + 1)]
    check_invariants(bytes(frame), decode_frame(bytes(frame)))


ports = st.integers(0, 0xFFFF)
v4_addresses = st.ip_addresses(v=4).map(str)
v6_addresses = st.ip_addresses(v=6).map(str)


@st.composite
def built_frames(draw: st.DrawFn) -> tuple[bytes, PacketSummary]:
    """A scapy frame from drawn parameters, and the summary those parameters imply."""
    tags = draw(st.lists(st.integers(0, 4095), max_size=3))
    version = draw(st.sampled_from([4, 6]))
    src = draw(v4_addresses if version == 4 else v6_addresses)
    dst = draw(v4_addresses if version == 4 else v6_addresses)
    kind = draw(st.sampled_from(["tcp", "udp", "sctp", "icmp"]))
    sport, dport = draw(ports), draw(ports)
    expected = dict(eth_type=0x0800 if version == 4 else 0x86DD, vlan=tags[0] if tags else None,
                    ip_version=version, src_ip=src, dst_ip=dst)
    if kind == "tcp":
        flags = draw(st.integers(0, 0x1FF))
        l4: Packet = TCP(sport=sport, dport=dport, flags=flags)
        expected.update(protocol=6, transport="tcp", src_port=sport, dst_port=dport, tcp_flags=flags)
    elif kind == "udp":
        l4 = UDP(sport=sport, dport=dport)
        expected.update(protocol=17, transport="udp", src_port=sport, dst_port=dport)
    elif kind == "sctp":
        l4 = SCTP(sport=sport, dport=dport)
        expected.update(protocol=132, transport="sctp", src_port=sport, dst_port=dport)
    else:
        itype, code = draw(st.integers(0, 255)), draw(st.integers(0, 255))
        l4 = ICMP(type=itype, code=code) if version == 4 else ICMPv6EchoRequest(type=itype, code=code)
        expected.update(protocol=1 if version == 4 else 58, transport="icmp" if version == 4 else "ipv6-icmp",
                        icmp_type=itype, icmp_code=code)
    ip: Packet = IP(src=src, dst=dst) if version == 4 else IPv6(src=src, dst=dst)
    if version == 6:
        for ext in draw(st.lists(st.sampled_from(["hbh", "rh", "dst"]), max_size=3)):
            ip = ip / {"hbh": IPv6ExtHdrHopByHop(), "rh": IPv6ExtHdrRouting(), "dst": IPv6ExtHdrDestOpt()}[ext]
    layers: list[Packet] = [Dot1Q(vlan=t) for t in tags] + [ip, l4, Raw(draw(st.binary(max_size=20)))]
    frame = bytes(eth(*layers))
    return frame, PacketSummary(**expected, length=len(frame))  # type: ignore[arg-type]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(built_frames())
def test_frames_built_from_drawn_parameters_decode_to_those_parameters(built: tuple[bytes, PacketSummary]) -> None:
    frame, expected = built
    assert decode_frame(frame) == expected


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(ihl=st.sampled_from([0x45, 0x45, 0x46, 0x44, 0x55]),
       flags_frag=st.sampled_from([0, 0x4000, 0x2000, 0x0001, 0x6000]),
       proto=st.sampled_from([6, 6, 17, 17, 1, 132, 50]), doff=st.integers(0, 15), ns=st.integers(0, 1),
       cut=st.integers(0, 64), ethertype=st.sampled_from([b"\x08\x00", b"\x08\x00", b"\x86\xdd", b"\x81\x00"]))
@example(ihl=0x45, flags_frag=0, proto=6, doff=6, ns=1, cut=24, ethertype=b"\x08\x00")  # header just whole
@example(ihl=0x45, flags_frag=0, proto=6, doff=6, ns=0, cut=23, ethertype=b"\x08\x00")  # an option byte cut
def test_the_one_unpack_shortcut_gives_the_walks_summary(ihl: int, flags_frag: int, proto: int, doff: int, ns: int,
                                                           cut: int, ethertype: bytes) -> None:
    """decode_frame reads untagged, option-less, unfragmented IPv4 UDP/TCP frames with one unpack: for
    such frames and their near misses (options, fragments, other protocols, headers cut anywhere,
    other ethertypes) the summary is what the header walk gives (auditlog.packet._ipv4, called directly)."""
    from auditlog import packet

    header = bytes([ihl, 0, 0, 60, 0, 1]) + flags_frag.to_bytes(2, "big") + bytes([64, proto, 0, 0])
    transport = bytes([4, 0, 0, 53, 0, 0, 0, 1, 0, 0, 0, 0, doff << 4 | ns, 0x12]) + bytes(range(50))
    frame = b"\x02" * 12 + ethertype + header + bytes([10, 1, 0, 5, 10, 2, 0, 7]) + transport[:cut]
    got = decode_frame(frame)
    check_invariants(frame, got)
    if ethertype == b"\x08\x00":
        assert got == packet._ipv4(frame, 14, None)
