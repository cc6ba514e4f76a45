"""A fake OVS flow table (faucet-style): runs a packet through FlowSpecs and says what happens.

Enough of OVS for the compiler's flows: tables, priorities, exact and masked
matches, ct_state, goto_table, output, controller copies, set_field of
reg6/reg7, and conjunctive matches (conjunction actions + conj_id flows); for
traceflow's flows also register matches, masked set_field, resubmit (a nested
walk, then the rest of the actions) and ct(commit).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from packetin import messages
from packetin.model import Userdata
from packetin.registers import REG_DISPOSITION_FIELD, REG_RULE_ID_FIELD


@dataclass
class Verdict:
    output: int | None = None  # port, None = dropped
    copies: list[tuple[int, int, Userdata | None]] = field(default_factory=list)  # (reg7, reg6, userdata)
    tables: list[int] = field(default_factory=list)
    regs: dict[str, int] = field(default_factory=dict)
    copy_log: list[tuple[int, int, int, bytes]] = field(default_factory=list)  # (table, reg7, reg6, raw userdata)
    committed: bool = False  # a ct(commit) ran
    flows: list[messages.FlowSpec] = field(default_factory=list)  # every flow the packet matched, in order

    @property
    def forwarded(self) -> bool:
        return self.output is not None


def _ip_in(value: str, want: Any) -> bool:
    if isinstance(want, tuple):
        return ipaddress.ip_address(value) in ipaddress.ip_network(f"{want[0]}/{want[1]}", strict=False)
    return value == want


def _field_matches(pkt: dict[str, Any], name: str, want: Any) -> bool:
    if name == "tunnel_id" and name not in pkt:
        pkt = {**pkt, name: 0}  # as in OVS: a packet that came in through no tunnel (or VNI 0) has tun_id 0
    if name not in pkt:
        return False
    have = pkt[name]
    if name in ("ipv4_src", "ipv4_dst", "arp_tpa"):
        return _ip_in(have, want)
    if isinstance(want, tuple):  # (value, mask)
        value, mask = want
        return (have & mask) == (value & mask)
    return have == want


def _matches(pkt: dict[str, Any], match: tuple[tuple[str, Any], ...]) -> bool:
    return all(_field_matches(pkt, k, v) for k, v in match)


class FlowTable:
    def __init__(self, flows: list[messages.FlowSpec]) -> None:
        self.by_table: dict[int, list[messages.FlowSpec]] = {}
        seen: dict[tuple[Any, ...], messages.FlowSpec] = {}
        for f in flows:
            if f.key in seen and seen[f.key] != f:
                raise AssertionError(f"two different flows share an OpenFlow identity: {f.describe()}")
            seen[f.key] = f
        for f in seen.values():
            self.by_table.setdefault(f.table, []).append(f)
        for flows_ in self.by_table.values():
            flows_.sort(key=lambda f: -f.priority)

    def _lookup(self, table: int, pkt: dict[str, Any]) -> messages.FlowSpec | None:
        flows = self.by_table.get(table, [])
        priorities = sorted({f.priority for f in flows}, reverse=True)
        for prio in priorities:
            level = [f for f in flows if f.priority == prio]
            plain = [f for f in level if not _is_conj(f) and not any(k == "conj_id" for k, _ in f.match)
                     and _matches(pkt, f.match)]
            clauses: dict[int, set[int]] = {}
            needed: dict[int, int] = {}
            for f in level:
                if _is_conj(f) and _matches(pkt, f.match):
                    for a in f.actions:
                        clauses.setdefault(a.conj_id, set()).add(a.clause)
                        needed[a.conj_id] = a.n_clauses
            for conj_id, got in clauses.items():
                if len(got) == needed[conj_id]:
                    with_conj = {**pkt, "conj_id": conj_id}
                    for f in level:
                        if any(k == "conj_id" for k, _ in f.match) and _matches(with_conj, f.match):
                            plain.append(f)
            if plain:
                return plain[0]
        return None

    def run(self, pkt: dict[str, Any], table: int = 0) -> Verdict:
        verdict = Verdict()
        self._walk(dict(pkt), table, verdict, 0)
        return verdict

    def _walk(self, pkt: dict[str, Any], table: int, verdict: Verdict, depth: int) -> None:
        for _ in range(64):
            verdict.tables.append(table)
            regs = {f"reg{n}": verdict.regs.get(f"reg{n}", 0) for n in range(8)}
            flow = self._lookup(table, {**pkt, **regs})
            if flow is None:
                return  # table miss = drop
            verdict.flows.append(flow)
            recirculate = None
            for a in flow.actions:
                if isinstance(a, messages.SetField):
                    if isinstance(a.value, tuple):
                        value, mask = a.value
                        verdict.regs[a.name] = (verdict.regs.get(a.name, 0) & ~mask) | (value & mask)
                    else:
                        verdict.regs[a.name] = a.value
                elif isinstance(a, messages.Controller):
                    reg7, reg6 = verdict.regs.get(REG_DISPOSITION_FIELD, 0), verdict.regs.get(REG_RULE_ID_FIELD, 0)
                    verdict.copies.append((reg7, reg6, Userdata.decode(a.userdata)))
                    verdict.copy_log.append((table, reg7, reg6, a.userdata))
                elif isinstance(a, messages.Output):
                    verdict.output = a.port
                elif isinstance(a, messages.Resubmit):
                    if depth < 64:
                        self._walk(pkt, a.table, verdict, depth + 1)
                elif isinstance(a, messages.Ct):
                    verdict.committed = verdict.committed or a.commit
                    if a.table is not None:  # recirculate as a new connection (tests use new ones)
                        pkt["ct_state"] = 0x21
                        recirculate = a.table
                        break
            if recirculate is not None:
                table = recirculate
                continue
            if flow.goto is None:
                return
            table = flow.goto.table


def _is_conj(f: messages.FlowSpec) -> bool:
    return bool(f.actions) and all(isinstance(a, messages.Conjunction) for a in f.actions)
