"""A debug tap: one JSON line per packet-in, like `ovs-ofctl monitor` but typed. Not the audit log."""

from __future__ import annotations

import json
from typing import TextIO

from packetin.model import PacketIn


def packet_in_summary(pin: PacketIn) -> dict[str, object]:
    ud = pin.parsed_userdata
    return {
        "received_at": round(pin.received_at, 6),
        "category": pin.category,
        "reason": pin.reason,
        "table_id": pin.table_id,
        "cookie": f"{pin.cookie:#x}",
        "in_port": pin.in_port,
        "rule_id": pin.rule_id,
        "disposition": pin.disposition,
        "userdata": None if ud is None else {"version": ud.version, "category": ud.category,
                                             "flags": ud.flags, "rule_id": ud.rule_id},
        "total_len": pin.total_len,
        "packet": pin.packet[:64].hex(),
    }


class JsonTap:
    """A subscriber handler writing packet-in summaries to a text stream (line-buffered)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def __call__(self, pin: PacketIn) -> None:
        self._out.write(json.dumps(packet_in_summary(pin), separators=(",", ":")) + "\n")
        self._out.flush()
