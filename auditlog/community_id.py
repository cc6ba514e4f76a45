"""Community ID v1 (github.com/corelight/community-id-spec): the flow hash SIEMs join network events on.

``"1:" + base64(sha1(seed . saddr . daddr . proto . 0 . sport . dport))``, every part in
network byte order (seed and ports 2 bytes, proto 1, addresses 4 or 16), the endpoints
ordered so the smaller (address, port) comes first, which makes both directions of a flow
hash alike. ICMP and ICMPv6 use the type as the source "port" and, for types that have a
counterpart (echo and echo reply, ...), the counterpart's type as the destination "port" and
the same ordering; other types are one-way: the code is the destination "port" and the
endpoints stay as seen. Protocols without ports hash the addresses and protocol only.
Pure functions; tests/unit/auditlog/test_community_id.py runs the spec's baseline vectors.
"""

from __future__ import annotations

import binascii
import hashlib
import socket
import struct

__all__ = ["community_id", "flow_community_id"]

_SEED, _PORTS, _NO_PORTS = struct.Struct("!H"), struct.Struct("!BBHH"), struct.Struct("!BB")
_ICMP, _ICMPV6 = 1, 58
_PORTED = frozenset({6, 17, 132})  # TCP, UDP, SCTP
# Type -> counterpart type, as Zeek maps them (request and reply form one flow).
_ICMP4_PAIRS = {8: 0, 0: 8, 13: 14, 14: 13, 15: 16, 16: 15, 10: 9, 9: 10, 17: 18, 18: 17}
_ICMP6_PAIRS = {128: 129, 129: 128, 130: 131, 131: 130, 133: 134, 134: 133, 135: 136, 136: 135,
                139: 140, 140: 139, 144: 145, 145: 144}


def community_id(saddr: str, daddr: str, proto: int, sport: int | None = None, dport: int | None = None, *,
                 one_way: bool = False, seed: int = 0) -> str:
    """The v1 Community ID of a flow; `sport`/`dport` None for a protocol without ports (both or neither).
    `one_way`: keep the endpoints in the order given (ICMP messages without a counterpart).
    ValueError for an address that is not IPv4 or IPv6, or two of different versions."""
    src, dst = _packed(saddr), _packed(daddr)
    if len(src) != len(dst):
        raise ValueError(f"community id: {saddr} and {daddr} are of different IP versions")
    if (sport is None) != (dport is None):
        raise ValueError("community id: both ports or neither")
    if not one_way and (src, sport or 0) > (dst, dport or 0):
        src, dst, sport, dport = dst, src, dport, sport
    tail = _PORTS.pack(proto, 0, sport, dport) if sport is not None and dport is not None else _NO_PORTS.pack(proto, 0)
    data = _SEED.pack(seed) + src + dst + tail
    return "1:" + binascii.b2a_base64(hashlib.sha1(data, usedforsecurity=False).digest(), newline=False).decode()


_PACKED: dict[str, bytes] = {}  # a node's records name few addresses, many ports: kept, up to 4096


def _packed(address: str) -> bytes:
    """An address in network byte order (inet_pton: a tenth of ipaddress's cost); ValueError if it is none."""
    packed = _PACKED.get(address)
    if packed is not None:
        return packed
    try:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)
    except OSError as exc:
        raise ValueError(f"community id: {address!r} is not an IP address") from exc
    if len(_PACKED) >= 4096:
        _PACKED.clear()
    _PACKED[address] = packed
    return packed


_SEED0 = _SEED.pack(0)
# (saddr, daddr) -> (seed . saddr . daddr, seed . daddr . saddr, whether saddr < daddr, whether equal):
# a node's records name few address pairs and many ports, so per record only the ports are packed.
_PAIRS: dict[tuple[str, str], tuple[bytes, bytes, bool, bool]] = {}


def _ported(saddr: str, daddr: str, proto: int, sport: int, dport: int) -> str:
    """community_id(saddr, daddr, proto, sport, dport), its address work done once per pair."""
    pair = _PAIRS.get((saddr, daddr))
    if pair is None:
        src, dst = _packed(saddr), _packed(daddr)
        if len(src) != len(dst):
            raise ValueError(f"community id: {saddr} and {daddr} are of different IP versions")
        if len(_PAIRS) >= 4096:
            _PAIRS.clear()
        pair = _PAIRS[(saddr, daddr)] = (_SEED0 + src + dst, _SEED0 + dst + src, src < dst, src == dst)
    forward, backward, below, same = pair
    if below or (same and sport <= dport):
        data = forward + _PORTS.pack(proto, 0, sport, dport)
    else:
        data = backward + _PORTS.pack(proto, 0, dport, sport)
    return "1:" + binascii.b2a_base64(hashlib.sha1(data, usedforsecurity=False).digest(), newline=False).decode()


# For a caller that already knows the flow is TCP/UDP/SCTP with both addresses and ports (the record
# encoder's common case): community_id of it without flow_community_id's checks; ValueError as _ported.
PORTED_PROTOCOLS = _PORTED
ported_community_id = _ported


def flow_community_id(src_ip: str | None, dst_ip: str | None, protocol: int | None, src_port: int | None,
                      dst_port: int | None, icmp_type: int | None, icmp_code: int | None) -> str | None:
    """The Community ID of a decoded packet's flow, None when the packet does not carry what it needs
    (an address, the ports of TCP/UDP/SCTP: a non-first fragment, a truncated or coarsened record; the
    type and code of ICMP)."""
    if src_ip is None or dst_ip is None or protocol is None:
        return None
    try:
        if protocol in _PORTED:
            if src_port is None or dst_port is None:
                return None
            return _ported(src_ip, dst_ip, protocol, src_port, dst_port)
        if protocol in (_ICMP, _ICMPV6):
            if icmp_type is None:
                return None
            pairs = _ICMP4_PAIRS if protocol == _ICMP else _ICMP6_PAIRS
            counterpart = pairs.get(icmp_type)
            if counterpart is not None:
                return community_id(src_ip, dst_ip, protocol, icmp_type, counterpart)
            if icmp_code is None:
                return None
            return community_id(src_ip, dst_ip, protocol, icmp_type, icmp_code, one_way=True)
        return community_id(src_ip, dst_ip, protocol)
    except ValueError:
        return None
