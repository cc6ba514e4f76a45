"""Decodes the Ethernet frame of a packet-in into the few fields an audit record names."""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Callable, NamedTuple

from packetin.frames import (IPV6_NO_NEXT_HEADER, MIN_ETHERTYPE, VLAN_TPIDS, eth_type, ipv4_header_len,
                             ipv6_upper_layer, l3_offset, outer_vlan)
from packetin.groups import FRAME_OFFSET
from packetin.protocol_numbers import (ETH_TYPE_IPV4, ETH_TYPE_IPV6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_SCTP,
                                       IPPROTO_TCP, IPPROTO_UDP)

__all__ = ["PacketSummary", "decode_frame", "flow_key", "group_lasts", "transport_name"]

# IANA protocol keywords (lowercase), as ECS network.transport expects them.
_TRANSPORT = {IPPROTO_ICMP: "icmp", IPPROTO_TCP: "tcp", IPPROTO_UDP: "udp", IPPROTO_ICMPV6: "ipv6-icmp",
              IPPROTO_SCTP: "sctp"}
# From the flags/fragment-offset word of an IPv4 header: that word, protocol, addresses.
_IPV4_TAIL = struct.Struct("!HxB2x4s4s")
_PORTS = struct.Struct("!HH")
_TCP = struct.Struct("!HH8xBB")  # ports, data offset (+ NS bit), flags
_AF_INET, _AF_INET6, _inet_ntop = socket.AF_INET, socket.AF_INET6, socket.inet_ntop

# Minimal header length per transport: fewer bytes than this means the frame was cut short.
_MIN_L4 = {IPPROTO_TCP: 20, IPPROTO_UDP: 8, IPPROTO_SCTP: 12, IPPROTO_ICMP: 8, IPPROTO_ICMPV6: 4}


class PacketSummary(NamedTuple):
    """What a frame says about a connection attempt; None = not in the frame (or not applicable).

    A NamedTuple (immutable, cheap to build) because one is made per packet-in.
    `fragment` is True for every piece of a fragmented datagram, the first one too
    (which still carries ports); only non-first fragments lack ports. `truncated`
    means the frame ended inside a header it announced (an OVS `max_len` cut, or
    a malformed packet); what was decoded before that point is still reported.
    """

    eth_type: int | None = None
    vlan: int | None = None  # outermost VLAN id
    ip_version: int | None = None
    src_ip: str | None = None
    dst_ip: str | None = None
    protocol: int | None = None  # IANA number of the upper-layer protocol
    transport: str | None = None
    src_port: int | None = None
    dst_port: int | None = None
    icmp_type: int | None = None
    icmp_code: int | None = None
    tcp_flags: int | None = None  # 9 bits: NS, CWR, ECE, URG, ACK, PSH, RST, SYN, FIN
    fragment: bool = False
    truncated: bool = False
    length: int = 0


# tuple.__new__ with the fields in order: cheaper than keyword construction, on the
# per-packet path. Only for the full-width tuples built below.
_new: Callable[..., PacketSummary] = tuple.__new__


def transport_name(protocol: int | None) -> str | None:
    """The lowercase IANA keyword for the transports the record names, else None."""
    return None if protocol is None else _TRANSPORT.get(protocol)


def flow_key(summary: PacketSummary) -> tuple[str | None, str | None, int | None, int | None]:
    """The packet part of an aggregation key: (src ip, dst ip, protocol, dst port or ICMP type).

    The same shape as the eBPF drop-offload key (DESIGN.md §4), so aggregated
    counts and offloaded counts fold together.
    """
    last = summary.dst_port if summary.dst_port is not None else summary.icmp_type
    return (summary.src_ip, summary.dst_ip, summary.protocol, last)


