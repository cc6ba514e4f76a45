"""Frames that died on a port before ovs-vswitchd read them: the kernel's receive drops of the port and the
drops of ovs-vswitchd's own packet socket on it (the netdev datapath reads each port through one).

On the userspace (netdev) datapath ovs-vswitchd reads a Pod's port with an AF_PACKET
socket and runs the datapath, upcalls included, in the thread that reads it. A burst
the thread cannot keep up with, whether it is busy with upcalls (meters raised: every
packet-in translated and queued) or not, overflows that socket's receive buffer; the
kernel counts those frames in the socket's drop counter (sock_diag SK_MEMINFO_DROPS),
nowhere else: the port's statistics in OVS (which are the kernel's) count them as received.
So on this datapath "dropped before the upcall path" and "never read off the port" are
one number, read here per port. Pure parsing plus two netlink dumps per reading (packet sockets,
links), over two sockets opened once in OVS's namespace and kept (PortDropReader): a reading
costs no thread, no namespace switch and no library set-up, since it runs every loss window
of an idle agent too.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from typing import Callable, Mapping

from meters.netns import call_in_netns, netns_path
from policy_agent.ovs.netlink import (IFINFO, IFLA_IFNAME, NETLINK_ROUTE, NETLINK_SOCK_DIAG, NLM_F_DUMP,
                                      NLM_F_REQUEST, NLMSG, NLMSG_DONE, NLMSG_ERROR, RTM_GETLINK, RTM_NEWLINK,
                                      attributes, message)

log = logging.getLogger(__name__)

SOCK_DIAG_BY_FAMILY = 20
IFLA_STATS64 = 23  # linux/if_link.h
_STATS64_RX_DROPPED = 6  # the 7th u64 of struct rtnl_link_stats64
PACKET_SHOW_INFO, PACKET_SHOW_MEMINFO = 0x01, 0x10
PACKET_DIAG_INFO, PACKET_DIAG_MEMINFO = 0, 6  # linux/packet_diag.h
SK_MEMINFO_DROPS = 8
_REQ = struct.Struct("=BBHII8x")  # family, protocol, pad, ino, show, cookie
_DIAG_MSG = 16  # struct packet_diag_msg: family, type, num, ino, cookie[2]

# The two ways a frame dies on a port before ovs-vswitchd reads it (loss record sources: "<port> <kind>").
RX_DROPPED = "rx_dropped"  # the kernel's receive drops of the port (its statistics)
SOCKET_DROPPED = "socket_dropped"  # ovs-vswitchd's packet socket on the port was full


def packet_diag_request(seq: int = 1) -> bytes:
    """A SOCK_DIAG_BY_FAMILY dump of every packet socket, with its bound interface and memory counters."""
    body = _REQ.pack(socket.AF_PACKET, 0, 0, 0, PACKET_SHOW_INFO | PACKET_SHOW_MEMINFO)
    return message(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, body)


def _messages(data: bytes, what: str) -> tuple[list[tuple[int, int, int]], bool]:
    """The netlink messages of a dump's read: ([(type, start, end)] of each, True once NLMSG_DONE is in
    `data`). ValueError for a cut message or a netlink error (naming `what`)."""
    out: list[tuple[int, int, int]] = []
    off = 0
    while off + NLMSG.size <= len(data):
        length, kind, _, _, _ = NLMSG.unpack_from(data, off)
        if length < NLMSG.size or off + length > len(data):
            raise ValueError(f"netlink message of length {length} at {off} of {len(data)}")
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            errno = -struct.unpack_from("=i", data, off + NLMSG.size)[0]
            raise ValueError(f"{what}: {os.strerror(errno)}")
        out.append((kind, off, off + length))
        off += (length + 3) & ~3
    return out, False


def parse_packet_diag(data: bytes) -> tuple[dict[int, int], bool]:
    """({ifindex: drops summed over the packet sockets bound to it}, True once the dump's end is in `data`).
    Sockets bound to no interface are left out. ValueError for a netlink error or a cut message."""
    drops: dict[int, int] = {}
    messages, done = _messages(data, "sock_diag of packet sockets")
    for _, off, end in messages:
        ifindex, dropped = 0, 0
        for rta_type, at, rta_len in attributes(data, off + NLMSG.size + _DIAG_MSG, end):
            if rta_type == PACKET_DIAG_INFO and rta_len >= 8:
                ifindex = struct.unpack_from("=I", data, at + 4)[0]
            elif rta_type == PACKET_DIAG_MEMINFO and rta_len >= 4 + 4 * (SK_MEMINFO_DROPS + 1):
                dropped = struct.unpack_from("=I", data, at + 4 + 4 * SK_MEMINFO_DROPS)[0]
        if ifindex:
            drops[ifindex] = drops.get(ifindex, 0) + dropped
    return drops, done


def link_dump_request(seq: int = 1) -> bytes:
    """An RTM_GETLINK dump of every link of the socket's namespace (names and statistics)."""
    return message(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0))


