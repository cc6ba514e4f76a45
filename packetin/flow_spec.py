"""Desired flows as frozen specs: the actions the agent uses and FlowSpec (table, priority, match, actions).

Pure data; each action turns into its os-ken object (`to_ofp`) for os-ken's encoder.
packetin.messages builds messages of these specs, packetin.flow_encoder packs their bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from os_ken.ofproto import nicira_ext
from os_ken.ofproto import ofproto_v1_5_parser as parser

__all__ = ["Action", "Conjunction", "Controller", "Ct", "FlowSpec", "GotoTable", "NXAC2PT_METER_ID", "Output",
           "Resubmit", "SetField"]

# Property of NXAST_CONTROLLER2 that os-ken does not know (OVS >= 2.16):
# the meter that rate-limits this controller action's packet-ins.
NXAC2PT_METER_ID = 5


# --- actions ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Output:
    port: int

    def to_ofp(self) -> Any:
        return parser.OFPActionOutput(self.port)


@dataclass(frozen=True, slots=True)
class SetField:
    """Load `value` into a field, e.g. SetField("reg7", 1); (value, mask) loads only the mask's bits."""

    name: str
    value: int | str | tuple[int, int]  # str: what os-ken takes as text, e.g. a MAC address

    def to_ofp(self) -> Any:
        return parser.OFPActionSetField(**{self.name: self.value})


@dataclass(frozen=True, slots=True)
class Resubmit:
    table: int
    in_port: int = 0xFFF8  # OFPP_IN_PORT: keep the packet's in_port

    def to_ofp(self) -> Any:
        return parser.NXActionResubmitTable(in_port=self.in_port, table_id=self.table)


@dataclass(frozen=True, slots=True)
class Controller:
    """controller(reason=..., userdata=..., meter_id=..., max_len=...)."""

    reason: int = 0  # OFPR_TABLE_MISS, "no_match" in ovs-ofctl
    userdata: bytes = b""
    meter_id: int | None = None
    max_len: int = 0xFFFF

    def to_ofp(self) -> Any:
        return _NXActionController2Metered(self.reason, self.userdata, self.meter_id, self.max_len)


class _NXActionController2Metered(parser.NXAction):
    """NXAST_CONTROLLER2 with the meter_id property, serialised by hand."""

    _subtype = nicira_ext.NXAST_CONTROLLER2

    def __init__(self, reason: int, userdata: bytes, meter_id: int | None, max_len: int) -> None:
        super().__init__()
        self.reason = reason
        self.userdata = bytes(userdata)
        self.meter_id = meter_id
        self.max_len = max_len

    @staticmethod
    def _prop(ptype: int, payload: bytes) -> bytes:
        length = 4 + len(payload)
        pad = (-length) % 8
        return struct.pack("!HH", ptype, length) + payload + b"\0" * pad

    def serialize_body(self) -> bytearray:
        body = bytearray(6)  # pad after the subtype: 10 + 6 = 16
        body += self._prop(nicira_ext.NXAC2PT_MAX_LEN, struct.pack("!H2x", self.max_len))
        body += self._prop(nicira_ext.NXAC2PT_REASON, struct.pack("!B3x", self.reason))
        if self.userdata:
            body += self._prop(nicira_ext.NXAC2PT_USERDATA, self.userdata)
        if self.meter_id is not None:
            body += self._prop(NXAC2PT_METER_ID, struct.pack("!I", self.meter_id))
        return body


@dataclass(frozen=True, slots=True)
class Ct:
    """ct(commit?, zone=zone, table=table): send through conntrack; recirculate to `table`."""

    commit: bool = False
    zone: int = 0
    table: int | None = None

    def to_ofp(self) -> Any:
        return parser.NXActionCT(
            flags=1 if self.commit else 0,  # NX_CT_F_COMMIT
            zone_src="", zone_ofs_nbits=self.zone,
            recirc_table=0xFF if self.table is None else self.table,  # 0xff: no recirculation
            alg=0, actions=[])


@dataclass(frozen=True, slots=True)
class Conjunction:
    """conjunction(id, clause/n_clauses); `clause` is 0-based on the wire (ovs-ofctl shows k+1)."""

    conj_id: int
    clause: int
    n_clauses: int

    def to_ofp(self) -> Any:
        return parser.NXActionConjunction(self.clause, self.n_clauses, self.conj_id)


@dataclass(frozen=True, slots=True)
class GotoTable:
    table: int


Action = Output | SetField | Resubmit | Controller | Ct | Conjunction


# --- specs -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """One flow as the agent wants it. `match` uses os-ken OFPMatch field names."""

    table: int
    priority: int
    match: tuple[tuple[str, Any], ...] = ()
    actions: tuple[Action, ...] = ()
    goto: GotoTable | None = None
    cookie: int = 0

    @staticmethod
    def make(table: int, priority: int, match: Mapping[str, Any] | None = None,
             actions: Iterable[Action] = (), goto: int | None = None, cookie: int = 0) -> "FlowSpec":
        return FlowSpec(
            table=table,
            priority=priority,
            match=tuple(sorted((match or {}).items())),
            actions=tuple(actions),
            goto=GotoTable(goto) if goto is not None else None,
            cookie=cookie,
        )

    @property
    def key(self) -> tuple[int, int, tuple[tuple[str, Any], ...]]:
        """OpenFlow identity of a flow: table, priority, match."""
        return (self.table, self.priority, self.match)

    def describe(self) -> str:
        match = ",".join(f"{k}={v}" for k, v in self.match) or "*"
        return f"table={self.table} priority={self.priority} match={match}"
