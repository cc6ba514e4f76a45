"""Policy -> OVS flows, as a pure function of the cluster state (no switch attached).

Evaluation order is the one Antrea users know: Antrea tiers by priority (then
policy priority, then rule order), then Kubernetes NetworkPolicy, then the
baseline tier; first match decides; Pass skips to the Kubernetes layer. Every
rule has a priority of its own in its table, so flows of different rules never
share an OpenFlow identity. Each rule's flows load reg7 (disposition) and reg6
(rule id); logged rules (and every Reject) copy the packet to the agent through
a metered controller action (DESIGN.md §3). A rule whose applied-to x peer x
port product would explode is expressed with a conjunctive match.

compile_policies is the whole state at once: layout (ids, tables, priorities,
actions), then each rule's flows for the Pods a Selection picks. The engine
compiles incrementally from the same pieces (policy/incremental.py).
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from meters.ovs import METER_POLICY_ALLOW, METER_POLICY_DENY
from meters.rule_meters import EMPTY_PLAN, MeterAllocator, RuleMeterPlan, RuleMeterRange
from packetin import messages
from packetin.model import Category, Disposition, Flags, Userdata
from packetin.protocol_numbers import ETH_TYPE_IPV4
from packetin.registers import REG_DISPOSITION_FIELD, REG_DST_CLASS_FIELD, REG_RULE_ID_FIELD, REG_SRC_CLASS_FIELD
from policy_agent.ovs import tables
from policy_agent.policy.classes import (
    Items, by_class, class_groups, class_items, known_pods, pod_class_flows, scan_classes,
)
from policy_agent.policy.model import (
    BASELINE_TIER, DEFAULT_TIER, STANDARD_TIERS, Action, Direction, IPBlock, Namespace, Peer, Pod, Policy,
    PolicyKind, Rule,
)
from policy_agent.policy.ports import icmp_match as _icmp_match
from policy_agent.policy.ports import port_matches as _port_matches
from policy_agent.policy.ports import port_range_masks
from policy_agent.policy.priorities import assign as assign_priorities
from policy_agent.policy.rules import RuleInfo, allocate_ids, rule_key
from policy_agent.policy.selection import Endpoint, ScanSelection, Selection

__all__ = ["ClusterState", "Compiled", "Endpoint", "Layout", "Memo", "PlacedRule", "compile_policies",
           "isolation_flows", "layout", "port_range_masks", "rule_flows"]


# Above this many cross-product flows a rule is expressed with conjunction. Kept
# low on purpose: a rule whose size crosses the threshold is rewritten from one
# representation to the other (at 64, a Pod ADD at 1,000 rules rewrote ~20k flows
# and took 4 s), and conjunction is never more flows than the cross product.
CONJUNCTION_THRESHOLD = 4
ISOLATION_PRIORITY = 100
_DISPOSITION = {Action.ALLOW: Disposition.ALLOW, Action.DROP: Disposition.DROP,
                Action.REJECT: Disposition.REJECT, Action.PASS: Disposition.PASS}
ISOLATION_RULE = "default-isolation"


@dataclass(frozen=True)
class ClusterState:
    namespaces: dict[str, Namespace]
    endpoints: tuple[Endpoint, ...]
    policies: tuple[Policy, ...]
    tiers: dict[str, int] = field(default_factory=lambda: dict(STANDARD_TIERS))
    meters: bool = True  # False: the datapath has no meters; controller copies go unmetered
    round_: int = 1
    # Pods known but not (yet) running: rules match their classes before their ADD.
    pods: tuple[Pod, ...] = ()
    rule_meters: RuleMeterRange | None = None  # per-rule fair meters from this range (None: class meters)


@dataclass
class Compiled:
    flows: list[messages.FlowSpec]
    rules: dict[int, RuleInfo]
    # table -> rule key -> OpenFlow priority; hand back to the next compile so
    # unchanged rules keep their priority (and their flows stay untouched).
    priorities: dict[int, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Term:
    applied: tuple[Items, ...]  # the applied-to Pods as matches: their classes, or each Pod
    peers: tuple[Items, ...] | None  # None = any peer
    ports: tuple[Items, ...] | None  # None = any port


# --- selection ---------------------------------------------------------------------------


def _cidrs(peer: Peer) -> tuple[str, ...]:
    block = peer.ip_block
    if block is None:
        return ()
    return _block_cidrs(block)


@functools.lru_cache(maxsize=8192)
def _block_cidrs(block: IPBlock) -> tuple[str, ...]:
    nets = [block.network()]
    for ex in block.except_:
        exn = ipaddress.ip_network(ex, strict=False)
        nets = [piece for net in nets for piece in
                (net.address_exclude(exn) if exn.subnet_of(net) else [net])]  # type: ignore[arg-type]
    return tuple(sorted(str(n) for n in nets if n.version == 4))


def _class_term(sel: Selection, policy: Policy, rule: Rule) -> list[Term]:
    """A rule matched by Pod class (classes.by_class): one term, Pods as their classes."""
    egress = rule.direction == Direction.EGRESS
    own, other = (REG_SRC_CLASS_FIELD, REG_DST_CLASS_FIELD) if egress else (REG_DST_CLASS_FIELD, REG_SRC_CLASS_FIELD)
    applied = class_items(own, sel.applied_classes(policy, rule.applied_to or policy.applied_to))
    if not applied:
        return []
    peers: list[Items] | None = None
    if rule.peers:
        cidrs = sorted({c for peer in rule.peers for c in _cidrs(peer)})
        peers = [_addr_items("ipv4_dst" if egress else "ipv4_src", c) for c in cidrs]
        peers += class_items(other, (c for peer in rule.peers if peer.ip_block is None
                                     for c in sel.peer_classes(policy, peer)))
        if not peers:
            return []  # the rule selects no peer at all: it matches nothing
    ports = [tuple(pm.items()) for ps in rule.ports for pm in _port_matches(ps, None)]
    ports += [tuple(_icmp_match(spec).items()) for spec in rule.protocols]
    return [Term(tuple(applied), _tuple(peers), tuple(ports) if ports else None)]


def _terms(sel: Selection, policy: Policy, rule: Rule) -> list[Term]:
    """The (applied-to, peers, ports) products a rule stands for."""
    if by_class(rule):
        return _class_term(sel, policy, rule)
    applied = list(sel.applied(policy, rule.applied_to or policy.applied_to))
    if not applied:
        return []
    egress = rule.direction == Direction.EGRESS
    named = any(isinstance(ps.port, str) for ps in rule.ports)
    needs_self = any(peer.namespace_self for peer in rule.peers)
    groups: list[list[Endpoint]] = [applied]
    if needs_self or (named and not egress):
        # Peers or ports depend on the applied-to Pod: one term per Pod.
        groups = [[ep] for ep in applied]
    terms = []
    for group in groups:
        peer_addrs, peer_eps = peer_dim(sel, policy, rule, group[0].pod.namespace)
        if peer_addrs == []:
            continue  # the rule selects no peer at all: it matches nothing
        # Ports and protocols together are their union (Antrea); neither = any traffic.
        icmp = [tuple(_icmp_match(spec).items()) for spec in rule.protocols]
        applied_items = tuple(applied_match(ep, rule.direction) for ep in group)
        if not rule.ports and not icmp:
            terms.append(Term(applied_items, _tuple(peer_addrs), None))
        elif named and egress:
            if icmp:  # ICMP does not depend on the peer's named ports
                terms.append(Term(applied_items, _tuple(peer_addrs), tuple(icmp)))
            # The destination (the peer) names the port: one term per peer Pod; with
            # "any peer", every Pod that has such a port is a candidate.
            candidates = peer_eps if rule.peers else list(sel.endpoints())
            for ep in sorted(set(candidates), key=lambda e: e.pod.key):
                ports = [tuple(pm.items()) for ps in rule.ports for pm in _port_matches(ps, ep)]
                if ports:
                    dest_match = _addr_items("ipv4_dst", ep.ip)
                    terms.append(Term(applied_items, (dest_match,), tuple(ports)))
        else:
            dest = group[0] if not egress else None
            ports = [tuple(pm.items()) for ps in rule.ports for pm in _port_matches(ps, dest)] + icmp
            if ports:
                terms.append(Term(applied_items, _tuple(peer_addrs), tuple(ports)))
    return terms


def peer_dim(sel: Selection, policy: Policy, rule: Rule, own_ns: str) -> tuple[list[Items] | None, list[Endpoint]]:
    """(the peer addresses as matches, None = any peer; the peer Pods) of a rule."""
    if not rule.peers:
        return None, []
    addr_field = "ipv4_dst" if rule.direction == Direction.EGRESS else "ipv4_src"
    addrs: set[str] = set()
    peer_eps: list[Endpoint] = []
    for peer in rule.peers:
        if peer.ip_block is not None:
            addrs.update(_cidrs(peer))
        else:
            eps = sel.peers(policy, peer, own_ns)
            peer_eps += eps
            addrs.update(ep.ip for ep in eps)
    return [_addr_items(addr_field, a) for a in sorted(addrs)], peer_eps


def _tuple(x: list[Items] | None) -> tuple[Items, ...] | None:
    return None if x is None else tuple(x)


@functools.lru_cache(maxsize=65536)
def _addr_items(addr_field: str, a: str) -> Items:
    return (("eth_type", ETH_TYPE_IPV4), (addr_field, _addr(a)))


def _addr(a: str) -> Any:
    net = ipaddress.ip_network(a, strict=False)
    if net.prefixlen == net.max_prefixlen:
        return str(net.network_address)
    return (str(net.network_address), str(net.netmask))


# --- flows -------------------------------------------------------------------------------


def applied_match(ep: Endpoint, direction: Direction) -> Items:
    if direction == Direction.EGRESS:
        return _in_port_items(ep.ofport)
    return _addr_items("ipv4_dst", ep.ip)


@functools.lru_cache(maxsize=65536)
def _in_port_items(ofport: int) -> Items:
    return (("eth_type", ETH_TYPE_IPV4), ("in_port", ofport))


class Memo:
    """Flows of one rule from its last compile, by what they were built from: a rule whose
    inputs are unchanged except a few endpoints rebuilds only the flows those touch."""

    def __init__(self, old: dict[Any, messages.FlowSpec] | None = None) -> None:
        self.old = old or {}
        self.new: dict[Any, messages.FlowSpec] = {}

    def get(self, key: Any, make: Callable[[], messages.FlowSpec]) -> messages.FlowSpec:
        flow = self.new.get(key) or self.old.get(key) or make()
        self.new[key] = flow
        return flow


def merged_match(parts: Iterable[Items]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        out.update(part)
    return out


def _log_actions(state: ClusterState, disposition: Disposition, rule_id: int, flags: int,
                 own_meter: int | None = None) -> list[messages.Action]:
    meter = None
    if state.meters:
        meter = own_meter or (METER_POLICY_ALLOW if disposition == Disposition.ALLOW else METER_POLICY_DENY)
    ud = Userdata(category=Category.POLICY, flags=flags, rule_id=rule_id).encode()
    return [messages.SetField(REG_DISPOSITION_FIELD, int(disposition)), messages.SetField(REG_RULE_ID_FIELD, rule_id),
            messages.Controller(reason=0, userdata=ud, meter_id=meter)]


def rule_flags(action: Action, logged: bool) -> int:
    """Userdata flags of a rule's controller copy. The one place that decides what the agent may
    cache in its XDP drop offload: a logged Drop only; never Allow or Pass (OVS must keep deciding
    them) nor Reject (the Pod must still get its RST or unreachable)."""
    flags = (Flags.LOG if logged else 0) | (Flags.REJECT if action == Action.REJECT else 0)
    if logged and action == Action.DROP:
        flags |= Flags.OFFLOAD_ELIGIBLE
    return int(flags)


def _rule_actions(state: ClusterState, action: Action, rule_id: int, logged: bool, table: int,
                  own_meter: int | None = None) -> tuple[list[messages.Action], int | None]:
    """(actions, goto table or None = drop) for a rule in `table`."""
    disposition = _DISPOSITION[action]
    flags = rule_flags(action, logged)
    actions: list[messages.Action] = _log_actions(state, disposition, rule_id, flags, own_meter) if flags else \
        [messages.SetField(REG_DISPOSITION_FIELD, int(disposition)), messages.SetField(REG_RULE_ID_FIELD, rule_id)]
    egress = table in (tables.T_EGRESS, tables.T_EGRESS_K8S, tables.T_EGRESS_BASELINE)
    after_direction = tables.T_INGRESS if egress else tables.T_COMMIT
    if action == Action.ALLOW:
        return actions, after_direction
    if action == Action.PASS:
        # Pass: skip the remaining tiers, let Kubernetes NetworkPolicy decide
        # (in the baseline tier, nothing is left: it allows).
        if table in (tables.T_EGRESS, tables.T_INGRESS):
            return actions, (tables.T_EGRESS_K8S if egress else tables.T_INGRESS_K8S)
        return actions, after_direction
    return actions, None  # Drop and Reject


def _dims(term: Term) -> list[Sequence[Items]]:
    dims: list[Sequence[Items]] = [term.applied]
    if term.peers is not None:
        dims.append(term.peers)
    if term.ports is not None:
        dims.append(term.ports)
    return dims


def _conjunctive(dims: list[Sequence[Items]]) -> bool:
    product = 1
    for d in dims:
        product *= len(d)
    return product > CONJUNCTION_THRESHOLD and sum(len(d) > 1 for d in dims) >= 2


def _emit(flows: list[messages.FlowSpec], table: int, priority: int, term: Term, actions: tuple[messages.Action, ...],
          goto: int | None, cookie: int, conj_id: int, memo: Memo) -> None:
    dims = _dims(term)
    live = [d for d in dims if len(d) > 1]
    if not _conjunctive(dims):
        for combo in itertools.product(*dims):
            flows.append(memo.get(combo, lambda: messages.FlowSpec.make(
                table, priority, merged_match(combo), actions, goto=goto, cookie=cookie)))
        return
    # Conjunctive match: one flow per element of each multi-valued dimension; the
    # single-valued dimensions ride along on the conj_id flow.
    fixed = tuple(d[0] for d in dims if len(d) == 1)
    for clause, dim in enumerate(live):
        for match in dim:
            flows.append(memo.get((conj_id, clause, len(live), fixed, match), lambda: clause_flow(
                table, priority, fixed, match, conj_id, clause, len(live), cookie)))
    flows.append(memo.get((conj_id, fixed), lambda: messages.FlowSpec.make(
        table, priority, {**merged_match(fixed), "conj_id": conj_id}, actions, goto=goto, cookie=cookie)))


def clause_flow(table: int, priority: int, fixed: tuple[Items, ...], match: Items, conj_id: int, clause: int,
                 n_clauses: int, cookie: int) -> messages.FlowSpec:
    return messages.FlowSpec.make(table, priority, merged_match((*fixed, match)),
                                  (messages.Conjunction(conj_id, clause, n_clauses),), cookie=cookie)


def _tier_order(state: ClusterState, policy: Policy) -> tuple[int, float, int, str, str]:
    tier = policy.tier or DEFAULT_TIER
    kind_rank = 0 if policy.kind == PolicyKind.ACNP else 1
    return (state.tiers.get(tier, STANDARD_TIERS[DEFAULT_TIER]), policy.priority, kind_rank,
            policy.namespace, policy.name)


@dataclass(frozen=True)
class PlacedRule:
    """A rule with its place in the pipeline: table, priority, id and actions."""

    key: str
    policy: Policy
    rule: Rule
    table: int
    priority: int
    rule_id: int
    actions: tuple[messages.Action, ...]
    goto: int | None

    def inputs(self, cookie: int) -> tuple[Any, ...]:
        """Everything but the selected endpoints that the rule's flows depend on."""
        return (self.policy.kind, self.policy.namespace, self.rule.applied_to or self.policy.applied_to,
                self.rule, self.table, self.priority, self.rule_id, self.actions, self.goto, cookie)


