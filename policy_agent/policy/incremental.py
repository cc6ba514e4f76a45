"""Incremental compilation: recompile only the rules a change can affect, and return the difference.

A rule's flows depend on its place (layout: table, priority, id, actions) and on
the Pods its selectors pick. Selectors are shared as groups (Antrea's applied-to
and address groups): one membership per distinct selector, kept per Pod. A Pod or
Namespace change re-tests only that Pod (or the Namespace's Pods) against each
group; the rules of the groups whose members changed are rebuilt, each from a
memo of its previous flows, so a Pod joining a 20-flow rule makes one new flow.
A change of policies, Tiers or Namespaces lays the rules out again (ids and
priorities, kept where the order allows) and rebuilds the rules whose place
changed. Pure: each Snapshot is immutable and `update` never touches the old
one, so a change the switch refused leaves the previous Snapshot valid.
`update(None, s)` and `update(prev, s)` give compile_policies(s, prev priorities).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from packetin import messages
from policy_agent.policy import compiler
from policy_agent.policy.compiler import (
    ClusterState, Items, Layout, Memo, PlacedRule, Term, applied_match, clause_flow, isolation_flows, layout,
    merged_match, one_term, peer_dim, rule_flows, rule_terms,
)
from policy_agent.policy.model import AppliedTo, Direction, Peer, Policy
from policy_agent.policy.rules import RuleInfo
from policy_agent.policy.selection import (
    Endpoint, NsLabels, in_applied, in_peer, ns_labels_of, scope,
)

PodKey = tuple[str, str]
# ("applied", scope, appliedTo) | ("peer", scope, peer) | ("all",): one selector's Pods.
GroupKey = tuple[Any, ...]
_ALL: GroupKey = ("all",)
_ISOLATION = "\x00isolation"  # the users entry of the Kubernetes isolation flows


@dataclass(frozen=True)
class _Group:
    members: dict[PodKey, Endpoint]
    ordered: tuple[Endpoint, ...]  # sorted by Pod key, as the compiler lists them

    @staticmethod
    def of(members: dict[PodKey, Endpoint]) -> "_Group":
        return _Group(members, tuple(members[k] for k in sorted(members)))


@dataclass(frozen=True)
class _RuleOut:
    inputs: tuple[Any, ...]
    memo: dict[Any, messages.FlowSpec]  # its flows, by what they were built from
    term: Term | None = None  # a one-term rule's term: patched in place when only Pods moved
    groups: tuple[_Group, ...] = ()  # what `term` was built from


@dataclass(frozen=True)
class Snapshot:
    """One compiled state, and what the next `update` needs to rebuild only what changed."""

    state: ClusterState
    endpoints: dict[PodKey, Endpoint]
    layout: Layout
    placed: dict[str, PlacedRule]
    groups: dict[GroupKey, _Group]
    uses: dict[str, list[GroupKey]]  # rule key (or _ISOLATION) -> the groups it uses
    users: dict[GroupKey, frozenset[str]]  # and back
    outputs: dict[str, _RuleOut]  # rule key (or _ISOLATION) -> its flows

    @property
    def rules(self) -> dict[int, RuleInfo]:
        return self.layout.rules

    @property
    def priorities(self) -> dict[int, dict[str, int]]:
        return self.layout.priorities

    def flows(self) -> Iterator[messages.FlowSpec]:
        for out in self.outputs.values():
            yield from out.memo.values()


@dataclass(frozen=True)
class Delta:
    """Flows that appeared and disappeared (as objects: an unchanged flow is the same object)."""

    added: list[messages.FlowSpec]
    removed: list[messages.FlowSpec]


def group_keys(policy: Policy, applied: tuple[AppliedTo, ...], peers: Sequence[Peer], any_pod: bool) -> list[GroupKey]:
    where = scope(policy)
    keys: list[GroupKey] = [("applied", where, applied)]
    keys += [("peer", where, peer) for peer in peers if peer.ip_block is None]
    if any_pod:
        keys.append(_ALL)
    return keys


def _rule_groups(placed: PlacedRule) -> list[GroupKey]:
    rule = placed.rule
    # An egress rule to a named port with "any peer" looks at every Pod's ports.
    any_pod = not rule.peers and rule.direction == Direction.EGRESS and any(isinstance(p.port, str) for p in rule.ports)
    return group_keys(placed.policy, rule.applied_to or placed.policy.applied_to, rule.peers, any_pod)


def _is_member(key: GroupKey, ep: Endpoint, labels: NsLabels) -> bool:
    if key[0] == "applied":
        return in_applied(labels, key[1], key[2], ep.pod)
    if key[0] == "peer":
        return in_peer(labels, key[1], key[2], ep.pod, None)  # namespaces-Self: filtered per applied Pod
    return True


class _IndexedSelection:
    """The compiler's Selection, answered from group memberships."""

    def __init__(self, groups: dict[GroupKey, _Group]) -> None:
        self._groups = groups

    def applied(self, policy: Policy, applied: tuple[AppliedTo, ...]) -> Sequence[Endpoint]:
        return self._groups[("applied", scope(policy), applied)].ordered

    def peers(self, policy: Policy, peer: Peer, own_ns: str) -> Sequence[Endpoint]:
        found = self._groups[("peer", scope(policy), peer)].ordered
        return [ep for ep in found if ep.pod.namespace == own_ns] if peer.namespace_self else found

    def endpoints(self) -> Sequence[Endpoint]:
        return self._groups[_ALL].ordered