def parse_link_dump(data: bytes) -> tuple[dict[int, tuple[str, int]], bool]:
    """({ifindex: (name, kernel rx_dropped)}, True once the dump's end is in `data`). ValueError for a
    netlink error or a cut message."""
    links: dict[int, tuple[str, int]] = {}
    messages, done = _messages(data, "dump of links")
    for kind, off, end in messages:
        if kind != RTM_NEWLINK or end - off < NLMSG.size + IFINFO.size:
            continue
        ifindex = IFINFO.unpack_from(data, off + NLMSG.size)[2]
        name, rx_dropped = "", 0
        for rta_type, at, rta_len in attributes(data, off + NLMSG.size + IFINFO.size, end):
            if rta_type == IFLA_IFNAME:
                name = data[at + 4:at + rta_len].split(b"\0", 1)[0].decode(errors="replace")
            elif rta_type == IFLA_STATS64 and rta_len >= 4 + 8 * (_STATS64_RX_DROPPED + 1):
                rx_dropped = struct.unpack_from("=Q", data, at + 4 + 8 * _STATS64_RX_DROPPED)[0]
        links[ifindex] = (name, rx_dropped)
    return links, done


def _dump(sock: socket.socket, request: bytes, parse: Callable[[bytes], tuple[dict, bool]]) -> dict:
    sock.sendto(request, (0, 0))
    out: dict = {}
    while True:
        part, done = parse(sock.recv(1 << 16))
        for key, value in part.items():
            out[key] = out[key] + value if isinstance(value, int) and key in out else value
        if done:
            return out


class PortDropReader:
    """read(): {"<port> rx_dropped" | "<port> socket_dropped": count} of every port some packet socket
    (ovs-vswitchd's, on the netdev datapath) reads, in `netns` (None: here). Blocking: run in a thread.

    Its two netlink sockets are opened in `netns` at the first reading and kept (a socket stays in the
    namespace it was made in, whichever thread uses it); they are opened again after a failure, and when
    `netns` was made again (its inode changed), so a new namespace is never read through the old one's."""

    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        self._socks: tuple[socket.socket, socket.socket] | None = None
        self._ns_inode: int | None = None
        self._seq = 0
        self.opened = 0  # times the sockets were opened (a steady reader opens them once)

    def _inode(self) -> int | None:
        return None if self.netns is None else os.stat(netns_path(self.netns)).st_ino

    def _open(self) -> tuple[socket.socket, socket.socket]:
        def make() -> tuple[socket.socket, socket.socket]:
            diag = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
            try:
                route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
            except BaseException:
                diag.close()
                raise
            for sock in (diag, route):
                sock.settimeout(5.0)
            return diag, route

        inode = self._inode()
        self._socks = call_in_netns(self.netns, make)
        self._ns_inode = inode
        self.opened += 1
        return self._socks

    def read(self) -> dict[str, int]:
        socks = self._socks
        if socks is None or self._inode() != self._ns_inode:
            self.close()
            socks = self._open()
        self._seq = self._seq % 0x7FFFFFFF + 1
        try:
            drops = _dump(socks[0], packet_diag_request(self._seq), parse_packet_diag)
            links = _dump(socks[1], link_dump_request(self._seq), parse_link_dump)
        except (OSError, ValueError):
            self.close()  # a dump cut half-way leaves the socket out of step: the next reading opens new ones
            raise
        return port_counts(drops, links)

    def close(self) -> None:
        for sock in self._socks or ():
            sock.close()
        self._socks = None


def read_port_drops(netns: str | None) -> dict[str, int]:
    """One PortDropReader reading with sockets opened and closed for it."""
    reader = PortDropReader(netns)
    try:
        return reader.read()
    finally:
        reader.close()


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