@dataclass(frozen=True)
class Isolating:
    """A Kubernetes policy isolating its Pods in one direction: their default drop."""

    direction: Direction
    policy: Policy
    rule_id: int
    actions: tuple[messages.Action, ...]


@dataclass(frozen=True)
class Layout:
    """Everything about the rules that does not depend on which Pods run."""

    placed: tuple[PlacedRule, ...]
    isolating: tuple[Isolating, ...]  # in the order that picks the policy naming a Pod's drop
    rules: dict[int, RuleInfo]
    priorities: dict[int, dict[str, int]]
    cookie: int
    meters: RuleMeterPlan = EMPTY_PLAN  # per-rule meters (meters/rule_meters.py)


def layout(state: ClusterState, previous: dict[int, dict[str, int]] | None = None,
           reuse: tuple[dict[str, PlacedRule], dict[int, RuleInfo]] | None = None,
           meters: RuleMeterPlan | None = None) -> Layout:
    """Rule ids, tables, priorities (kept from `previous` where the order allows) and actions.
    `reuse`: the last layout's rules (by key, by id), kept where nothing of theirs changed."""
    was_placed, was_rules = reuse or ({}, {})
    cookie = tables.cookie(state.round_, tables.COOKIE_KIND_POLICY)
    antrea = sorted((x for x in state.policies if x.kind != PolicyKind.K8S), key=lambda x: _tier_order(state, x))
    k8s = sorted((x for x in state.policies if x.kind == PolicyKind.K8S), key=lambda x: (x.namespace, x.name))

    # Identity of every rule first, so ids are allocated in one deterministic pass.
    entries: list[tuple[Policy, Rule, str, str]] = []
    keys: list[str] = []
    for policy in antrea + k8s:
        for idx, rule in enumerate(policy.rules):
            name = rule.name or f"{rule.direction.value}-{idx}"
            entries.append((policy, rule, name, rule_key(policy, rule.direction, name)))
            keys.append(entries[-1][3])
    for policy in k8s:
        for direction in policy.isolates:
            keys.append(rule_key(policy, direction, ISOLATION_RULE))
    ids = allocate_ids(keys)

    rules: dict[int, RuleInfo] = {}
    alloc = MeterAllocator(state.rule_meters if state.meters else None, meters)
    ns_logging = {name: ns.logging_enabled for name, ns in state.namespaces.items()}

    # Which table each rule lands in, in evaluation order, then stable priorities.
    order: dict[int, list[str]] = {}
    tables_of: list[int] = []
    for policy, rule, _, key in entries:
        egress = rule.direction == Direction.EGRESS
        if policy.kind == PolicyKind.K8S:
            table = tables.T_EGRESS_K8S if egress else tables.T_INGRESS_K8S
        else:
            baseline = (policy.tier or DEFAULT_TIER) == BASELINE_TIER
            table = (tables.T_EGRESS_BASELINE if baseline else tables.T_EGRESS) if egress else \
                (tables.T_INGRESS_BASELINE if baseline else tables.T_INGRESS)
        tables_of.append(table)
        order.setdefault(table, []).append(key)
    priorities = {t: assign_priorities(keys, (previous or {}).get(t, {})) for t, keys in order.items()}

    placed: list[PlacedRule] = []
    for (policy, rule, name, key), table in zip(entries, tables_of):
        rid = ids[key]
        if policy.kind == PolicyKind.K8S:
            logged = ns_logging.get(policy.namespace, False)
            tier = ""
        else:
            tier = policy.tier or DEFAULT_TIER
            logged = rule.enable_logging
        prio = priorities[table][key]
        own = alloc.take(rid, rule.action == Action.ALLOW, bool(rule_flags(rule.action, logged)))
        was = was_placed.get(key)
        if was is not None and was.policy is policy and was.rule is rule and (was.table, was.priority, was.rule_id) == \
                (table, prio, rid) and was_rules[rid].logged == logged and alloc.same(rid):
            placed.append(was)
            rules[rid] = was_rules[rid]
            continue
        rules[rid] = RuleInfo(rule_id=rid, policy_kind=policy.kind.short, namespace=policy.namespace,
                              policy_name=policy.name, rule_name=name, tier=tier, priority=policy.priority,
                              action=rule.action, direction=rule.direction, log_label=rule.log_label,
                              logged=logged)
        actions, goto = _rule_actions(state, rule.action, rid, logged, table, own)
        placed.append(PlacedRule(key, policy, rule, table, prio, rid, tuple(actions), goto))

    isolating: list[Isolating] = []
    for direction in (Direction.EGRESS, Direction.INGRESS):
        table = tables.T_EGRESS_K8S if direction == Direction.EGRESS else tables.T_INGRESS_K8S
        for policy in k8s:
            if direction not in policy.isolates:
                continue
            rid = ids[rule_key(policy, direction, ISOLATION_RULE)]
            logged = ns_logging.get(policy.namespace, False)
            rules[rid] = RuleInfo(rule_id=rid, policy_kind=policy.kind.short, namespace=policy.namespace,
                                  policy_name=policy.name, rule_name=ISOLATION_RULE, tier="", priority=0.0,
                                  action=Action.DROP, direction=direction, log_label="", logged=logged)
            actions, _ = _rule_actions(state, Action.DROP, rid, logged, table, alloc.take(rid, False, logged))
            isolating.append(Isolating(direction, policy, rid, tuple(actions)))
    return Layout(tuple(placed), tuple(isolating), rules, priorities, cookie, alloc.plan())