def _same_items(old: Iterable[Any], new: Iterable[Any]) -> bool:
    a, b = tuple(old), tuple(new)
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b))


def _changed_keys(old: dict[Any, Any], new: dict[Any, Any]) -> set[Any]:
    return {k for k in old.keys() | new.keys() if old.get(k) is not new.get(k) and old.get(k) != new.get(k)}


def update(prev: Snapshot | None, state: ClusterState) -> tuple[Snapshot, Delta]:
    """Compile `state`, rebuilding from `prev` only what the change between them can affect."""
    endpoints = {ep.pod.key: ep for ep in state.endpoints}
    labels = ns_labels_of(state.namespaces)
    if prev is not None and (prev.state.meters != state.meters or prev.state.round_ != state.round_):
        prev = None  # every action or cookie changes: nothing to keep
    if prev is None:
        prev = Snapshot(state, {}, layout(ClusterState({}, (), ())), {}, {}, {}, {}, {})
        changed_ns: set[str] = set(state.namespaces)
        relayout = True
    else:
        changed_ns = _changed_keys(prev.state.namespaces, state.namespaces)
        relayout = bool(changed_ns) or prev.state.tiers != state.tiers or \
            not _same_items(prev.state.policies, state.policies)

    # Pods whose membership may have changed: changed ones, and those of a relabelled Namespace.
    moved = _changed_keys(prev.endpoints, endpoints)
    if changed_ns:
        moved |= {k for k in prev.endpoints.keys() | endpoints.keys() if k[0] in changed_ns}
    groups = dict(prev.groups)
    changed_groups: set[GroupKey] = set()
    for gkey, group in prev.groups.items():
        members: dict[PodKey, Endpoint] | None = None
        for pkey in moved:
            ep = endpoints.get(pkey)
            was = group.members.get(pkey)
            if ep is not None and _is_member(gkey, ep, labels):
                if was is ep or was == ep:
                    continue
                members = dict(group.members) if members is None else members
                members[pkey] = ep
            elif was is not None:
                members = dict(group.members) if members is None else members
                del members[pkey]
        if members is not None:
            groups[gkey] = _Group.of(members)
            changed_groups.add(gkey)

    lay, placed, uses, users = prev.layout, prev.placed, prev.uses, prev.users
    dirty: set[str] = set()
    if relayout:
        lay = layout(state, prev.layout.priorities)
        placed = {p.key: p for p in lay.placed}
        uses = {key: _rule_groups(p) for key, p in placed.items()}
        uses[_ISOLATION] = [g for iso in lay.isolating for g in group_keys(iso.policy, iso.policy.applied_to, (), False)]
        needed = {g for gs in uses.values() for g in gs}
        for gkey in needed - groups.keys():
            groups[gkey] = _Group.of({k: ep for k, ep in endpoints.items() if _is_member(gkey, ep, labels)})
        groups = {g: groups[g] for g in needed}
        by_group: dict[GroupKey, set[str]] = {}
        for key, gs in uses.items():
            for g in gs:
                by_group.setdefault(g, set()).add(key)
        users = {g: frozenset(keys) for g, keys in by_group.items()}
        dirty = {key for key, p in placed.items()
                 if key not in prev.outputs or prev.outputs[key].inputs != p.inputs(lay.cookie)}
        dirty.add(_ISOLATION)
    for gkey in changed_groups:
        dirty |= users.get(gkey, frozenset())

    outputs = dict(prev.outputs)
    added: list[messages.FlowSpec] = []
    removed: list[messages.FlowSpec] = []
    for key in [k for k in outputs if k not in placed and k != _ISOLATION]:
        removed += outputs.pop(key).memo.values()
    sel = _IndexedSelection(groups)
    moves: Moves = {}
    for key in dirty:
        old = outputs.get(key)
        if key == _ISOLATION:
            inputs: tuple[Any, ...] = (lay.isolating, lay.cookie)
            memo = Memo(old.memo if old is not None and old.inputs == inputs else None)
            isolation_flows(sel, lay, memo)
            outputs[key] = _RuleOut(inputs, memo.new)
        else:
            outputs[key] = _rebuild(sel, placed[key], lay.cookie, old, tuple(groups[g] for g in uses[key]),
                                    moves, added, removed)
            continue
        before = old.memo.values() if old is not None else ()
        kept_ids = {id(f) for f in before}
        new_ids = {id(f) for f in memo.new.values()}
        added += [f for f in memo.new.values() if id(f) not in kept_ids]
        removed += [f for f in before if id(f) not in new_ids]
    snap = Snapshot(state, endpoints, lay, placed, groups, uses, users, outputs)
    return snap, Delta(added, removed)


