"""Traceflow copies -> the answer: each table the packet met, what decided there, and the outcome (pure).

A copy arriving at a table carries the decision of the observation point before it (reg6 rule
id, reg7 disposition; reg6 = 0: no rule of that table matched, its default sent the packet on);
the AFTER copy carries the decision of the last point. Arrivals are ordered by table number: the
pipeline only ever moves to higher tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from packetin.model import Disposition
from policy_agent.ovs import tables
from policy_agent.policy.compiler import ISOLATION_RULE
from policy_agent.policy.rules import RuleInfo
from policy_agent.traceflow.flows import Phase

TABLE_NAMES = {
    tables.T_CLASSIFIER: "classifier", tables.T_CONNTRACK: "conntrack", tables.T_CT_STATE: "conntrack state",
    tables.T_SRC_CLASS: "source Pod class", tables.T_DST_CLASS: "destination Pod class",
    tables.T_EGRESS: "egress: Antrea tiers", tables.T_EGRESS_K8S: "egress: K8s NetworkPolicy",
    tables.T_EGRESS_BASELINE: "egress: baseline tier", tables.T_INGRESS: "ingress: Antrea tiers",
    tables.T_INGRESS_K8S: "ingress: K8s NetworkPolicy", tables.T_INGRESS_BASELINE: "ingress: baseline tier",
    tables.T_COMMIT: "commit", tables.T_FORWARD: "forward",
}
EGRESS_TABLES = frozenset({tables.T_EGRESS, tables.T_EGRESS_K8S, tables.T_EGRESS_BASELINE})
POLICY_TABLES = frozenset({tables.T_EGRESS, tables.T_EGRESS_K8S, tables.T_EGRESS_BASELINE, tables.T_INGRESS,
                           tables.T_INGRESS_K8S, tables.T_INGRESS_BASELINE})
_ACTION: dict[int, str] = {Disposition.ALLOW: "Allow", Disposition.DROP: "Drop", Disposition.REJECT: "Reject",
           Disposition.PASS: "Pass"}

DELIVERED, FORWARDED, DROPPED, REJECTED, UNKNOWN_DESTINATION, TIMEOUT, NO_REPORT = (
    "delivered", "forwarded", "dropped", "rejected", "unknown-destination", "timeout", "no-report")
OUTCOMES = (DELIVERED, FORWARDED, DROPPED, REJECTED, UNKNOWN_DESTINATION, TIMEOUT, NO_REPORT)


@dataclass(frozen=True)
class Copy:
    """One traceflow packet-in: where, which phase, and the registers it carried."""

    table: int
    phase: Phase
    rule_id: int
    disposition: int


@dataclass(frozen=True)
class Destination:
    """What the Pod directory (the knowledge that writes table 70) says of the destination IP."""

    ip: str
    pod: str | None = None  # "namespace/name"
    ofport: int | None = None  # the Pod's port, or the gateway's
    # No Pod: the node gateway takes it (its address, or outside the Pod subnet), described.
    gateway: str | None = None
    # A Pod of another node reached through the Geneve tunnel: (node name, its underlay address).
    tunnel: tuple[str, str] | None = None


def complete(copies: Iterable[Copy]) -> bool:
    """The trace is over: the AFTER copy (table 20's, emitted once the whole pipeline returned) came."""
    return any(c.phase == Phase.AFTER for c in copies)


def rule_json(rule_id: int, info: RuleInfo | None) -> dict[str, Any]:
    if info is None:
        return {"id": rule_id, "policy": None, "note": "rule id unknown to the agent (policy changed meanwhile?)"}
    return {"id": rule_id, "kind": info.policy_kind, "namespace": info.namespace or None,
            "policy": info.policy_name, "name": info.rule_name, "tier": info.tier or None,
            "action": info.action.value, "direction": info.direction.value}


@dataclass
class TraceResult:
    observations: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)

    @property
    def result(self) -> str:
        return str(self.outcome.get("result"))


def _decision(table: int, rule_id: int, disposition: int, rules: Callable[[int], RuleInfo | None]
              ) -> dict[str, Any]:
    """One policy table's verdict as an observation."""
    obs: dict[str, Any] = {"table": table, "name": TABLE_NAMES[table]}
    if rule_id == 0:
        return {**obs, "action": "default", "detail": "no rule: default (next table)"}
    info = rules(rule_id)
    action = _ACTION.get(disposition & 0xF, "unknown")
    obs.update(action=action, rule=rule_json(rule_id, info))
    if info is not None and info.rule_name == ISOLATION_RULE:
        obs["detail"] = (f"K8s isolation: the Pod is isolated by NetworkPolicy {info.namespace}/{info.policy_name} "
                         f"({info.direction.value}) and no rule allows this packet")
    elif info is not None:
        tier = f", tier {info.tier}" if info.tier else ""
        where = f"{info.namespace}/{info.policy_name}" if info.namespace else info.policy_name
        obs["detail"] = f"{action} by {info.policy_kind} {where}, rule {info.rule_name}{tier}"
    return obs


