"""Category-0 (policy) packet-ins: Reject answered, LOG-flagged ones audited, the debug tap.

OVS copies a rejected packet to the agent (userdata flag REJECT) and drops it;
the agent sends the answer back out of the port the packet came in on, so the
client fails fast ("connection refused") instead of waiting for a timeout.
A packet-in is audited only when its rule logs (flag LOG), or when it carries no
userdata of ours (then the reason code routed it and nothing says otherwise).
"""

from __future__ import annotations

import json
import struct
from typing import Any, Callable, TextIO

from packetin.groups import PacketInGroup
from packetin.messages import packet_out
from packetin.model import Flags, PacketIn

Handler = Callable[[PacketIn], None]

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


class PolicyPacketIns:
    """The category-0 subscriber: dispatches each packet-in on its userdata flags.

    `send` is the channel's fire-and-forget send (a packet-out). `audit`, `offload`
    (the XDP drop offload, which caches floods of logged Drops) and `tap` receive the
    packet-ins that are to be logged; a Reject is answered whether or not its rule logs.
    """

    def __init__(self, send: Callable[[Any], int], *, audit: Handler | None = None,
                 tap: Handler | None = None, offload: Handler | None = None,
                 suppress: Callable[[PacketIn], bool] | None = None,
                 may_suppress: Callable[[], bool] | None = None) -> None:
        self._send = send
        self._logged = tuple(h for h in (audit, offload, tap) if h is not None)
        self._suppress = suppress  # True for a trace's packet (npaudit trace): neither answered nor logged
        # False when `suppress` cannot be True now (no recent trace): grouped packet-ins skip it.
        self._may_suppress = may_suppress
        self.answered = 0
        self.unanswerable = 0

    def __call__(self, pin: PacketIn) -> None:
        if self._suppress is not None and self._suppress(pin):
            return
        flags = pin.flags
        if flags is not None and flags & _REJECT and pin.in_port is not None:
            answer = build_reject(pin.packet)
            if answer is None:
                self.unanswerable += 1
            else:
                self._send(packet_out(answer, pin.in_port))
                self.answered += 1
        if flags is None or flags & _LOG:
            for handler in self._logged:
                handler(pin)

    def handle_group(self, group: PacketInGroup) -> None:
        """Packet-ins the reader grouped in overload (packetin/groups.py; they share userdata,
        so flags): as one by one, the group going whole to the logging handlers that take groups.
        Rejects (each gets its answer) and, while a trace may be running, every packet-in go one by one."""
        flags = group.sample.flags
        if (flags is not None and flags & _REJECT) or (
                self._suppress is not None and (self._may_suppress is None or self._may_suppress())):
            for pin in group.packet_ins():
                self(pin)
            return
        if flags is None or flags & _LOG:
            for handler in self._logged:
                take = getattr(handler, "handle_group", None)
                if take is not None:
                    take(group)
                else:
                    for pin in group.packet_ins():
                        handler(pin)


def packet_in_summary(pin: PacketIn) -> dict[str, object]:
    ud = pin.parsed_userdata
    return {
        "received_at": round(pin.received_at, 6),
        "category": pin.category,
        "reason": pin.reason,
        "table_id": pin.table_id,
        "cookie": f"{pin.cookie:#x}",
        "in_port": pin.in_port,
        "rule_id": pin.rule_id,
        "disposition": pin.disposition,
        "userdata": None if ud is None else {"version": ud.version, "category": ud.category,
                                             "flags": ud.flags, "rule_id": ud.rule_id},
        "total_len": pin.total_len,
        "packet": pin.packet[:64].hex(),
    }


class JsonTap:
    """The debug tap (`npaudit agent --tap`): one JSON line per packet-in, like `ovs-ofctl monitor`
    but typed, written to a text stream (line-buffered). Not the audit log."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def __call__(self, pin: PacketIn) -> None:
        self._out.write(json.dumps(packet_in_summary(pin), separators=(",", ":")) + "\n")
        self._out.flush()
