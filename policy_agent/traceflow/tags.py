"""Trace tags: a DSCP value reserved per running trace, and the exact packet it marks.

A trace's flows match the tag AND the trace packet's addresses, protocol and ports, so
real traffic that happens to carry the DSCP value is not mistaken for a trace. Residual
risk: a real packet with the same DSCP, addresses, protocol and ports (the source port is
random) sent while the trace runs would be observed, and stopped at table 70, like the trace.

A released tag lingers (its packet-ins may still wait in the policy channel behind a
flood) before it may be reused: until then the category-0 dispatcher still recognises
the trace's packet and neither audits nor answers it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

# DSCP values of standard per-hop behaviours (CS1-7, AF11-43, EF, VOICE-ADMIT, LE) are
# never used as tags: real traffic carries them most often.
_STANDARD_DSCP = frozenset({1, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 44, 46, 48, 56})
TAG_VALUES = tuple(v for v in range(1, 64) if v not in _STANDARD_DSCP)

_IPV4 = b"\x08\x00"


@dataclass(frozen=True)
class TraceTag:
    """What marks one trace's packet: DSCP plus its addresses, protocol and ports (None: no ports)."""

    dscp: int
    src: str
    dst: str
    proto: int
    sport: int | None = None
    dport: int | None = None

    @property
    def _addrs(self) -> bytes:
        return ipaddress.IPv4Address(self.src).packed + ipaddress.IPv4Address(self.dst).packed


class TagsExhausted(Exception):
    """Every tag is in use or lingering."""


class TagRegistry:
    """Tags of running (and lingering) traces. Pure: the service schedules `forget`."""

    def __init__(self, values: tuple[int, ...] = TAG_VALUES) -> None:
        self._free = list(values)  # least recently released first
        self._held: dict[int, tuple[TraceTag, bytes]] = {}  # dscp -> tag, its addresses as bytes

    def allocate(self, src: str, dst: str, proto: int, sport: int | None, dport: int | None) -> TraceTag:
        if not self._free:
            raise TagsExhausted(f"all {len(self._held)} trace tags are in use; try again in a few seconds")
        tag = TraceTag(self._free.pop(0), src, dst, proto, sport, dport)
        self._held[tag.dscp] = (tag, tag._addrs)
        return tag

    def forget(self, tag: TraceTag) -> None:
        """After the linger: the tag may be used again and its packets are no longer recognised."""
        if self._held.get(tag.dscp, (None,))[0] == tag:
            del self._held[tag.dscp]
            self._free.append(tag.dscp)

    def __len__(self) -> int:
        return len(self._held)

    def match(self, frame: bytes) -> TraceTag | None:
        """The held tag whose trace packet `frame` (Ethernet, untagged IPv4) is, or None. Cheap when
        no trace runs: the category-0 dispatcher asks for every packet-in."""
        if not self._held or len(frame) < 34 or frame[12:14] != _IPV4:
            return None
        held = self._held.get(frame[15] >> 2)
        if held is None:
            return None
        tag, addrs = held
        return tag if frame[26:34] == addrs and frame[23] == tag.proto else None
