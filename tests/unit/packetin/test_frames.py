"""packetin.frames and every fast reader of frames, checked against the full decoder (auditlog.packet).

Frames are generated: VLAN stacks of every tag type (and tag types that are none), IPv4 with
options, fragments and bad headers, IPv6 with extension-header chains and fragment headers,
transports of every kind, every frame also cut short anywhere. Each fast path (the fair-share
key, the overload group key and the pipeline's per-group read, the Reject answer, trace tags)
must say what decode_frame says about the same bytes.
"""

from __future__ import annotations

import ipaddress
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from auditlog.packet import PacketSummary, decode_frame, flow_key
from auditlog.packet import group_lasts
from packetin import frames
from packetin.fair_key import destination_address
from packetin.groups import FRAME_OFFSET, group_key
from packetin.protocol_numbers import ETH_TYPE_IPV4, ETH_TYPE_IPV6
from policy_agent.policy.reject import build_reject
from policy_agent.traceflow.tags import identity, packet_ports

MACS = bytes.fromhex("020000000002" "020000000001")
TRANSPORTS = (6, 17, 1, 132, 58, 47, 59)


@st.composite
def vlan_tags(draw: st.DrawFn) -> bytes:
    tags = draw(st.lists(st.tuples(st.sampled_from(sorted(frames.VLAN_TPIDS)), st.integers(0, 0xFFFF)), max_size=3))
    return b"".join(struct.pack("!HH", tpid, tci) for tpid, tci in tags)


def transport(draw: st.DrawFn, proto: int) -> bytes:
    if proto == 6:
        doff = draw(st.integers(5, 15))
        flags = draw(st.integers(0, 0x1FF))
        head = struct.pack("!HHIIHHHH", draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 0xFFFF)),
                           draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)),
                           (doff << 12) | flags, 512, 0, 0)
        return head + bytes((doff - 5) * 4)
    if proto in (1, 58):
        return bytes([draw(st.integers(0, 255)), draw(st.integers(0, 255))]) + bytes(6)
    return struct.pack("!HH", draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 0xFFFF))) + bytes(8)


@st.composite
def ipv4(draw: st.DrawFn) -> bytes:
    version = draw(st.sampled_from((4, 4, 4, 4, 6)))
    ihl = draw(st.sampled_from((5, 5, 5, 6, 15, 3)))
    proto = draw(st.sampled_from(TRANSPORTS))
    more = draw(st.booleans()) and draw(st.booleans())
    offset = draw(st.sampled_from((0, 0, 0, 1, 185, 0x1FFF)))
    header = struct.pack("!BBHHHBBH4s4s", (version << 4) | ihl, draw(st.integers(0, 255)), 0, 0,
                         (0x2000 if more else 0) | offset, 64, proto, 0,
                         draw(st.binary(min_size=4, max_size=4)), draw(st.binary(min_size=4, max_size=4)))
    header += bytes(max(ihl - 5, 0) * 4)
    return header + transport(draw, proto) + draw(st.binary(max_size=8))


@st.composite
def ipv6(draw: st.DrawFn) -> bytes:
    final = draw(st.sampled_from(TRANSPORTS))
    exts = draw(st.lists(st.sampled_from((0, 43, 60, 51, 44, 135)), max_size=4))
    chain = [*exts, final]
    body = b""
    for ext, nxt in zip(exts, chain[1:]):
        if ext == 44:
            offset_m = (draw(st.sampled_from((0, 0, 1, 300))) << 3) | draw(st.integers(0, 1))
            body += struct.pack("!BBHI", nxt, 0, offset_m, 7)
        elif ext == 51:  # AH: length in 4-octet units - 2
            units = draw(st.integers(1, 3))
            body += bytes([nxt, units]) + bytes((units + 2) * 4 - 2)
        else:
            units = draw(st.integers(0, 2))
            body += bytes([nxt, units]) + bytes((units + 1) * 8 - 2)
    body += transport(draw, final) + draw(st.binary(max_size=8))
    version = draw(st.sampled_from((6, 6, 6, 4)))
    return (struct.pack("!IHBB", version << 28, len(body), chain[0], 64) + draw(st.binary(min_size=16, max_size=16))
            + draw(st.binary(min_size=16, max_size=16)) + body)


@st.composite
def ethernet_frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from((ETH_TYPE_IPV4, ETH_TYPE_IPV6, ETH_TYPE_IPV4, ETH_TYPE_IPV6, 0x0806, 0x0100)))
    payload = {ETH_TYPE_IPV4: ipv4, ETH_TYPE_IPV6: ipv6}.get(kind, lambda: st.binary(max_size=40))()
    frame = MACS + draw(vlan_tags()) + struct.pack("!H", kind) + draw(payload)
    if draw(st.booleans()):
        frame = frame[:draw(st.integers(0, len(frame)))]
    return frame


def packed(address: str | None) -> bytes:
    return b"" if address is None else ipaddress.ip_address(address).packed


def packet_in2(frame: bytes) -> bytes:
    """An NXT_PACKET_IN2 carrying `frame` first (as OVS sends it) and a table id."""
    props = b""
    for ptype, body in ((0, frame), (3, b"\x28")):
        length = 4 + len(body)
        props += struct.pack("!HH", ptype, length) + body + bytes(-length % 8)
    return struct.pack("!BBHIII", 6, 4, 16 + len(props), 0, 0x2320, 30) + props