def decode(copies: Iterable[Copy], *, rules: Callable[[int], RuleInfo | None], destination: Destination,
           reject_reply: str | None, source_port: int | None = None, timed_out: bool = False,
           live: bool = False, arrived_from: str | None = None) -> TraceResult:
    """The observations and the outcome of one trace from its copies. `arrived_from` (a node's
    description): the packet came from that node through the tunnel, whose node judged its egress."""
    copies = list(copies)
    arrivals: dict[int, Copy] = {}
    for c in copies:
        if c.phase == Phase.ARRIVAL:
            arrivals.setdefault(c.table, c)
    after = next((c for c in copies if c.phase == Phase.AFTER), None)
    path = sorted(arrivals)
    res = TraceResult()
    if path:
        where = f"from the tunnel: {arrived_from}" if arrived_from is not None else \
            f"from the source Pod's port {source_port}" if source_port is not None else "from the source Pod's port"
        res.observations.append({"table": tables.T_CLASSIFIER, "name": TABLE_NAMES[tables.T_CLASSIFIER],
                                 "action": "accept", "detail": where})
        res.observations.append({"table": tables.T_CONNTRACK, "name": TABLE_NAMES[tables.T_CONNTRACK],
                                 "action": "track", "detail": "tracked" if live else
                                 "tracked; a trace never commits conntrack state"})
    last: dict[str, Any] | None = None
    for i, table in enumerate(path):
        nxt = arrivals[path[i + 1]] if i + 1 < len(path) else after
        if table == tables.T_CT_STATE:
            to = path[i + 1] if i + 1 < len(path) else None
            if to == tables.T_FORWARD:
                obs = {"action": "established", "detail": "established or related connection: bypasses policy"}
            elif to is None and nxt is not None and arrived_from is not None:
                # From the tunnel, table 25 also drops a source the Pod directory does not hold.
                obs = {"action": "drop", "detail": "dropped before policy: invalid connection state, or a source "
                                                   "address this node knows no Pod of (cluster.deny_unknown_sources)"}
            elif to is None and nxt is not None:
                obs = {"action": "drop", "detail": "invalid connection state: dropped"}
            else:
                obs = {"action": "new", "detail": "new connection: to policy"}
            last = {"table": table, "name": TABLE_NAMES[table], **obs}
        elif table in POLICY_TABLES:
            last = _decision(table, nxt.rule_id, nxt.disposition, rules) if nxt is not None else \
                {"table": table, "name": TABLE_NAMES[table], "action": "unknown", "detail": "no decision seen"}
            if arrived_from is not None and table in EGRESS_TABLES and last.get("action") == "default":
                last["detail"] = "no rule: a packet from the tunnel had its egress judged on the node it left"
            elif destination.tunnel is not None and table not in EGRESS_TABLES and last.get("action") == "default":
                last["detail"] = f"no rule: the destination's ingress is judged on its node, {destination.tunnel[0]}"
        elif table == tables.T_COMMIT:  # a live trace copies here, after the real commit, and forwards for real
            res.observations.append({"table": table, "name": TABLE_NAMES[table], "action": "commit",
                                     "detail": "connection committed to conntrack (live packet)"})
            last = {"table": tables.T_FORWARD, "name": TABLE_NAMES[tables.T_FORWARD], **_forward(destination)}
        else:  # table 70; its trace flow's only way in is through table 60's, which copies nothing
            res.observations.append({"table": tables.T_COMMIT, "name": TABLE_NAMES[tables.T_COMMIT],
                                     "action": "skip", "detail": "no conntrack commit for a trace"})
            last = {"table": table, "name": TABLE_NAMES[table], **_forward(destination)}
        res.observations.append(last)
    res.outcome = _outcome(path, last, after, destination, reject_reply, timed_out, live)
    return res


def _forward(dest: Destination) -> dict[str, Any]:
    if dest.tunnel is not None:
        node, address = dest.tunnel
        pod = f"Pod {dest.pod} on " if dest.pod else ""
        return {"action": "tunnel", "tunnel": {"node": node, "address": address},
                "detail": f"into the Geneve tunnel (port {dest.ofport}) to {pod}node {node} ({address})"}
    if dest.pod is None and dest.gateway is not None:
        return {"action": "output", "detail": f"to {dest.gateway}: the node routes {dest.ip}"}
    if dest.pod is None:
        return {"action": "drop", "detail": f"no Pod has IP {dest.ip}: unknown destination"}
    return {"action": "output", "detail": f"to Pod {dest.pod} on port {dest.ofport}"}


def _outcome(path: list[int], last: dict[str, Any] | None, after: Copy | None, dest: Destination,
             reject_reply: str | None, timed_out: bool, live: bool) -> dict[str, Any]:
    if path and path[-1] in (tables.T_COMMIT, tables.T_FORWARD):
        if dest.tunnel is not None:
            node, address = dest.tunnel
            return {"result": FORWARDED, "port": dest.ofport, "node": node, "address": address,
                    "detail": f"sent through the tunnel to node {node} ({address})"}
        if dest.pod is None and dest.gateway is not None:
            return {"result": FORWARDED, "port": dest.ofport, "detail": f"forwarded to {dest.gateway}"}
        if dest.pod is None:
            return {"result": UNKNOWN_DESTINATION, "detail": f"no Pod has IP {dest.ip}"}
        return {"result": DELIVERED, "pod": dest.pod, "port": dest.ofport,
                "detail": f"delivered to Pod {dest.pod} on port {dest.ofport}"}
    if timed_out or last is None or after is None:
        seen = ", ".join(str(t) for t in path) or "none"
        return {"result": TIMEOUT, "detail": f"the trace did not complete in time (tables seen: {seen})"}
    out: dict[str, Any] = {"table": last["table"], "rule": last.get("rule")}
    if last.get("action") == "Reject":
        return {"result": REJECTED, **out, "reply": reject_reply,
                "detail": f"{last['detail']}; the source Pod {'would receive' if not live else 'received'} "
                          f"{reject_reply or 'nothing'}"}
    return {"result": DROPPED, **out, "detail": str(last.get("detail") or f"dropped in table {last['table']}")}
