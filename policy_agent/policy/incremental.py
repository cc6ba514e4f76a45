"""Incremental compilation: recompile only the rules a change can affect, and return the difference.

A rule's flows depend on its place (layout: table, priority, id, actions) and on
the Pods its selectors pick. Selectors are shared as groups (Antrea's applied-to
and address groups): one membership per distinct selector, kept per Pod. Most rules
name Pods by class (policy/classes.py: the set of groups a Pod is in), so a Pod
joining or leaving a group rebuilds such a rule only when the group's classes
change; a Pod joining an existing class makes just its own two class flows. Rules
that stay per Pod (namespaces-Self, named ports) and Kubernetes isolation are
rebuilt when their groups' members change, each from a memo of its previous flows.
A change of policies, Tiers or Namespaces lays the rules out again (ids and
priorities, kept where the order allows) and rebuilds the rules whose place
changed. Pure: each Snapshot is immutable and `update` never touches the old
one, so a change the switch refused leaves the previous Snapshot valid.
`update(None, s)` and `update(prev, s)` give compile_policies(s, prev priorities).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from packetin import messages
from policy_agent.policy import classes
from policy_agent.policy.classes import ALL as _ALL
from policy_agent.policy.classes import ClassKey, GroupKey, by_class, group_keys, is_member, rule_groups
from policy_agent.ovs import tables
from policy_agent.policy.compiler import (
    ISOLATION_PRIORITY, ClusterState, Layout, Memo, PlacedRule, applied_match, layout, rule_flows,
)
from policy_agent.policy.model import AppliedTo, Direction, Peer, Pod, Policy
from policy_agent.policy.rules import RuleInfo
from policy_agent.policy.selection import Endpoint, ns_labels_of, scope

PodKey = tuple[str, str]
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


@dataclass(frozen=True)
class _Classes:
    """Pod classes of the known Pods: the groups they are made of, each Pod's key and id, how many
    Pods of each class each group has, each group's ids, and the running Pods' class flows."""

    groups: frozenset[GroupKey]
    pods: dict[PodKey, Pod]
    keys: dict[PodKey, ClassKey]
    ids: dict[PodKey, int]
    counts: dict[GroupKey, dict[int, int]]
    of_group: dict[GroupKey, tuple[int, ...]]
    flows: dict[PodKey, tuple[messages.FlowSpec, ...]]
    cache: dict[ClassKey, int]  # class key -> its hash (shared: a pure function's memo)
    by_key: dict[ClassKey, int]  # class key -> its id
    key_counts: dict[ClassKey, int]  # class key -> how many known Pods have it (by_key's keys but the empty one)


@dataclass(frozen=True)
class Snapshot:
    """One compiled state, and what the next `update` needs to rebuild only what changed."""

    state: ClusterState
    endpoints: dict[PodKey, Endpoint]
    layout: Layout
    placed: dict[str, PlacedRule]
    groups: dict[GroupKey, _Group]
    uses: dict[str, list[GroupKey]]  # rule key (or _ISOLATION) -> the groups it uses
    by_class: frozenset[str]  # the keys of the rules that name Pods by class
    users: dict[GroupKey, frozenset[str]]  # and back
    outputs: dict[str, _RuleOut]  # rule key (or _ISOLATION) -> its flows
    classes: _Classes

    @property
    def rules(self) -> dict[int, RuleInfo]:
        return self.layout.rules

    @property
    def priorities(self) -> dict[int, dict[str, int]]:
        return self.layout.priorities

    def flows(self) -> Iterator[messages.FlowSpec]:
        for out in self.outputs.values():
            yield from out.memo.values()
        for flows in self.classes.flows.values():
            yield from flows


@dataclass(frozen=True)
class Delta:
    """Flows that appeared and disappeared (as objects: an unchanged flow is the same object)."""

    added: list[messages.FlowSpec]
    removed: list[messages.FlowSpec]


class _IndexedSelection:
    """The compiler's Selection, answered from group memberships."""

    def __init__(self, groups: dict[GroupKey, _Group], of_group: dict[GroupKey, tuple[int, ...]]) -> None:
        self._groups = groups
        self._of_group = of_group

    def applied(self, policy: Policy, applied: tuple[AppliedTo, ...]) -> Sequence[Endpoint]:
        return self._groups[("applied", scope(policy), applied)].ordered

    def peers(self, policy: Policy, peer: Peer, own_ns: str) -> Sequence[Endpoint]:
        found = self._groups[("peer", scope(policy), peer)].ordered
        return [ep for ep in found if ep.pod.namespace == own_ns] if peer.namespace_self else found

    def endpoints(self) -> Sequence[Endpoint]:
        return self._groups[_ALL].ordered

    def applied_classes(self, policy: Policy, applied: tuple[AppliedTo, ...]) -> Sequence[int]:
        return self._of_group[("applied", scope(policy), applied)]

    def peer_classes(self, policy: Policy, peer: Peer) -> Sequence[int]:
        return self._of_group[("peer", scope(policy), peer)]