def decode_frame(frame: bytes) -> PacketSummary:
    """Summarise an Ethernet II frame (walked by packetin.frames). Pure; never raises, whatever the bytes."""
    n = len(frame)
    if n >= 42:
        # Most packet-ins: untagged IPv4 without options, not a fragment, a whole UDP or TCP header.
        # One unpack, and the addresses' text once per pair; the same summary as the walk below.
        kind, vihl, flags_frag, proto, addrs, sport, dport = _V4_FAST.unpack_from(frame)
        if kind == ETH_TYPE_IPV4 and vihl == 0x45 and not flags_frag & 0x3FFF:
            if proto == IPPROTO_UDP:
                src, dst = _V4_PAIRS.get(addrs) or _v4_pair(addrs)
                return _new(PacketSummary, (ETH_TYPE_IPV4, None, 4, src, dst, proto, "udp", sport, dport, None,
                                            None, None, False, False, n))
            if proto == IPPROTO_TCP and n >= 54:
                src, dst = _V4_PAIRS.get(addrs) or _v4_pair(addrs)
                doff = frame[46]
                return _new(PacketSummary, (ETH_TYPE_IPV4, None, 4, src, dst, proto, "tcp", sport, dport, None,
                                            None, ((doff & 1) << 8) | frame[47], False, n - 34 < (doff >> 4) * 4,
                                            n))
    if n < 14:
        return PacketSummary(truncated=True, length=n)
    kind = (frame[12] << 8) | frame[13]
    if kind in VLAN_TPIDS:  # tagged: the walker finds the network header
        off = l3_offset(frame)
        if off < 0:  # cut inside a VLAN tag
            vlan = outer_vlan(frame, 18) if n >= 18 else None  # the first tag whole, a later one cut
            return PacketSummary(eth_type=None, vlan=vlan, truncated=True, length=n)
        vlan = outer_vlan(frame, off)
        kind = eth_type(frame, off)
    else:  # untagged, most frames: read inline, once per packet-in
        off, vlan = 14, None
    if kind < MIN_ETHERTYPE:
        return PacketSummary(vlan=vlan, length=n)  # 802.3 + LLC: no ethertype to report
    if kind == ETH_TYPE_IPV4:
        return _ipv4(frame, off, vlan)
    if kind == ETH_TYPE_IPV6:
        return _ipv6(frame, off, vlan)
    return PacketSummary(eth_type=kind, vlan=vlan, length=n)


# From an Ethernet II frame's start: ethertype, IPv4 version/IHL, flags/fragment offset, protocol, both
# addresses, and the first four bytes after a 20-byte IPv4 header (ports).
_V4_FAST = struct.Struct("!12xHB5xHxB2x8sHH")
# IPv4 source + destination (8 bytes) -> their text: a node's packet-ins name few address pairs.
_V4_PAIRS: dict[bytes, tuple[str, str]] = {}


def _v4_pair(addrs: bytes) -> tuple[str, str]:
    if len(_V4_PAIRS) >= 4096:
        _V4_PAIRS.clear()
    pair = _V4_PAIRS[addrs] = (_inet_ntop(_AF_INET, addrs[:4]), _inet_ntop(_AF_INET, addrs[4:]))
    return pair


def _ipv4(frame: bytes, off: int, vlan: int | None) -> PacketSummary:
    n = len(frame)
    ihl = ipv4_header_len(frame, off)
    if not ihl:
        if n < off + 20:
            return PacketSummary(eth_type=ETH_TYPE_IPV4, vlan=vlan, truncated=True, length=n)
        # Not an IPv4 header at all: claim nothing beyond the ethertype.
        return PacketSummary(eth_type=ETH_TYPE_IPV4, vlan=vlan, length=n)
    flags_frag, proto, src_raw, dst_raw = _IPV4_TAIL.unpack_from(frame, off + 6)
    frag_offset = flags_frag & 0x1FFF
    src = _inet_ntop(_AF_INET, src_raw)
    dst = _inet_ntop(_AF_INET, dst_raw)
    fragment = frag_offset != 0 or bool(flags_frag & 0x2000)  # or More Fragments
    # The frame's own end bounds every header, not the IP total length: packet-ins
    # are cut by the controller action's max_len, and TSO packets may carry 0.
    if n < off + ihl:  # options announced by IHL are missing
        return _summary(ETH_TYPE_IPV4, vlan, 4, src, dst, proto, fragment, True, n)
    if frag_offset:
        return _summary(ETH_TYPE_IPV4, vlan, 4, src, dst, proto, True, False, n)
    return _l4(frame, off + ihl, ETH_TYPE_IPV4, vlan, 4, src, dst, proto, fragment)


def _ipv6(frame: bytes, off: int, vlan: int | None) -> PacketSummary:
    n = len(frame)
    if n < off + 40:
        return PacketSummary(eth_type=ETH_TYPE_IPV6, vlan=vlan, truncated=True, length=n)
    if frame[off] >> 4 != 6:
        return PacketSummary(eth_type=ETH_TYPE_IPV6, vlan=vlan, length=n)
    src = _ipv6_text(bytes(frame[off + 8:off + 24]))
    dst = _ipv6_text(bytes(frame[off + 24:off + 40]))
    nh, l4, fragment, headerless = ipv6_upper_layer(frame, off)
    if nh is None:  # cut inside an extension header
        return _summary(ETH_TYPE_IPV6, vlan, 6, src, dst, None, fragment, True, n)
    if headerless or nh == IPV6_NO_NEXT_HEADER:
        return _summary(ETH_TYPE_IPV6, vlan, 6, src, dst, nh, fragment, False, n)
    return _l4(frame, l4, ETH_TYPE_IPV6, vlan, 6, src, dst, nh, fragment)


