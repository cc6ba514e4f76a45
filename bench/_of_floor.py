#!/usr/bin/env python3
"""The floor of bench/agent_cpu.py: a bare OpenFlow reader that only counts packet-ins.

Run as `python bench/_of_floor.py <unix socket>` (the bridge's .mgmt socket), or with tcp:HOST:PORT (the agent's
own controller target over TCP, once the agent is stopped; from the namespace it listens in): it sends OFPT_HELLO
(OpenFlow 1.5), OFPT_SET_CONFIG with miss_send_len 0xffff (a .mgmt client gets no packet-ins
before it, DESIGN.md §10) and NXT_SET_PACKET_IN_FORMAT NXT_PACKET_IN2 (the agent's format, so both
read the same bytes), prints "ready", then reads in a loop, counting whole messages, answering
echo requests. With `--counts FILE` (bench/agent_cpu.py's floor) it keeps its two counts, packet-ins and other
messages, as two little-endian u64 at the start of FILE, mapped, updated after each read: the bench reads them
whenever it likes, and no signal or syscall is involved (a signal that lands just before a blocking recv(2) is
only handled once more bytes arrive: an idle reader asked by signal could hang the bench). Nothing but the
standard library, and nothing per packet-in beyond finding the next header: this is what any controller pays
to receive the packet-ins, the agent's cost is above it.

With `--append FILE` (bench/agent_latency.py's floor) it also appends, per packet-in, the frame's UDP
destination port as a line to FILE (one write(2) each, unbuffered): the file-append floor of a record.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import sys
from typing import Callable

OFP_VERSION = 0x06
OFPT_HELLO, OFPT_ECHO_REQUEST, OFPT_ECHO_REPLY, OFPT_EXPERIMENTER = 0, 2, 3, 4
OFPT_SET_CONFIG, OFPT_PACKET_IN = 9, 10
NX_VENDOR, NXT_SET_PACKET_IN_FORMAT, NXT_PACKET_IN2, NXPIF_NXT_PACKET_IN2 = 0x2320, 16, 30, 2
_HEADER = struct.Struct("!BBHI")
_EXPERIMENTER = struct.Struct("!II")


def handshake() -> bytes:
    """HELLO, SET_CONFIG (flags 0, miss_send_len 0xffff), SET_PACKET_IN_FORMAT NXT_PACKET_IN2."""
    return (_HEADER.pack(OFP_VERSION, OFPT_HELLO, 8, 1)
            + _HEADER.pack(OFP_VERSION, OFPT_SET_CONFIG, 12, 2) + struct.pack("!HH", 0, 0xFFFF)
            + _HEADER.pack(OFP_VERSION, OFPT_EXPERIMENTER, 20, 3)
            + struct.pack("!III", NX_VENDOR, NXT_SET_PACKET_IN_FORMAT, NXPIF_NXT_PACKET_IN2))


def udp_dst_port(msg: bytes) -> int | None:
    """The UDP destination port of the frame in an NXT_PACKET_IN2 (its NXPINT_PACKET property), None if the
    frame is not untagged IPv4 UDP."""
    pos = 16  # OpenFlow header, experimenter id, subtype
    while pos + 4 <= len(msg):
        ptype, plen = struct.unpack_from("!HH", msg, pos)
        if plen < 4:
            return None
        if ptype == 0:  # NXPINT_PACKET
            frame = msg[pos + 4:pos + plen]
            if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
                return None
            udp = 14 + (frame[14] & 0x0F) * 4
            return int.from_bytes(frame[udp + 2:udp + 4], "big") if len(frame) >= udp + 4 else None
        pos += (plen + 7) // 8 * 8
    return None


def scan(buf: bytes | bytearray, on_packet_in: Callable[[bytes], None] | None = None
         ) -> tuple[int, int, list[bytes], int]:
    """The whole messages at the start of `buf`: (packet-ins (OFPT_PACKET_IN or NXT_PACKET_IN2),
    other messages, echo replies owed (each echo request's reply, ready to send), bytes consumed).
    A message cut off at the end is left for the next read. `on_packet_in` gets each NXT_PACKET_IN2."""
    packet_ins = others = 0
    replies: list[bytes] = []
    pos, end = 0, len(buf)
    while end - pos >= 8:
        version, mtype, length, xid = _HEADER.unpack_from(buf, pos)
        if length < 8:
            raise ValueError(f"OpenFlow message of length {length} at offset {pos}")
        if end - pos < length:
            break
        if mtype == OFPT_PACKET_IN or (mtype == OFPT_EXPERIMENTER and length >= 16
                                       and _EXPERIMENTER.unpack_from(buf, pos + 8) == (NX_VENDOR, NXT_PACKET_IN2)):
            packet_ins += 1
            if on_packet_in is not None and mtype == OFPT_EXPERIMENTER:
                on_packet_in(bytes(buf[pos:pos + length]))
        else:
            others += 1
            if mtype == OFPT_ECHO_REQUEST:
                replies.append(_HEADER.pack(version, OFPT_ECHO_REPLY, length, xid) + bytes(buf[pos + 8:pos + length]))
        pos += length
    return packet_ins, others, replies, pos


def connect(target: str) -> socket.socket:
    """A unix socket path, or tcp:HOST:PORT (TCP_NODELAY, as the agent's own connection)."""
    if target.startswith("tcp:"):
        host, port = target[4:].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(target)
    return sock


COUNTS = struct.Struct("<QQ")


def options(argv: list[str]) -> dict[str, str]:
    """`--append FILE` and `--counts FILE` after the target, in any order."""
    got: dict[str, str] = {}
    for i in range(0, len(argv), 2):
        if argv[i] not in ("--append", "--counts") or i + 1 >= len(argv):
            raise SystemExit(f"usage: _of_floor.py TARGET [--append FILE] [--counts FILE], not {argv[i:]}")
        got[argv[i][2:]] = argv[i + 1]
    return got


def main() -> int:
    opts = options(sys.argv[2:])
    on_packet_in = None
    if "append" in opts:
        fd = os.open(opts["append"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

        def on_packet_in(msg: bytes) -> None:
            port = udp_dst_port(msg)
            if port is not None:
                os.write(fd, b"%d\n" % port)
    shown = None
    if "counts" in opts:
        with open(opts["counts"], "r+b") as f:
            f.truncate(COUNTS.size)
            shown = mmap.mmap(f.fileno(), COUNTS.size)
    sock = connect(sys.argv[1])
    sock.sendall(handshake())
    packet_ins_total = others_total = 0
    print("ready", flush=True)
    pending = bytearray()
    while True:
        chunk = sock.recv(1 << 18)
        if not chunk:
            return 0
        pending += chunk
        packet_ins, others, replies, used = scan(pending, on_packet_in)
        packet_ins_total += packet_ins
        others_total += others
        if shown is not None:
            COUNTS.pack_into(shown, 0, packet_ins_total, others_total)
        del pending[:used]
        for reply in replies:
            sock.sendall(reply)


if __name__ == "__main__":
    raise SystemExit(main())