def _same_items(old: Iterable[Any], new: Iterable[Any]) -> bool:
    a, b = tuple(old), tuple(new)
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b))


def _changed_keys(old: Mapping[Any, Any], new: Mapping[Any, Any], among: Iterable[Any] | None = None) -> set[Any]:
    """The keys whose values differ; `among`: the only keys that may."""
    keys = old.keys() | new.keys() if among is None else among
    return {k for k in keys if old.get(k) is not new.get(k) and old.get(k) != new.get(k)}


@dataclass(frozen=True)
class Hint:
    """What the caller knows of a change (the engine's Pod directory, cluster/pod_directory.py):
    `endpoints` is state.endpoints by Pod key and `pods` state.pods by key; if `base` is the previous
    Snapshot's endpoints, only the Pods `touched` may differ from it (endpoint or object), so the
    others are not compared one by one (with 10,000 remote Pods, that walk was most of a Pod's ADD)."""

    endpoints: dict[PodKey, Endpoint]
    pods: Mapping[PodKey, Pod]
    touched: frozenset[PodKey]
    base: dict[PodKey, Endpoint] | None


def update(prev: Snapshot | None, state: ClusterState, hint: Hint | None = None) -> tuple[Snapshot, Delta]:
    """Compile `state`, rebuilding from `prev` only what the change between them can affect."""
    endpoints = hint.endpoints if hint is not None else {ep.pod.key: ep for ep in state.endpoints}
    labels = ns_labels_of(state.namespaces)
    if prev is not None and (prev.state.meters, prev.state.round_, prev.state.rule_meters) != \
            (state.meters, state.round_, state.rule_meters):
        prev = None  # every action or cookie changes: nothing to keep
    if prev is None:
        prev = Snapshot(state, {}, layout(ClusterState({}, (), ())), {}, {}, {}, frozenset(), {}, {},
                        _Classes(frozenset(), {}, {}, {}, {}, {}, {}, {}, {}, {}))
        changed_ns: set[str] = set(state.namespaces)
        relayout = True
    else:
        changed_ns = _changed_keys(prev.state.namespaces, state.namespaces)
        relayout = bool(changed_ns) or prev.state.tiers != state.tiers or \
            not _same_items(prev.state.policies, state.policies)

    # Pods whose membership may have changed: changed ones, and those of a relabelled Namespace.
    touched = hint.touched if hint is not None and hint.base is prev.endpoints else None
    moved = _changed_keys(prev.endpoints, endpoints, touched)
    if changed_ns:
        moved |= {k for k in prev.endpoints.keys() | endpoints.keys() if k[0] in changed_ns}
    groups = dict(prev.groups)
    changed_groups: set[GroupKey] = set()
    for gkey, group in prev.groups.items():
        members: dict[PodKey, Endpoint] | None = None
        for pkey in moved:
            ep = endpoints.get(pkey)
            was = group.members.get(pkey)
            if ep is not None and is_member(gkey, ep, labels):
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

    lay, placed, uses, users, class_rules = prev.layout, prev.placed, prev.uses, prev.users, prev.by_class
    dirty: set[str] = set()
    if relayout:
        lay = layout(state, prev.layout.priorities, (prev.placed, prev.layout.rules), prev.layout.meters)
        placed = {p.key: p for p in lay.placed}
        uses, by_cls = {}, set()
        for key, p in placed.items():  # a rule's groups: kept while its policy and rule are the same objects
            kept = prev.placed.get(key)
            if kept is not None and kept.policy is p.policy and kept.rule is p.rule:
                uses[key] = prev.uses[key]
                if key in prev.by_class:
                    by_cls.add(key)
            else:
                uses[key] = rule_groups(p.policy, p.rule)
                if by_class(p.rule):
                    by_cls.add(key)
        class_rules = frozenset(by_cls)
        iso = [g for iso in lay.isolating for g in group_keys(iso.policy, iso.policy.applied_to, (), False)]
        uses[_ISOLATION] = prev.uses[_ISOLATION] if iso == prev.uses.get(_ISOLATION) else iso
        users = _users(prev, uses)
        for gkey in users.keys() - groups.keys():
            groups[gkey] = _Group.of({k: ep for k, ep in endpoints.items() if is_member(gkey, ep, labels)})
        if groups.keys() != users.keys():
            groups = {g: groups[g] for g in users}
        dirty = {key for key, p in placed.items()
                 if key not in prev.outputs or prev.outputs[key].inputs != p.inputs(lay.cookie)}
        dirty.add(_ISOLATION)
    cgroups = prev.classes.groups
    if relayout and (users is not prev.users or class_rules != prev.by_class):
        cgroups = frozenset(g for g, keys in users.items() if not keys.isdisjoint(class_rules))
    cls, class_changed, added, removed = _reclass(prev, state, cgroups, endpoints, moved, changed_ns, lay.cookie,
                                                  None if touched is None or hint is None else (touched, hint.pods))
    for gkey in changed_groups:  # rules that name each Pod: rebuilt when the members change
        dirty |= users.get(gkey, frozenset()) - class_rules
    for gkey in class_changed:  # rules that name classes: when the group's classes change
        dirty |= users.get(gkey, frozenset()) & class_rules

    outputs = dict(prev.outputs)
    for key in [k for k in outputs if k not in placed and k != _ISOLATION] if relayout else ():
        removed += outputs.pop(key).memo.values()  # rules gone (only a relayout changes `placed`)
    sel = _IndexedSelection(groups, cls.of_group)
    for key in dirty:
        old = outputs.get(key)
        if key == _ISOLATION:  # by Pod: a change of a few Pods redoes theirs, not every isolated Pod's
            inputs: tuple[Any, ...] = (lay.isolating, lay.cookie)
            same = old is not None and old.inputs == inputs and uses[_ISOLATION] is prev.uses.get(_ISOLATION)
            new_memo = _isolation(groups, lay, uses[_ISOLATION], old.memo if old is not None else {},
                                  moved if same else None)
            outputs[key] = _RuleOut(inputs, new_memo)
            was_memo = old.memo if old is not None else {}
            for k in was_memo.keys() | new_memo.keys():
                was_flow, now_flow = was_memo.get(k), new_memo.get(k)
                if was_flow is not now_flow:
                    if was_flow is not None:
                        removed.append(was_flow)
                    if now_flow is not None:
                        added.append(now_flow)
            continue
        inputs = placed[key].inputs(lay.cookie)
        memo = Memo(old.memo if old is not None and old.inputs == inputs else None)
        rule_flows(sel, placed[key], lay.cookie, memo)
        outputs[key] = _RuleOut(inputs, memo.new)
        before = old.memo.values() if old is not None else ()
        kept_ids = {id(f) for f in before}
        new_ids = {id(f) for f in memo.new.values()}
        added += [f for f in memo.new.values() if id(f) not in kept_ids]
        removed += [f for f in before if id(f) not in new_ids]
    snap = Snapshot(state, endpoints, lay, placed, groups, uses, class_rules, users, outputs, cls)
    return snap, Delta(added, removed)


