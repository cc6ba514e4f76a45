"""The few rtnetlink requests a CNI ADD makes, encoded by hand: the veth, the Pod end's MAC, address
and routes. pyroute2 costs ~0.3 ms of CPU per call (and ~0.6 ms per socket); these cost µs, and a
CNI ADD on a busy node waits for CPU. Each function works in the calling thread's network namespace."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from typing import Iterable

from policy_agent.ovs.netlink import (IFINFO, IFLA_ADDRESS, IFLA_IFNAME, NLA_F_NESTED, NLA_TYPE_MASK, NLM_F_ACK,
                                      NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NLMSG, NLMSG_ERROR, RTA, RTM_DELLINK,
                                      RTM_GETLINK, RTM_NEWLINK, attr, attributes, message)

# linux/rtnetlink.h, linux/if_link.h, linux/veth.h (the framing: policy_agent/ovs/netlink.py)
_RTM_NEWADDR, _RTM_NEWROUTE = 20, 24
_IFF_UP, _IFF_NOARP = 0x1, 0x80
_IFLA_MTU, _IFLA_LINK, _IFLA_LINKINFO, _IFLA_NET_NS_FD = 4, 5, 18, 28
_IFLA_INFO_KIND, _IFLA_INFO_DATA, _VETH_INFO_PEER = 1, 2, 1
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_RTA_DST, _RTA_OIF, _RTA_GATEWAY = 1, 4, 5
_RT_TABLE_MAIN, _RTPROT_BOOT, _RT_SCOPE_UNIVERSE, _RT_SCOPE_LINK, _RTN_UNICAST = 254, 3, 0, 253, 1


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return IFINFO.pack(socket.AF_UNSPEC, 0, index, flags, change)


def _name(ifname: str) -> bytes:
    return attr(IFLA_IFNAME, ifname.encode() + b"\0")


class Rtnl:
    """One NETLINK_ROUTE socket in the calling thread's namespace; requests are acknowledged one by one."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._seq = 0

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()

    def _request(self, kind: int, flags: int, body: bytes) -> list[bytes]:
        """Send one request; the payloads of the answers before the ack. OSError(errno) on a refusal."""
        self._seq += 1
        seq = self._seq
        self._sock.send(message(kind, NLM_F_REQUEST | NLM_F_ACK | flags, seq, body))
        answers: list[bytes] = []
        while True:
            data = self._sock.recv(65536)
            offset = 0
            while offset + NLMSG.size <= len(data):
                length, mtype, _, mseq, _ = NLMSG.unpack_from(data, offset)
                payload = data[offset + NLMSG.size:offset + length]
                offset += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("i", payload)[0]
                    if code:
                        raise OSError(code, os.strerror(code))
                    return answers
                answers.append(payload)

    def add_veth(self, ifname: str, peer: str, peer_netns: str, mtu: int = 0) -> None:
        """`ifname` here, up and NOARP, its peer `peer` in the namespace at path `peer_netns` (down);
        both ends with MTU `mtu` (0: the kernel's default).

        NOARP: `ifname` is a switch port (OVS reads it), yet also a kernel interface of this namespace,
        which holds the node gateway's address. The kernel would answer a Pod's ARP for the gateway on
        it as well as OVS does; a Pod that took the kernel's answer sends into this namespace's IP stack
        too, which has no route to another node's Pods and answers "unreachable", resetting the Pod's
        connections there."""
        fd = os.open(peer_netns, os.O_RDONLY | os.O_CLOEXEC)
        mtu_attr = attr(_IFLA_MTU, struct.pack("I", mtu)) if mtu else b""
        try:
            peer_info = _ifinfo() + _name(peer) + mtu_attr + attr(_IFLA_NET_NS_FD, struct.pack("I", fd))
            data = attr(_VETH_INFO_PEER | NLA_F_NESTED, peer_info)
            linkinfo = attr(_IFLA_INFO_KIND, b"veth\0") + attr(_IFLA_INFO_DATA | NLA_F_NESTED, data)
            up = _IFF_UP | _IFF_NOARP
            body = (_ifinfo(flags=up, change=up) + _name(ifname) + mtu_attr
                    + attr(_IFLA_LINKINFO | NLA_F_NESTED, linkinfo))
            self._request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)
        finally:
            os.close(fd)

    def delete_link(self, ifname: str) -> None:
        self._request(RTM_DELLINK, 0, _ifinfo() + _name(ifname))

    def link(self, ifname: str) -> tuple[str, int]:
        """(MAC, IFLA_LINK) of `ifname`: for a veth, IFLA_LINK is its peer's ifindex."""
        for payload in self._request(RTM_GETLINK, 0, _ifinfo() + _name(ifname)):
            attrs = _attrs(payload[IFINFO.size:])
            mac = ":".join(f"{b:02x}" for b in attrs[IFLA_ADDRESS])
            return mac, struct.unpack("i", attrs[_IFLA_LINK])[0]
        raise OSError(errno.ENODEV, f"{ifname}: no such link")

    def set_mac_up(self, index: int, mac: str) -> None:
        body = _ifinfo(index, _IFF_UP, _IFF_UP) + attr(IFLA_ADDRESS, bytes.fromhex(mac.replace(":", "")))
        self._request(RTM_NEWLINK, 0, body)

    def add_address(self, index: int, address: ipaddress.IPv4Interface) -> None:
        packed = address.ip.packed
        body = (struct.pack("BBBBI", socket.AF_INET, address.network.prefixlen, 0, 0, index)
                + attr(_IFA_LOCAL, packed) + attr(_IFA_ADDRESS, packed))
        self._request(_RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body)

    def add_routes(self, index: int, routes: Iterable[dict[str, str]]) -> None:
        """IPv4 routes {"dst": cidr, "gw": address (optional)} through `index`."""
        for route in routes:
            dst = ipaddress.IPv4Network(route["dst"])
            gw = route.get("gw")
            scope = _RT_SCOPE_UNIVERSE if gw else _RT_SCOPE_LINK
            body = struct.pack("BBBBBBBBI", socket.AF_INET, dst.prefixlen, 0, 0, _RT_TABLE_MAIN, _RTPROT_BOOT,
                               scope, _RTN_UNICAST, 0)
            if dst.prefixlen:
                body += attr(_RTA_DST, dst.network_address.packed)
            if gw:
                body += attr(_RTA_GATEWAY, ipaddress.IPv4Address(gw).packed)
            body += attr(_RTA_OIF, struct.pack("i", index))
            self._request(_RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body)


def _attrs(data: bytes) -> dict[int, bytes]:
    """{type: payload} of the attributes in `data` (the first of a type; flag bits off)."""
    out: dict[int, bytes] = {}
    for kind, at, length in attributes(data, 0, len(data)):
        out.setdefault(kind & NLA_TYPE_MASK, data[at + RTA.size:at + length])
    return out