def rule_flows(sel: Selection, placed: PlacedRule, cookie: int, memo: Memo | None = None) -> list[messages.FlowSpec]:
    """The flows of one placed rule for the Pods `sel` picks."""
    flows: list[messages.FlowSpec] = []
    for n, term in enumerate(_terms(sel, placed.policy, placed.rule)):
        _emit(flows, placed.table, placed.priority, term, placed.actions, placed.goto,
              cookie, placed.rule_id + n, memo or Memo())
    return flows


def isolation_flows(sel: Selection, lay: Layout, memo: Memo | None = None) -> list[messages.FlowSpec]:
    """Kubernetes isolation: a selected Pod gets only what some policy allows."""
    memo = memo or Memo()
    flows: list[messages.FlowSpec] = []
    for direction in (Direction.EGRESS, Direction.INGRESS):
        table = tables.T_EGRESS_K8S if direction == Direction.EGRESS else tables.T_INGRESS_K8S
        isolated: dict[tuple[str, str], tuple[Endpoint, Isolating]] = {}
        for iso in lay.isolating:
            if iso.direction != direction:
                continue
            for ep in sel.applied(iso.policy, iso.policy.applied_to):
                isolated.setdefault(ep.pod.key, (ep, iso))  # the first isolating policy names the drop
        for key in sorted(isolated):
            ep, iso = isolated[key]
            match = applied_match(ep, direction)
            flows.append(memo.get((match, iso.actions, lay.cookie), lambda: messages.FlowSpec.make(
                table, ISOLATION_PRIORITY, dict(match), iso.actions, cookie=lay.cookie)))
    return flows


def compile_policies(state: ClusterState, previous: dict[int, dict[str, int]] | None = None) -> Compiled:
    """Every policy flow and the rule registry for `state` (Pod forwarding flows excluded).

    `previous` is the last Compiled.priorities: passing it keeps rules where they were.
    """
    lay = layout(state, previous)
    known = known_pods(state.pods, state.endpoints)
    classes = scan_classes(state.namespaces, known, class_groups((p.policy, p.rule) for p in lay.placed))
    sel = ScanSelection(state.namespaces, state.endpoints, classes, known.values())
    flows: list[messages.FlowSpec] = []
    for placed in lay.placed:
        flows += rule_flows(sel, placed, lay.cookie)
    flows += isolation_flows(sel, lay)
    for ep in state.endpoints:
        flows += pod_class_flows(ep, classes[ep.pod.key], lay.cookie)
    return Compiled(flows=flows, rules=lay.rules, priorities=lay.priorities)
