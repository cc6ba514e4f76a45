"""The answer to a packet a Reject rule stopped: a TCP RST, or an ICMP destination unreachable.

Pure bytes in, bytes out. The answer goes back to the sender (addresses swapped, the
sender's VLAN tags kept), so the client fails fast ("connection refused") instead of
waiting for a timeout. Only IPv4 is answered; the frame is walked by packetin.frames.
"""

from __future__ import annotations

import struct

from packetin.frames import eth_type, ipv4_fragment_offset, ipv4_header_len, l3_offset
from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_ICMP, IPPROTO_TCP

__all__ = ["ICMP_ADMIN_PROHIBITED", "ICMP_UNREACHABLE", "build_reject", "answer_protocol"]

ICMP_UNREACHABLE = 3
ICMP_ADMIN_PROHIBITED = 13
_ICMP_ECHO_REQUEST = 8
_TCP_RST, _TCP_SYN, _TCP_FIN, _TCP_ACK = 0x04, 0x02, 0x01, 0x10


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ipv4(src: bytes, dst: bytes, proto: int, payload: bytes) -> bytes:
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0x4000, 64, proto, 0, src, dst)
    return header[:10] + struct.pack("!H", _checksum(header)) + header[12:] + payload


def build_reject(frame: bytes) -> bytes | None:
    """The answer to an Ethernet/IPv4 frame, or None when there is nothing sensible to send:
    not IPv4, a non-first fragment, a TCP RST, an ICMP message other than an echo request."""
    l3 = l3_offset(frame)
    if l3 < 0 or eth_type(frame, l3) != ETH_TYPE_IPV4:
        return None
    ihl = ipv4_header_len(frame, l3)
    if not ihl or len(frame) < l3 + ihl:
        return None
    if ipv4_fragment_offset(frame, l3):
        return None  # only the first fragment carries the transport header
    ip = frame[l3:l3 + ihl]
    proto = ip[9]
    src, dst = ip[12:16], ip[16:20]
    l4 = frame[l3 + ihl:]
    eth = frame[6:12] + frame[0:6] + frame[12:l3]  # back to the sender, in its VLAN
    if proto == IPPROTO_TCP and len(l4) >= 20:
        sport, dport, seq, ack, off_flags = struct.unpack("!HHIIH", l4[:14])
        flags = off_flags & 0x3F
        if flags & _TCP_RST:  # never answer a RST
            return None
        payload_len = len(l4) - ((off_flags >> 12) * 4)
        if flags & _TCP_ACK:  # RST with seq = their ack
            rst_seq, rst_ack, rst_flags = ack, 0, _TCP_RST
        else:
            syn_fin = (1 if flags & _TCP_SYN else 0) + (1 if flags & _TCP_FIN else 0)
            rst_seq, rst_ack = 0, (seq + max(payload_len, 0) + syn_fin) & 0xFFFFFFFF
            rst_flags = _TCP_RST | _TCP_ACK
        tcp = struct.pack("!HHIIHHHH", dport, sport, rst_seq, rst_ack, (5 << 12) | rst_flags, 0, 0, 0)
        pseudo = dst + src + struct.pack("!BBH", 0, IPPROTO_TCP, len(tcp))
        tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
        return eth + _ipv4(dst, src, IPPROTO_TCP, tcp)
    if proto == IPPROTO_ICMP and len(l4) >= 1 and l4[0] != _ICMP_ECHO_REQUEST:
        return None  # only echo requests among ICMP get an answer (never answer an error)
    quoted = ip + l4[:8]
    icmp = struct.pack("!BBHI", ICMP_UNREACHABLE, ICMP_ADMIN_PROHIBITED, 0, 0) + quoted
    icmp = icmp[:2] + struct.pack("!H", _checksum(icmp)) + icmp[4:]
    return eth + _ipv4(dst, src, IPPROTO_ICMP, icmp)


def answer_protocol(answer: bytes) -> int:
    """The IP protocol of an answer `build_reject` made: IPPROTO_TCP (a RST) or IPPROTO_ICMP."""
    return answer[l3_offset(answer) + 9]