def _rebuild(sel: _IndexedSelection, placed: PlacedRule, cookie: int, old: _RuleOut | None,
             groups: tuple[_Group, ...], moves: Moves, added: list[messages.FlowSpec],
             removed: list[messages.FlowSpec]) -> _RuleOut:
    """A dirty rule's flows: patched clause by clause when only its Pods moved, else rebuilt from
    its memo. Appends what appeared and disappeared to `added` and `removed`."""
    inputs = placed.inputs(cookie)
    same_place = old is not None and old.inputs == inputs
    simple = one_term(placed.rule)
    if same_place and simple and old is not None and old.term is not None:
        term = _moved_term(sel, placed, old, groups)
        patched = regrow(placed, cookie, old.term, term, old.memo, moves) if term is not None else None
        if patched is not None:
            memo_new, more, fewer = patched
            added += more
            removed += fewer
            return _RuleOut(inputs, memo_new, term, groups)
    terms = rule_terms(sel, placed)
    memo = Memo(old.memo if same_place and old is not None else None)
    rule_flows(sel, placed, cookie, memo, terms)
    before = old.memo.values() if old is not None else ()
    kept_ids = {id(f) for f in before}
    new_ids = {id(f) for f in memo.new.values()}
    added += [f for f in memo.new.values() if id(f) not in kept_ids]
    removed += [f for f in before if id(f) not in new_ids]
    return _RuleOut(inputs, memo.new, terms[0] if simple and len(terms) == 1 else None, groups)


# --- patching a one-term rule -------------------------------------------------------------

Moves = dict[tuple[int, int], tuple[list[Endpoint], list[Endpoint]]]


def _moved(before: tuple[Endpoint, ...], after: tuple[Endpoint, ...], moves: Moves) -> tuple[list[Endpoint], list[Endpoint]]:
    """(left, joined) between two applied-to lists, by identity (an unchanged Pod is the same
    Endpoint); `moves` remembers it for the other rules sharing both lists."""
    key = (id(before), id(after))
    if key not in moves:
        now, then = {id(e) for e in after}, {id(e) for e in before}
        moves[key] = ([e for e in before if id(e) not in now], [e for e in after if id(e) not in then])
    return moves[key]


