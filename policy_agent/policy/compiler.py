"""Policy -> OVS flows, as a pure function of the cluster state (no switch attached).

Evaluation order is the one Antrea users know: Antrea tiers by priority (then
policy priority, then rule order), then Kubernetes NetworkPolicy, then the
baseline tier; first match decides; Pass skips to the Kubernetes layer. Every
rule has a priority of its own in its table, so flows of different rules never
share an OpenFlow identity. Each rule's flows load reg7 (disposition) and reg6
(rule id); logged rules (and every Reject) copy the packet to the agent through
a metered controller action (DESIGN.md §3). A rule whose applied-to x peer x
port product would explode is expressed with a conjunctive match.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Iterable

from meters.ovs import METER_POLICY_ALLOW, METER_POLICY_DENY
from packetin import messages
from packetin.model import Category, Disposition, Flags, Userdata
from packetin.protocol_numbers import ETH_TYPE_IPV4, IPPROTO_ICMP, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP
from packetin.registers import REG_DISPOSITION_FIELD, REG_RULE_ID_FIELD
from policy_agent.ovs import tables
from policy_agent.policy.model import (
    BASELINE_TIER, DEFAULT_TIER, STANDARD_TIERS, Action, AppliedTo, Direction, IcmpSpec, Namespace, Peer, Pod,
    Policy, PolicyKind, PortSpec, Rule,
)
from policy_agent.policy.priorities import assign as assign_priorities
from policy_agent.policy.rules import RuleInfo, allocate_ids, rule_key

# Above this many cross-product flows a rule is expressed with conjunction. Kept
# low on purpose: a rule whose size crosses the threshold is rewritten from one
# representation to the other (at 64, a Pod ADD at 1,000 rules rewrote ~20k flows
# and took 4 s), and conjunction is never more flows than the cross product.
CONJUNCTION_THRESHOLD = 4
_ISOLATION_PRIORITY = 100
_PROTO = {"TCP": (IPPROTO_TCP, "tcp_dst"), "UDP": (IPPROTO_UDP, "udp_dst"),
          "SCTP": (IPPROTO_SCTP, "sctp_dst")}
_DISPOSITION = {Action.ALLOW: Disposition.ALLOW, Action.DROP: Disposition.DROP,
                Action.REJECT: Disposition.REJECT, Action.PASS: Disposition.PASS}
ISOLATION_RULE = "default-isolation"


@dataclass(frozen=True)
class Endpoint:
    """A running Pod: what the CNI path knows about its interface."""

    pod: Pod
    ip: str
    mac: str
    ofport: int


@dataclass(frozen=True)
class ClusterState:
    namespaces: dict[str, Namespace]
    endpoints: tuple[Endpoint, ...]
    policies: tuple[Policy, ...]
    tiers: dict[str, int] = field(default_factory=lambda: dict(STANDARD_TIERS))
    meters: bool = True  # False: the datapath has no meters; controller copies go unmetered
    round_: int = 1


@dataclass
class Compiled:
    flows: list[messages.FlowSpec]
    rules: dict[int, RuleInfo]
    # table -> rule key -> OpenFlow priority; hand back to the next compile so
    # unchanged rules keep their priority (and their flows stay untouched).
    priorities: dict[int, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Term:
    applied: tuple[Endpoint, ...]
    peers: tuple[dict[str, Any], ...] | None  # None = any peer
    ports: tuple[dict[str, Any], ...] | None  # None = any port


# --- selection ---------------------------------------------------------------------------


def _ns_labels(state: ClusterState, name: str) -> dict[str, str]:
    ns = state.namespaces.get(name)
    return dict(ns.labels) if ns else {"kubernetes.io/metadata.name": name}


def _applied_endpoints(state: ClusterState, policy: Policy, applied: Iterable[AppliedTo]) -> list[Endpoint]:
    out: dict[tuple[str, str], Endpoint] = {}
    for at in applied:
        for ep in state.endpoints:
            if policy.kind != PolicyKind.ACNP and ep.pod.namespace != policy.namespace:
                continue
            if at.namespace_selector is not None and not at.namespace_selector.matches(
                    _ns_labels(state, ep.pod.namespace)):
                continue
            if at.pod_selector is not None and not at.pod_selector.matches(ep.pod.labels):
                continue
            out[ep.pod.key] = ep
    return [out[k] for k in sorted(out)]


def _peer_endpoints(state: ClusterState, policy: Policy, peer: Peer, own_ns: str) -> list[Endpoint]:
    found = []
    for ep in state.endpoints:
        ns = ep.pod.namespace
        if peer.namespace_self:
            if ns != own_ns:
                continue
        elif peer.namespace_selector is not None:
            if not peer.namespace_selector.matches(_ns_labels(state, ns)):
                continue
        elif policy.kind != PolicyKind.ACNP and ns != policy.namespace:
            continue  # K8s/ANP: a bare podSelector means the policy's own Namespace
        if peer.pod_selector is not None and not peer.pod_selector.matches(ep.pod.labels):
            continue
        found.append(ep)
    return sorted(found, key=lambda e: e.pod.key)


def _cidrs(peer: Peer) -> list[str]:
    block = peer.ip_block
    if block is None:
        return []
    nets = [block.network()]
    for ex in block.except_:
        exn = ipaddress.ip_network(ex, strict=False)
        nets = [piece for net in nets for piece in
                (net.address_exclude(exn) if exn.subnet_of(net) else [net])]  # type: ignore[arg-type]
    return sorted(str(n) for n in nets if n.version == 4)


def _port_matches(spec: PortSpec, dest: Endpoint | None) -> list[dict[str, Any]]:
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


def _icmp_match(spec: IcmpSpec) -> dict[str, Any]:
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


def _terms(state: ClusterState, policy: Policy, rule: Rule) -> list[_Term]:
    """The (applied-to, peers, ports) products a rule stands for."""
    applied = _applied_endpoints(state, policy, rule.applied_to or policy.applied_to)
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
        own_ns = group[0].pod.namespace
        peer_addrs: list[dict[str, Any]] | None = None
        peer_eps: list[Endpoint] = []
        if rule.peers:
            addr_field = "ipv4_dst" if egress else "ipv4_src"
            addrs: set[str] = set()
            for peer in rule.peers:
                if peer.ip_block is not None:
                    addrs.update(_cidrs(peer))
                else:
                    eps = _peer_endpoints(state, policy, peer, own_ns)
                    peer_eps += eps
                    addrs.update(ep.ip for ep in eps)
            if not addrs:
                continue  # the rule selects no peer at all: it matches nothing
            peer_addrs = [{"eth_type": ETH_TYPE_IPV4, addr_field: _addr(a)} for a in sorted(addrs)]
        # Ports and protocols together are their union (Antrea); neither = any traffic.
        icmp = [_icmp_match(spec) for spec in rule.protocols]
        if not rule.ports and not icmp:
            terms.append(_Term(tuple(group), _tuple(peer_addrs), None))
        elif named and egress:
            if icmp:  # ICMP does not depend on the peer's named ports
                terms.append(_Term(tuple(group), _tuple(peer_addrs), tuple(icmp)))
            # The destination (the peer) names the port: one term per peer Pod; with
            # "any peer", every Pod that has such a port is a candidate.
            candidates = peer_eps if rule.peers else list(state.endpoints)
            for ep in sorted(set(candidates), key=lambda e: e.pod.key):
                ports = [pm for ps in rule.ports for pm in _port_matches(ps, ep)]
                if ports:
                    dest_match = {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": ep.ip}
                    terms.append(_Term(tuple(group), (dest_match,), tuple(ports)))
        else:
            dest = group[0] if not egress else None
            ports = [pm for ps in rule.ports for pm in _port_matches(ps, dest)] + icmp
            if ports:
                terms.append(_Term(tuple(group), _tuple(peer_addrs), tuple(ports)))
    return terms


def _tuple(x: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...] | None:
    return None if x is None else tuple(x)


def _addr(a: str) -> Any:
    net = ipaddress.ip_network(a, strict=False)
    if net.prefixlen == net.max_prefixlen:
        return str(net.network_address)
    return (str(net.network_address), str(net.netmask))


# --- flows -------------------------------------------------------------------------------


def _applied_match(ep: Endpoint, direction: Direction) -> dict[str, Any]:
    if direction == Direction.EGRESS:
        return {"eth_type": ETH_TYPE_IPV4, "in_port": ep.ofport}
    return {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": ep.ip}


def _log_actions(state: ClusterState, disposition: Disposition, rule_id: int, flags: int) -> list[messages.Action]:
    meter = None
    if state.meters:
        meter = METER_POLICY_ALLOW if disposition == Disposition.ALLOW else METER_POLICY_DENY
    ud = Userdata(category=Category.POLICY, flags=flags, rule_id=rule_id).encode()
    return [messages.SetField(REG_DISPOSITION_FIELD, int(disposition)), messages.SetField(REG_RULE_ID_FIELD, rule_id),
            messages.Controller(reason=0, userdata=ud, meter_id=meter)]


def _rule_actions(state: ClusterState, action: Action, rule_id: int, logged: bool, table: int
                  ) -> tuple[list[messages.Action], int | None]:
    """(actions, goto table or None = drop) for a rule in `table`."""
    disposition = _DISPOSITION[action]
    flags = (Flags.LOG if logged else 0) | (Flags.REJECT if action == Action.REJECT else 0)
    actions = _log_actions(state, disposition, rule_id, int(flags)) if flags else \
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


def _emit(flows: list[messages.FlowSpec], table: int, priority: int, term: _Term, direction: Direction,
          actions: list[messages.Action], goto: int | None, cookie: int, conj_id: int) -> None:
    dims: list[list[dict[str, Any]]] = [[_applied_match(ep, direction) for ep in term.applied]]
    if term.peers is not None:
        dims.append(list(term.peers))
    if term.ports is not None:
        dims.append(list(term.ports))
    product = 1
    for d in dims:
        product *= len(d)
    live = [d for d in dims if len(d) > 1]
    if product <= CONJUNCTION_THRESHOLD or len(live) < 2:
        for combo in _product(dims):
            flows.append(messages.FlowSpec.make(table, priority, combo, actions, goto=goto, cookie=cookie))
        return
    # Conjunctive match: one flow per element of each multi-valued dimension; the
    # single-valued dimensions ride along on the conj_id flow.
    fixed: dict[str, Any] = {}
    for d in dims:
        if len(d) == 1:
            fixed.update(d[0])
    for clause, dim in enumerate(live):
        for match in dim:
            flows.append(messages.FlowSpec.make(table, priority, {**fixed, **match},
                                         [messages.Conjunction(conj_id, clause, len(live))], cookie=cookie))
    flows.append(messages.FlowSpec.make(table, priority, {**fixed, "conj_id": conj_id}, actions, goto=goto,
                                 cookie=cookie))


def _product(dims: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{}]
    for dim in dims:
        out = [{**acc, **choice} for acc in out for choice in dim]
    return out


def _tier_order(state: ClusterState, policy: Policy) -> tuple[int, float, int, str, str]:
    tier = policy.tier or DEFAULT_TIER
    kind_rank = 0 if policy.kind == PolicyKind.ACNP else 1
    return (state.tiers.get(tier, STANDARD_TIERS[DEFAULT_TIER]), policy.priority, kind_rank,
            policy.namespace, policy.name)


def compile_policies(state: ClusterState, previous: dict[int, dict[str, int]] | None = None) -> Compiled:
    """Every policy flow and the rule registry for `state` (Pod forwarding flows excluded).

    `previous` is the last Compiled.priorities: passing it keeps rules where they were.
    """
    cookie = tables.cookie(state.round_, tables.COOKIE_KIND_POLICY)
    antrea = sorted((x for x in state.policies if x.kind != PolicyKind.K8S), key=lambda x: _tier_order(state, x))
    k8s = sorted((x for x in state.policies if x.kind == PolicyKind.K8S), key=lambda x: (x.namespace, x.name))

    # Identity of every rule first, so ids are allocated in one deterministic pass.
    entries: list[tuple[Policy, Rule, int]] = []
    keys: list[str] = []
    for policy in antrea + k8s:
        for idx, rule in enumerate(policy.rules):
            entries.append((policy, rule, idx))
            keys.append(rule_key(policy, rule.direction, rule.name or f"{rule.direction.value}-{idx}"))
    for policy in k8s:
        for direction in policy.isolates:
            keys.append(rule_key(policy, direction, ISOLATION_RULE))
    ids = allocate_ids(keys)

    flows: list[messages.FlowSpec] = []
    rules: dict[int, RuleInfo] = {}
    ns_logging = {name: ns.logging_enabled for name, ns in state.namespaces.items()}

    # Which table each rule lands in, in evaluation order, then stable priorities.
    placed: list[tuple[Policy, Rule, int, str, int]] = []
    order: dict[int, list[str]] = {}
    for policy, rule, idx in entries:
        egress = rule.direction == Direction.EGRESS
        key = rule_key(policy, rule.direction, rule.name or f"{rule.direction.value}-{idx}")
        if policy.kind == PolicyKind.K8S:
            table = tables.T_EGRESS_K8S if egress else tables.T_INGRESS_K8S
        else:
            baseline = (policy.tier or DEFAULT_TIER) == BASELINE_TIER
            table = (tables.T_EGRESS_BASELINE if baseline else tables.T_EGRESS) if egress else \
                (tables.T_INGRESS_BASELINE if baseline else tables.T_INGRESS)
        placed.append((policy, rule, idx, key, table))
        order.setdefault(table, []).append(key)
    priorities = {t: assign_priorities(keys, (previous or {}).get(t, {})) for t, keys in order.items()}

    for policy, rule, idx, key, table in placed:
        name = rule.name or f"{rule.direction.value}-{idx}"
        rid = ids[key]
        if policy.kind == PolicyKind.K8S:
            logged = ns_logging.get(policy.namespace, False)
            tier = ""
        else:
            tier = policy.tier or DEFAULT_TIER
            logged = rule.enable_logging
        priority = priorities[table][key]
        rules[rid] = RuleInfo(rule_id=rid, policy_kind=policy.kind.short, namespace=policy.namespace,
                              policy_name=policy.name, rule_name=name, tier=tier, priority=policy.priority,
                              action=rule.action, direction=rule.direction, log_label=rule.log_label,
                              logged=logged)
        actions, goto = _rule_actions(state, rule.action, rid, logged, table)
        for n, term in enumerate(_terms(state, policy, rule)):
            _emit(flows, table, priority, term, rule.direction, actions, goto, cookie, conj_id=rid + n)

    # Kubernetes isolation: a selected Pod gets only what some policy allows.
    for direction in (Direction.EGRESS, Direction.INGRESS):
        table = tables.T_EGRESS_K8S if direction == Direction.EGRESS else tables.T_INGRESS_K8S
        isolated: dict[tuple[str, str], tuple[Endpoint, Policy]] = {}
        for policy in k8s:
            if direction not in policy.isolates:
                continue
            for ep in _applied_endpoints(state, policy, policy.applied_to):
                isolated.setdefault(ep.pod.key, (ep, policy))  # the first isolating policy names the drop
        for key in sorted(isolated):
            ep, policy = isolated[key]
            rid = ids[rule_key(policy, direction, ISOLATION_RULE)]
            logged = ns_logging.get(policy.namespace, False)
            rules[rid] = RuleInfo(rule_id=rid, policy_kind=policy.kind.short, namespace=policy.namespace,
                                  policy_name=policy.name, rule_name=ISOLATION_RULE, tier="", priority=0.0,
                                  action=Action.DROP, direction=direction, log_label="", logged=logged)
            actions, _ = _rule_actions(state, Action.DROP, rid, logged, table)
            flows.append(messages.FlowSpec.make(table, _ISOLATION_PRIORITY, _applied_match(ep, direction), actions,
                                         cookie=cookie))
    return Compiled(flows=flows, rules=rules, priorities=priorities)
