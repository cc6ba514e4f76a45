"""Frames that died on a port before ovs-vswitchd read them: the kernel's receive drops of the port and the
drops of ovs-vswitchd's own packet socket on it (the netdev datapath reads each port through one).

On the userspace (netdev) datapath ovs-vswitchd reads a Pod's port with an AF_PACKET
socket and runs the datapath, upcalls included, in the thread that reads it. A burst
the thread cannot keep up with, whether it is busy with upcalls (meters raised: every
packet-in translated and queued) or not, overflows that socket's receive buffer; the
kernel counts those frames in the socket's drop counter (sock_diag SK_MEMINFO_DROPS),
nowhere else: the port's statistics in OVS (which are the kernel's) count them as received.
So on this datapath "dropped before the upcall path" and "never read off the port" are
one number, read here per port. Pure parsing plus one netlink dump per reading.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from typing import Mapping

from meters.netns import call_in_netns

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
PACKET_SHOW_INFO, PACKET_SHOW_MEMINFO = 0x01, 0x10
PACKET_DIAG_INFO, PACKET_DIAG_MEMINFO = 0, 6  # linux/packet_diag.h
SK_MEMINFO_DROPS = 8
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ = struct.Struct("=BBHII8x")  # family, protocol, pad, ino, show, cookie
_DIAG_MSG = 16  # struct packet_diag_msg: family, type, num, ino, cookie[2]
_RTA = struct.Struct("=HH")

# The two ways a frame dies on a port before ovs-vswitchd reads it (loss record sources: "<port> <kind>").
RX_DROPPED = "rx_dropped"  # the kernel's receive drops of the port (its statistics)
SOCKET_DROPPED = "socket_dropped"  # ovs-vswitchd's packet socket on the port was full


def packet_diag_request(seq: int = 1) -> bytes:
    """A SOCK_DIAG_BY_FAMILY dump of every packet socket, with its bound interface and memory counters."""
    body = _REQ.pack(socket.AF_PACKET, 0, 0, 0, PACKET_SHOW_INFO | PACKET_SHOW_MEMINFO)
    return _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse_packet_diag(data: bytes) -> tuple[dict[int, int], bool]:
    """({ifindex: drops summed over the packet sockets bound to it}, True once the dump's end is in `data`).
    Sockets bound to no interface are left out. ValueError for a netlink error or a cut message."""
    drops: dict[int, int] = {}
    off = 0
    while off + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, off)
        if length < _NLMSG.size or off + length > len(data):
            raise ValueError(f"netlink message of length {length} at {off} of {len(data)}")
        if kind == NLMSG_DONE:
            return drops, True
        if kind == NLMSG_ERROR:
            errno = -struct.unpack_from("=i", data, off + _NLMSG.size)[0]
            raise ValueError(f"sock_diag of packet sockets: {os.strerror(errno)}")
        ifindex, dropped = 0, 0
        at, end = off + _NLMSG.size + _DIAG_MSG, off + length
        while at + _RTA.size <= end:
            rta_len, rta_type = _RTA.unpack_from(data, at)
            if rta_len < _RTA.size:
                raise ValueError(f"attribute of length {rta_len}")
            if rta_type == PACKET_DIAG_INFO and rta_len >= 8:
                ifindex = struct.unpack_from("=I", data, at + 4)[0]
            elif rta_type == PACKET_DIAG_MEMINFO and rta_len >= 4 + 4 * (SK_MEMINFO_DROPS + 1):
                dropped = struct.unpack_from("=I", data, at + 4 + 4 * SK_MEMINFO_DROPS)[0]
            at += (rta_len + 3) & ~3
        if ifindex:
            drops[ifindex] = drops.get(ifindex, 0) + dropped
        off += (length + 3) & ~3
    return drops, False


def _dump(sock: socket.socket) -> dict[int, int]:
    sock.sendto(packet_diag_request(), (0, 0))
    drops: dict[int, int] = {}
    while True:
        part, done = parse_packet_diag(sock.recv(1 << 16))
        for ifindex, n in part.items():
            drops[ifindex] = drops.get(ifindex, 0) + n
        if done:
            return drops


def _links() -> dict[int, tuple[str, int]]:
    """{ifindex: (name, kernel rx_dropped)} of the links of the calling thread's namespace."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        out = {}
        for link in ipr.get_links():
            stats = link.get_attr("IFLA_STATS64") or {}
            out[link["index"]] = (link.get_attr("IFLA_IFNAME"), int(stats.get("rx_dropped", 0)))
        return out


def read_port_drops(netns: str | None) -> dict[str, int]:
    """{"<port> rx_dropped" | "<port> socket_dropped": count} of every port some packet socket (ovs-vswitchd's,
    on the netdev datapath) reads, in `netns` (None: here). Blocking: run in a thread."""
    def read() -> tuple[dict[int, int], dict[int, tuple[str, int]]]:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(5.0)
            return _dump(sock), _links()

    drops, links = call_in_netns(netns, read)
    return port_counts(drops, links)


def port_counts(drops: Mapping[int, int], links: Mapping[int, tuple[str, int]]) -> dict[str, int]:
    out = {}
    for ifindex, dropped in drops.items():
        if ifindex in links:
            name, rx_dropped = links[ifindex]
            out[f"{name} {SOCKET_DROPPED}"] = dropped
            out[f"{name} {RX_DROPPED}"] = rx_dropped
    return out


class PortDropTotals:
    """Totals of per-port counters since the agent first looked: the first reading is the baseline; a
    port that appears later is new (its counters start at 0 with it) and counts in full; a counter that
    went down started again (the port was made again)."""

    def __init__(self) -> None:
        self._raw: dict[str, int] = {}
        self.totals: dict[str, int] = {}
        self.read = False

    def update(self, readings: Mapping[str, int]) -> None:
        for name, raw in readings.items():
            before = self._raw.get(name)
            if before is None:
                grew = raw if self.read else 0
            else:
                grew = raw - before if raw >= before else raw
            self.totals[name] = self.totals.get(name, 0) + grew
            self._raw[name] = raw
        self.read = True