def regrow(placed: PlacedRule, cookie: int, old: Term, new: Term, flows: dict[Any, messages.FlowSpec],
           moves: Moves) -> tuple[dict[Any, messages.FlowSpec], list[messages.FlowSpec], list[messages.FlowSpec]] | None:
    """A one-term rule's flows (`flows`: its memo) after its applied-to Pods or peers changed from
    `old` to `new`, patched clause by clause: (memo, added, removed); None when the change
    alters the representation (conjunction or not, which dimensions vary): rebuild it then."""
    direction = placed.rule.direction
    # Dimensions by length first: the applied-to list is only looked at where it changed.
    sizes = [[len(t.applied)] + [len(d) for d in (t.peers, t.ports) if d is not None] for t in (old, new)]
    if any(n <= 0 for n in sizes[0] + sizes[1]):
        return None
    if old.peers == new.peers and old.ports == new.ports and all(n == 1 for n in sizes[0][1:]):
        return _regrow_product(placed, cookie, old, new, flows, moves)
    if [n > 1 for n in sizes[0]] != [n > 1 for n in sizes[1]]:
        return None
    for shape in sizes:
        product = 1
        for n in shape:
            product *= n
        if product <= compiler.CONJUNCTION_THRESHOLD or sum(n > 1 for n in shape) < 2:
            return None

    def fixed_of(t: Term) -> tuple[Items, ...]:
        dims: list[Sequence[Items]] = [[applied_match(t.applied[0], direction)] if len(t.applied) == 1 else []]
        dims += [d for d in (t.peers, t.ports) if d is not None]
        return tuple(d[0] for d in dims if len(d) == 1)

    fixed = fixed_of(old)
    if fixed != fixed_of(new):
        return None
    n_live = sum(n > 1 for n in sizes[0])
    out = dict(flows)
    added: list[messages.FlowSpec] = []
    removed: list[messages.FlowSpec] = []
    clause = 0
    for b, a, applied in ((old.applied, new.applied, True), (old.peers, new.peers, False),
                          (old.ports, new.ports, False)):
        if b is None or a is None or len(b) <= 1:
            continue
        if b is not a:
            if applied:
                left, joined = _moved(b, a, moves)  # type: ignore[arg-type]
                gone = [applied_match(e, direction) for e in left]
                came = [applied_match(e, direction) for e in joined]
            else:
                was, will = set(b), set(a)
                gone, came = [m for m in b if m not in will], [m for m in a if m not in was]  # type: ignore[misc]
            for match in gone:
                removed.append(out.pop((placed.rule_id, clause, n_live, fixed, match)))
            for match in came:
                flow = clause_flow(placed.table, placed.priority, fixed, match, placed.rule_id, clause, n_live,
                                    cookie)
                out[(placed.rule_id, clause, n_live, fixed, match)] = flow
                added.append(flow)
        clause += 1
    return out, added, removed


def _regrow_product(placed: PlacedRule, cookie: int, old: Term, new: Term, flows: dict[Any, messages.FlowSpec],
                    moves: Moves) -> tuple[dict[Any, messages.FlowSpec], list[messages.FlowSpec], list[messages.FlowSpec]]:
    """regrow for a rule with one peer and one port: one flow per applied-to Pod, never conjunctive."""
    direction = placed.rule.direction
    rest = tuple(d[0] for d in (old.peers, old.ports) if d is not None)
    left, joined = _moved(old.applied, new.applied, moves)
    out = dict(flows)
    removed = [out.pop((applied_match(e, direction), *rest)) for e in left]
    added: list[messages.FlowSpec] = []
    for e in joined:
        combo = (applied_match(e, direction), *rest)
        out[combo] = flow = messages.FlowSpec.make(placed.table, placed.priority, merged_match(combo), placed.actions,
                                                   goto=placed.goto, cookie=cookie)
        added.append(flow)
    return out, added, removed


def _moved_term(sel: _IndexedSelection, placed: PlacedRule, old: _RuleOut, groups: tuple[_Group, ...]
                ) -> Term | None:
    """A one-term rule's term after only its groups changed: None if it now has no term."""
    applied = groups[0].ordered
    if not applied or old.term is None:
        return None
    peers = old.term.peers
    if any(g is not was for g, was in zip(groups[1:], old.groups[1:])):
        dim, _ = peer_dim(sel, placed.policy, placed.rule, applied[0].pod.namespace)
        if dim == []:
            return None
        peers = None if dim is None else tuple(dim)
    return Term(applied, peers, old.term.ports)
