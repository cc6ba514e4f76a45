"""Netlink framing encoded by hand, shared by the node's plumbing: the CNI's rtnetlink requests
(policy_agent/cni/rtnl.py) and the dumps that read the ports' drops (port_stats.py). A library
(pyroute2) costs ~0.3 ms of CPU a call; these cost µs. Native byte order, as the kernel's."""

from __future__ import annotations

import struct

# linux/netlink.h
NETLINK_ROUTE, NETLINK_SOCK_DIAG = 0, 4
NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x300, 0x200, 0x400
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # an attribute's type without NLA_F_NESTED / NLA_F_NET_BYTEORDER
RTA = struct.Struct("=HH")  # an attribute's length (header included) and type
# linux/rtnetlink.h, linux/if_link.h
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
IFINFO = struct.Struct("=BxHiII")  # struct ifinfomsg: family, type, index, flags, change
IFLA_ADDRESS, IFLA_IFNAME = 1, 3


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    """One netlink message: the header, then `body`."""
    return NLMSG.pack(NLMSG.size + len(body), kind, flags, seq, 0) + body


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute, padded to 4 bytes."""
    length = RTA.size + len(payload)
    return RTA.pack(length, kind) + payload + b"\0" * (-length % 4)


def attributes(data: bytes, at: int, end: int) -> list[tuple[int, int, int]]:
    """[(type, start, length)] of the attributes between `at` and `end` (type with its flag bits; the
    payload is data[start + 4:start + length]). ValueError for an attribute shorter than its header."""
    out = []
    while at + RTA.size <= end:
        length, kind = RTA.unpack_from(data, at)
        if length < RTA.size:
            raise ValueError(f"netlink attribute of length {length}")
        out.append((kind, at, length))
        at += (length + 3) & ~3
    return out
