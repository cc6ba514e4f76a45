"""Trace tags: a DSCP value reserved per running trace, and the exact packet it marks.

A trace's flows match the tag AND the trace packet's addresses, protocol and ports, so
real traffic that happens to carry the DSCP value is not mistaken for a trace. Residual
risk: a real packet with the same DSCP, addresses, protocol and ports (the source port is
random) sent while the trace runs would be observed, and stopped at table 70, like the trace.

A tag goes back to the pool as soon as its trace ends (least recently used first, so it is
reused only after every other tag); the trace packet's identity (DSCP, addresses, protocol,
ports, as bytes of the frame) is remembered a while longer: its category-0 packet-ins may
still wait in the policy channel behind a flood, and until the service forgets the identity
the dispatcher neither audits nor answers them.
"""

from __future__ import annotations

from dataclasses import dataclass

from packetin.frames import eth_type, ipv4_fragment_offset, ipv4_header_len, l3_offset
from packetin.protocol_numbers import ETH_TYPE_IPV4

# DSCP values of standard per-hop behaviours (CS1-7, AF11-43, EF, VOICE-ADMIT, LE) are
# never used as tags: real traffic carries them most often.
_STANDARD_DSCP = frozenset({1, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 44, 46, 48, 56})
TAG_VALUES = tuple(v for v in range(1, 64) if v not in _STANDARD_DSCP)

_PORTED = frozenset({6, 17, 132})  # TCP, UDP, SCTP: ports in the first 4 bytes


@dataclass(frozen=True)
class TraceTag:
    """What marks one trace's packet: DSCP plus its addresses, protocol and ports (None: no ports)."""

    dscp: int
    src: str
    dst: str
    proto: int
    sport: int | None = None
    dport: int | None = None


class TagsExhausted(Exception):
    """Every tag is in use by a running trace."""


def identity(frame: bytes) -> bytes | None:
    """What tells one trace packet from others: ToS, protocol, addresses, ports (ICMP: type, code).
    None for anything but Ethernet/IPv4 (VLAN tags walked by packetin.frames)."""
    l3 = l3_offset(frame)
    if l3 < 0 or eth_type(frame, l3) != ETH_TYPE_IPV4:
        return None
    ihl = ipv4_header_len(frame, l3)
    if not ihl:
        return None
    proto = frame[l3 + 9]
    l4 = l3 + ihl
    # A non-first fragment carries no transport header: what would be its ports is payload.
    size = 0 if ipv4_fragment_offset(frame, l3) else 4 if proto in _PORTED else 2
    return frame[l3 + 1:l3 + 2] + frame[l3 + 9:l3 + 10] + frame[l3 + 12:l3 + 20] + frame[l4:l4 + size]


def packet_ports(frame: bytes) -> tuple[int | None, int | None]:
    """(source, destination) port of an Ethernet/IPv4 TCP, UDP or SCTP frame; (None, None) otherwise."""
    key = identity(frame)
    if key is None or key[1] not in _PORTED or len(key) < 14:
        return None, None
    return int.from_bytes(key[10:12], "big"), int.from_bytes(key[12:14], "big")


class TagRegistry:
    """DSCP tags of running traces, and the identities of recent trace packets. Pure: the service
    schedules `forget`."""

    def __init__(self, values: tuple[int, ...] = TAG_VALUES) -> None:
        self._free = list(values)  # least recently released first
        self._running: set[int] = set()
        self._known: dict[bytes, int] = {}  # identity of a recent trace packet -> its tag

    def allocate(self) -> int:
        if not self._free:
            raise TagsExhausted(f"all {len(self._running)} trace tags are in use; try again when a trace ends")
        dscp = self._free.pop(0)
        self._running.add(dscp)
        return dscp

    def release(self, dscp: int) -> None:
        """The trace ended: its tag may mark another trace (after every other free tag)."""
        if dscp in self._running:
            self._running.discard(dscp)
            self._free.append(dscp)

    def hold(self, frame: bytes) -> bytes:
        """Remember the trace packet `frame` until `forget(the returned key)`."""
        key = identity(frame)
        if key is None:
            raise ValueError("a trace packet is Ethernet/IPv4")
        self._known[key] = key[0] >> 2  # the DSCP of the ToS byte
        return key

    def forget(self, key: bytes) -> None:
        self._known.pop(key, None)

    @property
    def running(self) -> int:
        return len(self._running)

    def any_known(self) -> bool:
        """False when `match` cannot find anything (no trace packet lately)."""
        return bool(self._known)

    def match(self, frame: bytes) -> int | None:
        """The tag of the recent trace packet `frame` is, or None. Cheap when no trace ran lately:
        the category-0 dispatcher asks for every packet-in."""
        if not self._known:
            return None
        key = identity(frame)
        return None if key is None else self._known.get(key)
