"""Answers for Reject rules, built by the agent: TCP RST, or ICMP destination unreachable.

OVS copies a rejected packet to the agent (userdata flag REJECT) and drops it;
the agent sends the answer back out of the port the packet came in on, so the
client fails fast ("connection refused") instead of waiting for a timeout.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from packetin.messages import packet_out
from packetin.model import Flags, PacketIn

_REJECT = int(Flags.REJECT)  # plain ints: IntFlag arithmetic costs on every packet-in
_LOG = int(Flags.LOG)

ICMP_UNREACHABLE = 3
ICMP_ADMIN_PROHIBITED = 13


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
    """The answer to an Ethernet/IPv4 frame, or None when there is nothing sensible to send."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00":
        return None
    ihl = (frame[14] & 0x0F) * 4
    if ihl < 20 or len(frame) < 14 + ihl:
        return None
    ip = frame[14:14 + ihl]
    proto = ip[9]
    src, dst = ip[12:16], ip[16:20]
    frag = struct.unpack("!H", ip[6:8])[0] & 0x1FFF
    if frag:
        return None  # only the first fragment carries the transport header
    l4 = frame[14 + ihl:]
    eth = frame[6:12] + frame[0:6] + b"\x08\x00"  # back to the sender
    if proto == 6 and len(l4) >= 20:
        sport, dport, seq, ack, off_flags = struct.unpack("!HHIIH", l4[:14])
        flags = off_flags & 0x3F
        if flags & 0x04:  # never answer a RST
            return None
        payload_len = len(l4) - ((off_flags >> 12) * 4)
        if flags & 0x10:  # ACK set: RST with seq = their ack
            rst_seq, rst_ack, rst_flags = ack, 0, 0x04
        else:
            syn_fin = (1 if flags & 0x02 else 0) + (1 if flags & 0x01 else 0)
            rst_seq, rst_ack, rst_flags = 0, (seq + max(payload_len, 0) + syn_fin) & 0xFFFFFFFF, 0x14
        tcp = struct.pack("!HHIIHHHH", dport, sport, rst_seq, rst_ack, (5 << 12) | rst_flags, 0, 0, 0)
        pseudo = dst + src + struct.pack("!BBH", 0, 6, len(tcp))
        tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
        return eth + _ipv4(dst, src, 6, tcp)
    if proto == 1 and len(l4) >= 1 and l4[0] != 8:
        return None  # only echo requests among ICMP get an answer (never answer an error)
    quoted = ip + l4[:8]
    icmp = struct.pack("!BBHI", ICMP_UNREACHABLE, ICMP_ADMIN_PROHIBITED, 0, 0) + quoted
    icmp = icmp[:2] + struct.pack("!H", _checksum(icmp)) + icmp[4:]
    return eth + _ipv4(dst, src, 1, icmp)


class RejectResponder:
    """Category-0 subscriber: answers Reject packet-ins, then hands logged ones on.

    `send` is the channel's fire-and-forget send (a packet-out); `then` is the
    audit subscriber (or None). Reject answers do not depend on logging.
    """

    def __init__(self, send: Callable[[Any], int], then: Callable[[PacketIn], None] | None) -> None:
        self._send = send
        self._then = then
        self.answered = 0
        self.unanswerable = 0

    def __call__(self, pin: PacketIn) -> None:
        flags = pin.flags
        if flags is not None and flags & _REJECT and pin.in_port is not None:
            answer = build_reject(pin.packet)
            if answer is None:
                self.unanswerable += 1
            else:
                self._send(packet_out(answer, pin.in_port))
                self.answered += 1
        if self._then is not None and (flags is None or flags & _LOG):
            self._then(pin)