def nonfirst_fragment(frame: bytes) -> bool:
    """An IPv4 frame whose fragment offset is not 0, read by a walk of its own (not packetin.frames)."""
    if decode_frame(frame).ip_version != 4:
        return False
    off = 12
    while int.from_bytes(frame[off:off + 2], "big") in (0x8100, 0x88A8, 0x9100):
        off += 4
    return int.from_bytes(frame[off + 8:off + 10], "big") & 0x1FFF != 0


def tagged(frame: bytes) -> bool:
    return int.from_bytes(frame[12:14], "big") in (0x8100, 0x88A8, 0x9100)


@settings(max_examples=600, deadline=None)
@given(ethernet_frames())
def test_the_fair_share_destination_is_the_decoders(frame: bytes) -> None:
    summary = decode_frame(frame)
    assert destination_address(frame) == packed(summary.dst_ip)


@settings(max_examples=600, deadline=None)
@given(ethernet_frames())
def test_a_frame_has_a_group_key_exactly_when_the_decoder_finds_untagged_whole_ipv4_no_fragment(frame: bytes
                                                                                                 ) -> None:
    summary = decode_frame(frame)
    key = group_key(packet_in2(frame))
    if key is not None:
        assert summary.eth_type == ETH_TYPE_IPV4 and summary.vlan is None and summary.ip_version == 4
        assert not summary.fragment
        # The pipeline reads each grouped message's last key field and truncation without decoding.
        assert group_lasts([packet_in2(frame)], summary) == ([flow_key(summary)[3]], int(summary.truncated))
    elif summary.ip_version == 4 and not summary.fragment and not summary.truncated:
        assert tagged(frame)


@settings(max_examples=600, deadline=None)
@given(ethernet_frames())
def test_the_reject_answer_goes_back_to_what_the_decoder_read(frame: bytes) -> None:
    summary = decode_frame(frame)
    answer = build_reject(frame)
    if answer is None:
        if summary.ip_version == 4 and not summary.truncated and not nonfirst_fragment(frame):
            # Nothing sensible to send: a RST, or an ICMP message other than an echo request.
            assert (summary.protocol == 6 and summary.tcp_flags is not None and summary.tcp_flags & 0x04) or (
                summary.protocol == 1 and summary.icmp_type != 8)
        return
    assert summary.ip_version == 4 and not nonfirst_fragment(frame)
    back = decode_frame(answer)
    assert (back.src_ip, back.dst_ip, back.vlan) == (summary.dst_ip, summary.src_ip, summary.vlan)
    assert not back.truncated
    if back.protocol == 6:
        assert (back.src_port, back.dst_port) == (summary.dst_port, summary.src_port)
        assert back.tcp_flags is not None and back.tcp_flags & 0x04
    else:
        assert (back.protocol, back.icmp_type, back.icmp_code) == (1, 3, 13)


@settings(max_examples=600, deadline=None)
@given(ethernet_frames())
def test_a_trace_identity_holds_what_the_decoder_read(frame: bytes) -> None:
    summary = decode_frame(frame)
    key = identity(frame)
    assert (key is not None) == (summary.ip_version == 4)
    if key is None:
        return
    assert (key[1], key[2:6], key[6:10]) == (summary.protocol, packed(summary.src_ip), packed(summary.dst_ip))
    if summary.protocol in (6, 17, 132):
        assert packet_ports(frame) == (summary.src_port, summary.dst_port)
    elif summary.protocol == 1 and summary.icmp_code is not None:
        assert key[10:] == bytes([summary.icmp_type, summary.icmp_code])


@settings(max_examples=300, deadline=None)
@given(ethernet_frames())
def test_the_walker_finds_the_network_header_the_decoder_names(frame: bytes) -> None:
    summary = decode_frame(frame)
    l3 = frames.l3_offset(frame)
    if l3 < 0:
        assert summary.truncated and summary.eth_type is None
        return
    assert frames.outer_vlan(frame, l3) == summary.vlan
    kind = frames.eth_type(frame, l3)
    if kind >= frames.MIN_ETHERTYPE:
        assert kind == summary.eth_type
    if summary.ip_version == 4:
        assert frames.ipv4_header_len(frame, l3) >= 20


def test_every_vlan_tag_type_is_walked_the_same_by_every_reader() -> None:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    udp = struct.pack("!HHHH", 40000, 53, 8, 0)
    for tpid in (0x8100, 0x88A8, 0x9100):
        frame = MACS + struct.pack("!HH", tpid, 7) + b"\x08\x00" + ip + udp
        summary = decode_frame(frame)
        assert summary == PacketSummary(eth_type=ETH_TYPE_IPV4, vlan=7, ip_version=4, src_ip="10.0.0.1",
                                        dst_ip="10.0.0.2", protocol=17, transport="udp", src_port=40000,
                                        dst_port=53, length=len(frame))
        assert destination_address(frame) == bytes([10, 0, 0, 2])
        assert packet_ports(frame) == (40000, 53)
        answer = build_reject(frame)
        assert answer is not None and answer[12:16] == struct.pack("!HH", tpid, 7)
        assert group_key(packet_in2(frame)) is None  # groups hold untagged frames only
    assert FRAME_OFFSET == 20
