"""The audit pipeline's part in overload (auditlog/overload.py): packet-ins counted under the coarser key of the
current level, and the full-detail keys each coarse window covers noted for its record (npaudit.aggregate.keys).
A part of AuditPipeline (auditlog/pipeline.py), which it is mixed into."""

from __future__ import annotations

from itertools import repeat
from typing import Any, Callable, Sequence

from auditlog.aggregate import Aggregation, Emission
from auditlog.overload import LEVEL_NAMES, PEERS
from auditlog.packet import PacketSummary
from packetin.model import PacketIn
from packetin.registers import DISPOSITION_BITS


class CoarseKeys:
    """What it uses of the pipeline's state: the frame decoder, the last packet-in decoded, the counters, the
    aggregator, the overload level, the coarse windows' full-detail keys, the rules and their directions."""

    _decode_frame: Callable[[bytes], PacketSummary]
    _decoded: tuple[PacketIn, PacketSummary] | None
    stats: dict[str, int]
    rule_packet_ins: dict[int, int]
    _agg: Aggregation
    _level: int
    _distinct: dict[tuple, set[tuple]]
    _directions: dict[int, str]
    _rules: Any
    _emit: Callable[[list[Emission]], None]

    def _poke_timer(self) -> None:
        raise NotImplementedError  # the pipeline's window timer

    def _coarse(self, pin: PacketIn) -> None:
        """Account one packet-in under the coarser key of the current overload level."""
        summary = self._decode_frame(pin.packet)
        self._decoded = (pin, summary)
        stats = self.stats
        if summary.truncated:
            stats["decode_truncated"] += 1
        stats["packet_ins"] += 1
        by_rule = self.rule_packet_ins
        by_rule[pin.rule_id] = by_rule.get(pin.rule_id, 0) + 1
        key, prefix = self._coarse_key(pin, summary)
        emissions = self._agg.add(key, (pin, summary), pin.total_len, pin.received_at, True)
        last = summary.dst_port if summary.dst_port is not None else summary.icmp_type
        self._coarse_counted(key, emissions, prefix, (last,))

    def _coarse_key(self, pin: PacketIn, summary: PacketSummary) -> tuple[tuple, tuple]:
        """(the aggregation key at the current level, the full-detail key without its last field)."""
        rule_id = pin.rule_id
        disposition = pin.reg7 & DISPOSITION_BITS
        src, dst, protocol = summary.src_ip, summary.dst_ip, summary.protocol
        prefix = (rule_id, disposition, src, dst, protocol)
        level = self._level
        if level == PEERS:
            # Keep the end the rule protects (the applied-to Pod), drop the other.
            direction = self._direction(rule_id)
            src = src if direction == "egress" else None
            dst = dst if direction == "ingress" else None
        return (LEVEL_NAMES[level], rule_id, disposition, src, dst, protocol), prefix

    def _coarse_counted(self, key: tuple, emissions: list[Emission], prefix: tuple, lasts: Sequence) -> None:
        """Write what the packet-ins' add closed; note their full-detail keys (but the "first"
        packet's, which has a record of its own) among those the key's open window covers."""
        if emissions:
            self._emit(emissions)
            self._poke_timer()
            if any(e.key is key and e.kind == "first" for e in emissions):
                lasts = lasts[1:]
        if lasts:
            distinct = self._distinct.get(key)
            if distinct is None:
                distinct = self._distinct[key] = set()
            if len(lasts) == 1:
                distinct.add((*prefix, lasts[0]))
            else:
                distinct.update(zip(*(repeat(v) for v in prefix), lasts))

    def _direction(self, rule_id: int) -> str:
        direction = self._directions.get(rule_id)
        if direction is None:
            rule = self._rules.get(rule_id) if rule_id else None
            value = getattr(rule, "direction", None) if rule is not None else None
            direction = str(getattr(value, "value", value) or "").lower()
            if rule is not None:
                if len(self._directions) >= 4096:
                    self._directions.clear()
                self._directions[rule_id] = direction
        return direction
