"""A rule's ports and protocols as OpenFlow match fields."""

from __future__ import annotations

from typing import Any

from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_ICMP, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP
from policy_agent.policy.model import IcmpSpec, PortSpec
from policy_agent.policy.selection import Endpoint

_PROTO = {"TCP": (IPPROTO_TCP, "tcp_dst"), "UDP": (IPPROTO_UDP, "udp_dst"),
          "SCTP": (IPPROTO_SCTP, "sctp_dst")}


def port_matches(spec: PortSpec, dest: Endpoint | None) -> list[dict[str, Any]]:
    proto, field_name = _PROTO.get(spec.protocol, _PROTO["TCP"])
    base: dict[str, Any] = {"eth_type": ETH_TYPE_IPV4, "ip_proto": proto}
    if spec.port is None:
        return [base]
    port = spec.port
    if isinstance(port, str):  # named port: the destination Pod's container port
        if dest is None:
            return []
        numbers = [cp.port for cp in dest.pod.ports if cp.name == port and cp.protocol == spec.protocol]
        return [{**base, field_name: n} for n in numbers]
    if spec.end_port is None or spec.end_port == port:
        return [{**base, field_name: port}]
    return [{**base, field_name: vm} for vm in port_range_masks(port, spec.end_port)]


def icmp_match(spec: IcmpSpec) -> dict[str, Any]:
    """An Antrea `protocols: [{icmp: ...}]` entry; the compiler is IPv4-only, so ICMPv4."""
    match: dict[str, Any] = {"eth_type": ETH_TYPE_IPV4, "ip_proto": IPPROTO_ICMP}
    if spec.icmp_type is not None:
        match["icmpv4_type"] = spec.icmp_type
    if spec.icmp_code is not None:
        match["icmpv4_code"] = spec.icmp_code
    return match


def port_range_masks(lo: int, hi: int) -> list[tuple[int, int] | int]:
    """[lo, hi] as the fewest (value, mask) prefixes of a 16-bit port."""
    out: list[tuple[int, int] | int] = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << 16
        while size > hi - lo + 1:
            size >>= 1
        out.append(lo if size == 1 else (lo, 0xFFFF & ~(size - 1)))
        lo += size
    return out