_ISO_DIRECTIONS = ((Direction.EGRESS, tables.T_EGRESS_K8S), (Direction.INGRESS, tables.T_INGRESS_K8S))


def _isolation(groups: dict[GroupKey, _Group], lay: Layout, gkeys: list[GroupKey], old: dict[Any, messages.FlowSpec],
               pods: Iterable[PodKey] | None) -> dict[Any, messages.FlowSpec]:
    """compiler.isolation_flows' flows, by (direction, Pod key); `gkeys`: the applied-to group of each
    of lay.isolating. `pods`: the only Pods whose flows may differ from `old`'s (None: any). A flow
    whose content is unchanged stays the same object."""
    memo: dict[Any, messages.FlowSpec] = {}
    firsts: dict[Direction, dict[PodKey, tuple[Endpoint, Any]]] = {d: {} for d, _ in _ISO_DIRECTIONS}
    if pods is None:
        for iso, g in zip(lay.isolating, gkeys):
            first = firsts[iso.direction]
            for ep in groups[g].ordered:
                first.setdefault(ep.pod.key, (ep, iso))  # the first isolating policy names the drop
    else:
        memo = dict(old)
        pods = list(pods)
        for iso, g in zip(lay.isolating, gkeys):
            members, first = groups[g].members, firsts[iso.direction]
            for pk in pods:
                member = members.get(pk)
                if member is not None:
                    first.setdefault(pk, (member, iso))
        for pk in pods:
            for d, _ in _ISO_DIRECTIONS:
                memo.pop((d, pk), None)
    for direction, table in _ISO_DIRECTIONS:
        for pk, (ep, iso) in firsts[direction].items():
            match = applied_match(ep, direction)
            was = old.get((direction, pk))
            if was is None or was.match != match or was.actions != iso.actions or was.cookie != lay.cookie:
                was = messages.FlowSpec.make(table, ISOLATION_PRIORITY, dict(match), iso.actions, cookie=lay.cookie)
            memo[(direction, pk)] = was
    return memo


