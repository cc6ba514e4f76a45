"""Immutable values that cross the packet-in boundary: categories, dispositions, packet-ins."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import NamedTuple

from packetin.registers import DISPOSITION_BITS, USERDATA_LENGTH, USERDATA_VERSION


class Category(enum.IntEnum):
    """Userdata byte 1: which subscriber a packet-in is for."""

    POLICY = 0
    TRACEFLOW = 1


class Disposition(enum.IntEnum):
    """reg7[0..3]: what the rule decided."""

    ALLOW = 0
    DROP = 1
    REJECT = 2
    PASS = 3


class Flags(enum.IntFlag):
    """Userdata byte 2."""

    NONE = 0
    LOG = 0x01
    REJECT = 0x02
    OFFLOAD_ELIGIBLE = 0x04


# OpenFlow packet-in reasons we route on when a packet-in carries no userdata.
REASON_NO_MATCH = 0
REASON_ACTION = 1
_REASON_TO_CATEGORY = {REASON_NO_MATCH: Category.POLICY, REASON_ACTION: Category.TRACEFLOW}

_USERDATA = struct.Struct("!BBBI")


@dataclass(frozen=True, slots=True)
class Userdata:
    """Our userdata layout (DESIGN.md §3); `encode` is what flows carry."""

    category: int
    flags: int = 0
    rule_id: int = 0
    version: int = USERDATA_VERSION

    def encode(self) -> bytes:
        return _USERDATA.pack(self.version, self.category, self.flags, self.rule_id)

    @classmethod
    def decode(cls, raw: bytes) -> "Userdata | None":
        """The userdata, or None when it is not in a layout we know."""
        if len(raw) < USERDATA_LENGTH or raw[0] != USERDATA_VERSION:
            return None
        version, category, flags, rule_id = _USERDATA.unpack_from(raw, 0)
        return cls(category=category, flags=flags, rule_id=rule_id, version=version)


class PacketIn(NamedTuple):
    """One NXT_PACKET_IN2, decoded. `received_at` is wall-clock seconds (UTC epoch).

    A NamedTuple rather than a frozen dataclass: just as immutable, and cheaper to
    build, which counts because one is built per packet-in.
    """

    reason: int
    table_id: int
    cookie: int
    in_port: int | None
    rule_id: int  # reg6
    reg7: int
    userdata: bytes
    packet: bytes
    total_len: int
    received_at: float

    @property
    def disposition(self) -> int:
        return self.reg7 & DISPOSITION_BITS

    @property
    def parsed_userdata(self) -> Userdata | None:
        return Userdata.decode(self.userdata)

    @property
    def flags(self) -> int | None:
        """Userdata byte 2 (Flags) when the userdata is ours, else None (read per packet-in:
        indexing, no Userdata object)."""
        ud = self.userdata
        if len(ud) >= USERDATA_LENGTH and ud[0] == USERDATA_VERSION:
            return ud[2]
        return None

    @property
    def category(self) -> int | None:
        """Demux key: userdata byte 1 when the userdata is ours, else the reason code.

        None means the packet-in cannot be routed (unknown reason, foreign userdata).
        """
        ud = self.userdata
        if ud:
            if len(ud) >= USERDATA_LENGTH and ud[0] == USERDATA_VERSION:
                return ud[1]
            return None
        return _REASON_TO_CATEGORY.get(self.reason)