_V4_EMBEDDING_PREFIX = bytes(10)


def _ipv6_text(raw: bytes) -> str:
    """RFC 5952 text, the same as str(ipaddress.IPv6Address) (which Pod lookups use).

    inet_ntop (the cheaper one) agrees except inside ::/80, where glibc writes
    the IPv4-compatible and IPv4-mapped forms with a dotted quad.
    """
    if raw.startswith(_V4_EMBEDDING_PREFIX):
        return str(ipaddress.IPv6Address(raw))
    return _inet_ntop(_AF_INET6, raw)


def _summary(eth_type: int, vlan: int | None, version: int, src: str, dst: str, proto: int | None,
             fragment: bool, truncated: bool, n: int) -> PacketSummary:
    return PacketSummary(eth_type=eth_type, vlan=vlan, ip_version=version, src_ip=src, dst_ip=dst,
                         protocol=proto, transport=transport_name(proto), fragment=fragment,
                         truncated=truncated, length=n)


def _l4(frame: bytes, off: int, eth_type: int, vlan: int | None, version: int, src: str, dst: str,
        proto: int, fragment: bool) -> PacketSummary:
    n = len(frame)
    avail = n - off
    if proto == IPPROTO_TCP:
        if avail >= 20:
            sport, dport, doff, fl = _TCP.unpack_from(frame, off)
            # Options are part of the header the segment announced.
            return _new(PacketSummary, (eth_type, vlan, version, src, dst, proto, "tcp", sport, dport, None,
                                        None, ((doff & 1) << 8) | fl, fragment, avail < (doff >> 4) * 4, n))
        sport = dport = flags = None
        if avail >= 4:
            sport, dport = _PORTS.unpack_from(frame, off)
        if avail >= 14:
            flags = ((frame[off + 12] & 1) << 8) | frame[off + 13]
        return _new(PacketSummary, (eth_type, vlan, version, src, dst, proto, "tcp", sport, dport, None, None,
                                    flags, fragment, True, n))
    need = _MIN_L4.get(proto)
    if need is None:  # a protocol we do not look into: addresses + number are all we know
        return _summary(eth_type, vlan, version, src, dst, proto, fragment, False, n)
    if proto == IPPROTO_ICMP or proto == IPPROTO_ICMPV6:
        icmp_type = icmp_code = None
        if avail >= 2:
            icmp_type, icmp_code = frame[off], frame[off + 1]
        return _new(PacketSummary, (eth_type, vlan, version, src, dst, proto, _TRANSPORT[proto], None, None,
                                    icmp_type, icmp_code, None, fragment, avail < need, n))
    sport = dport = None
    if avail >= 4:
        sport, dport = _PORTS.unpack_from(frame, off)
    return _new(PacketSummary, (eth_type, vlan, version, src, dst, proto, _TRANSPORT[proto], sport, dport,
                                None, None, None, fragment, avail < need, n))


def group_lasts(raws: list[bytes], summary: PacketSummary) -> tuple[list[int | None], int]:
    """For grouped packet-ins (packetin/groups.py: untagged IPv4, not fragments, one length,
    header length and protocol) whose first frame decodes to `summary`: each one's last flow-key
    field (destination port, else ICMP type, else None) and how many decode as truncated."""
    l3 = FRAME_OFFSET + 14  # grouped frames are untagged: no VLAN walk
    at = l3 + ipv4_header_len(raws[0], l3)  # the transport header
    if summary.dst_port is not None:
        lasts: list[int | None] = [(r[at + 2] << 8) | r[at + 3] for r in raws]
    elif summary.icmp_type is not None:
        lasts = [r[at] for r in raws]
    else:
        lasts = [None] * len(raws)
    avail = summary.length - (at - FRAME_OFFSET)
    if summary.protocol == IPPROTO_TCP and avail >= 20:  # whole unless its options are cut
        return lasts, sum(1 for r in raws if avail < (r[at + 12] >> 4) * 4)
    return lasts, len(raws) if summary.truncated else 0