def _users(prev: Snapshot, uses: dict[str, list[GroupKey]]) -> dict[GroupKey, frozenset[str]]:
    """Group -> the rules using it, from the previous one: only rules whose groups changed move."""
    moved = [k for k in uses.keys() | prev.uses.keys() if uses.get(k) is not prev.uses.get(k)]
    if not moved:
        return prev.users
    users = dict(prev.users)
    for key in moved:
        for g in set(prev.uses.get(key, ())):
            left = users[g] - {key}
            if left:
                users[g] = left
            else:
                del users[g]
        for g in set(uses.get(key, ())):
            users[g] = users.get(g, frozenset()) | {key}
    return users


def _reclass(prev: Snapshot, state: ClusterState, cgroups: frozenset[GroupKey], endpoints: dict[PodKey, Endpoint],
             moved: set[PodKey], changed_ns: set[str], cookie: int,
             hinted: tuple[frozenset[PodKey], Mapping[PodKey, Pod]] | None = None
             ) -> tuple[_Classes, set[GroupKey], list[messages.FlowSpec], list[messages.FlowSpec]]:
    """Pod classes after the change: (classes, the class groups whose class ids changed, class
    flows added, removed). `hinted`: the only Pods that may differ from `prev`'s, and the Pods by key."""
    old = prev.classes
    labels = ns_labels_of(state.namespaces)
    if hinted is None:
        known = classes.known_pods(state.pods, endpoints.values())
        changed = _changed_keys(old.pods, known)
    else:  # the known Pods of `prev`, with the touched ones as they are now
        known = dict(old.pods)
        for pk in hinted[0]:
            ep = endpoints.get(pk)
            current = ep.pod if ep is not None else hinted[1].get(pk)
            if current is None:
                known.pop(pk, None)
            else:
                known[pk] = current
        changed = _changed_keys(old.pods, known, hinted[0])
    if changed_ns:
        changed |= {k for k in old.pods.keys() | known.keys() if k[0] in changed_ns}
    keys = dict(old.keys)
    fresh, gone = cgroups - old.groups, old.groups - cgroups
    if fresh or gone:  # only the new groups are tested against every Pod
        for pk, pod in known.items():
            if pk not in changed:
                key = keys[pk]
                keys[pk] = (key - gone) | {g for g in fresh if classes.pod_member(g, pod, labels)}
    for pk in changed:
        current = known.get(pk)
        if current is None:
            keys.pop(pk, None)
        else:
            keys[pk] = frozenset(g for g in cgroups if classes.pod_member(g, current, labels))
    by_key, key_counts = _class_ids(old, keys, changed, bool(fresh or gone))
    # The Pods whose (class key, id) may differ: those whose key changed, unless the class groups
    # changed or a class kept its key but not its id (an id clash settled anew): then any Pod.
    if fresh or gone or (by_key is not old.by_key and any(old.by_key.get(k, cid) != cid for k, cid in by_key.items())):
        ids = {pk: by_key[k] for pk, k in keys.items()}
        suspects: set[PodKey] = keys.keys() | old.keys.keys()
    else:  # every class kept its id: the other Pods' ids are the ones they had
        ids = dict(old.ids)
        for pk in changed:
            if pk in keys:
                ids[pk] = by_key[keys[pk]]
            else:
                ids.pop(pk, None)
        suspects = changed

    counts = {g: c for g, c in old.counts.items() if g in cgroups} if fresh or gone else dict(old.counts)
    counts.update((g, {}) for g in fresh)
    touched: set[GroupKey] = set(fresh)
    for pk in suspects:
        before, after = (old.keys.get(pk, frozenset()), old.ids.get(pk)), (keys.get(pk, frozenset()), ids.get(pk))
        if before == after:
            continue
        for sign, (key, cid) in ((-1, before), (1, after)):
            for g in key:
                if g not in cgroups:
                    continue
                if g not in touched:
                    counts[g] = dict(counts.get(g, {}))
                    touched.add(g)
                n = counts[g].get(cid, 0) + sign  # type: ignore[arg-type]
                if n:
                    counts[g][cid] = n  # type: ignore[index]
                else:
                    del counts[g][cid]  # type: ignore[arg-type]
    of_group = {g: c for g, c in old.of_group.items() if g in cgroups} if fresh or gone else dict(old.of_group)
    for g in touched:
        of_group[g] = tuple(sorted(counts.get(g, {})))
    class_changed = {g for g in touched if of_group[g] != old.of_group.get(g)}

    flows = dict(old.flows)
    added: list[messages.FlowSpec] = []
    removed: list[messages.FlowSpec] = []
    renumbered = {pk for pk in suspects if ids.get(pk) != old.ids.get(pk) and (pk in endpoints or pk in old.flows)}
    for pk in moved | renumbered:
        before_flows = flows.pop(pk, ())
        ep = endpoints.get(pk)
        after_flows = classes.pod_class_flows(ep, ids[pk], cookie) if ep is not None else ()
        if after_flows == before_flows:
            after_flows = before_flows  # unchanged flows stay the same objects
        else:
            added += after_flows
            removed += before_flows
        if after_flows:
            flows[pk] = after_flows
    cls = _Classes(cgroups, known, keys, ids, counts, of_group, flows, old.cache, by_key, key_counts)
    return cls, class_changed, added, removed


def _class_ids(old: _Classes, keys: dict[PodKey, ClassKey], changed: set[PodKey], regroup: bool
               ) -> tuple[dict[ClassKey, int], dict[ClassKey, int]]:
    """(class key -> id, class key -> its number of Pods) for `keys`, which differ from `old.keys` only in
    the Pods `changed` unless `regroup`. Ids are a function of the set of keys alone (classes.assign_ids):
    while no class appears or empties, they are the ones `old` has, and no Pod's key is hashed again."""
    if regroup:
        counts: dict[ClassKey, int] = {}
        for key in keys.values():
            if key:
                counts[key] = counts.get(key, 0) + 1
        return classes.assign_ids(counts, old.cache), counts
    counts = old.key_counts
    copied, reshaped = False, not old.by_key  # (the first state has no ids yet, not even the empty key's)
    for pk in changed:
        before, after = old.keys.get(pk), keys.get(pk)
        if before is after or before == after:
            continue
        if not copied:
            counts, copied = dict(counts), True
        if before:
            n = counts[before] - 1
            if n:
                counts[before] = n
            else:
                del counts[before]
                reshaped = True
        if after:
            n = counts.get(after, 0)
            counts[after] = n + 1
            reshaped = reshaped or not n
    return (classes.assign_ids(counts, old.cache) if reshaped else old.by_key), counts
