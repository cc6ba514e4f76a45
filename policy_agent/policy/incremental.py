"""Incremental compilation: recompile only the rules a change can affect, and return the difference.

A rule's flows depend on its place (layout: table, priority, id, actions) and on
the Pods its selectors pick. Selectors are shared as groups (Antrea's applied-to
and address groups): one membership per distinct selector, kept per Pod. Most rules
name Pods by class (policy/classes.py: the set of groups a Pod is in), so a Pod
joining or leaving a group rebuilds such a rule only when the group's classes
change; a Pod joining an existing class makes just its own two class flows. Rules
that stay per Pod (namespaces-Self, named ports) are rebuilt when their groups'
members change, each from a memo of its previous flows; Kubernetes isolation is
kept by Pod (policy/isolation.py). A moved Pod's groups and class key are found
once per label set (remembered while the groups and Namespaces stay), so a change
costs what the Pods it touches cost, not what every known Pod does.
A change of policies, Tiers or Namespaces lays the rules out again (ids and
priorities, kept where the order allows) and rebuilds the rules whose place
changed. Pure: each Snapshot is immutable and `update` never touches the old
one, so a change the switch refused leaves the previous Snapshot valid.
`update(None, s)` and `update(prev, s)` give compile_policies(s, prev priorities).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from packetin import messages
from policy_agent.policy import classes, isolation
from policy_agent.policy.classes import ALL as _ALL
from policy_agent.policy.classes import ClassKey, GroupKey, by_class, group_keys, is_member, rule_groups
from policy_agent.policy.compiler import ClusterState, Layout, Memo, PlacedRule, layout, rule_flows
from policy_agent.policy.model import AppliedTo, Direction, Peer, Pod, Policy
from policy_agent.policy.rules import RuleInfo
from policy_agent.policy.selection import Endpoint, NsLabels, RemotePod, ns_labels_of, scope

PodKey = tuple[str, str]
_ISOLATION = "\x00isolation"  # the users entry of the Kubernetes isolation flows


@dataclass(frozen=True)
class _Group:
    members: dict[PodKey, Endpoint]

    @staticmethod
    def of(members: dict[PodKey, Endpoint]) -> "_Group":
        return _Group(members)

    @functools.cached_property
    def ordered(self) -> tuple[Endpoint, ...]:
        """Sorted by Pod key, as the compiler lists them; on first use (rules naming classes never ask, so
        a Pod joining a group of every Pod does not sort it)."""
        return tuple(self.members[k] for k in sorted(self.members))


Features = tuple[bool, str, Any]  # what decides a Pod's groups: (not running here, Namespace, labels)
_MEMO_LIMIT = 65_536  # distinct label sets remembered before the memo starts over


def _features(pod: Pod) -> Features:
    return (isinstance(pod, RemotePod), pod.namespace, pod.labels)


def _groups_of(memo: dict[Features, frozenset[GroupKey]], keys: Iterable[GroupKey], pod: Pod,
               labels: NsLabels) -> frozenset[GroupKey]:
    """The groups among `keys` that `pod` is in, remembered per label set: Pods sharing labels
    (and remote Pods mostly do) are tested against every group once. `memo` is valid for one set
    of group keys and Namespace labels."""
    f = _features(pod)
    got = memo.get(f)
    if got is None:
        got = memo[f] = frozenset(g for g in keys if classes.pod_member(g, pod, labels))
    return got


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
    key_of: dict[Features, ClassKey]  # label set -> its class key (shared, for `groups` and the Namespaces)
    clash_free: bool  # every class's id is its key's hash (classes.reassign_ids)


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
    member_of: dict[Features, frozenset[GroupKey]]  # label set -> its groups (shared, for `groups`' keys)
    iso_first: dict[Direction, dict[GroupKey, int]]  # group -> the first isolating policy (lay.isolating) it is of

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
                        _Classes(frozenset(), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, False), {}, {})
        changed_ns: set[str] = set(state.namespaces)
        relayout = True
    else:
        changed_ns = _changed_keys(prev.state.namespaces, state.namespaces)
        relayout = bool(changed_ns) or prev.state.tiers != state.tiers or \
            (prev.state.policies is not state.policies and not _same_items(prev.state.policies, state.policies))

    # Pods whose membership may have changed: changed ones, and those of a relabelled Namespace.
    touched = hint.touched if hint is not None and hint.base is prev.endpoints else None
    moved = _changed_keys(prev.endpoints, endpoints, touched)
    if changed_ns:
        moved |= {k for k in prev.endpoints.keys() | endpoints.keys() if k[0] in changed_ns}
    groups = dict(prev.groups)
    changed_groups: set[GroupKey] = set()
    member_of = {} if changed_ns or len(prev.member_of) > _MEMO_LIMIT else prev.member_of
    now_in: dict[PodKey, frozenset[GroupKey]] | None = None  # a moved running Pod -> its groups
    if changed_ns:  # Namespace labels changed: every group tests every moved Pod
        edits: dict[GroupKey, list[PodKey]] = {g: list(moved) for g in prev.groups}
    else:  # only the groups a moved Pod was or is in
        edits, now_in = {}, {}
        for pkey in moved:
            was_ep, ep = prev.endpoints.get(pkey), endpoints.get(pkey)
            was_in = _groups_of(member_of, prev.groups, was_ep.pod, labels) if was_ep is not None else frozenset()
            is_in = _groups_of(member_of, prev.groups, ep.pod, labels) if ep is not None else frozenset()
            if ep is not None:
                now_in[pkey] = is_in
            for g in was_in | is_in:
                edits.setdefault(g, []).append(pkey)
    for gkey, pkeys in edits.items():
        group = prev.groups[gkey]
        members: dict[PodKey, Endpoint] | None = None
        for pkey in pkeys:
            ep = endpoints.get(pkey)
            was = group.members.get(pkey)
            if ep is not None and (gkey in now_in[pkey] if now_in is not None else is_member(gkey, ep, labels)):
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
            member_of = {}  # its label sets were remembered for other groups
        if groups.keys() != users.keys():
            groups = {g: groups[g] for g in users}
            member_of = {}
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

    outputs, iso_first = dict(prev.outputs), prev.iso_first
    for key in [k for k in outputs if k not in placed and k != _ISOLATION] if relayout else ():
        removed += outputs.pop(key).memo.values()  # rules gone (only a relayout changes `placed`)
    sel = _IndexedSelection(groups, cls.of_group)
    for key in dirty:
        old = outputs.get(key)
        if key == _ISOLATION:  # by Pod: a change of a few Pods redoes theirs, not every isolated Pod's
            inputs: tuple[Any, ...] = (lay.isolating, lay.cookie)
            same = old is not None and old.inputs == inputs and uses[_ISOLATION] is prev.uses.get(_ISOLATION)
            if not same or now_in is None:
                iso_first = isolation.first_isolating(lay, uses[_ISOLATION])
            new_memo = isolation.by_pod(groups, lay, iso_first, old.memo if old is not None else {},
                                  (endpoints, moved, now_in) if same and now_in is not None else None)
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
    snap = Snapshot(state, endpoints, lay, placed, groups, uses, class_rules, users, outputs, cls, member_of,
                    iso_first)
    return snap, Delta(added, removed)


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
    else:  # the known Pods of `prev`, with the touched ones as they are now (copied only if one differs)
        known = old.pods
        for pk in hinted[0]:
            ep = endpoints.get(pk)
            current = ep.pod if ep is not None else hinted[1].get(pk)
            if known.get(pk) is current:
                continue
            known = dict(old.pods) if known is old.pods else known
            if current is None:
                known.pop(pk, None)
            else:
                known[pk] = current
        changed = _changed_keys(old.pods, known, hinted[0])
    if changed_ns:
        changed |= {k for k in old.pods.keys() | known.keys() if k[0] in changed_ns}
    fresh, gone = cgroups - old.groups, old.groups - cgroups
    keys = dict(old.keys) if fresh or gone else old.keys  # (then copied only if a Pod's key differs)
    if fresh or gone:  # only the new groups are tested against every Pod
        for pk, pod in known.items():
            if pk not in changed:
                key = keys[pk]
                keys[pk] = (key - gone) | {g for g in fresh if classes.pod_member(g, pod, labels)}
    key_of = {} if fresh or gone or changed_ns or len(old.key_of) > _MEMO_LIMIT else old.key_of
    for pk in changed:
        current = known.get(pk)
        key = None if current is None else _groups_of(key_of, cgroups, current, labels)
        if keys.get(pk) is key:
            continue
        keys = dict(old.keys) if keys is old.keys else keys
        if key is None:
            keys.pop(pk, None)
        else:
            keys[pk] = key
    by_key, key_counts, free, kept = _class_ids(old, keys, changed, bool(fresh or gone))
    # The Pods whose (class key, id) may differ: those whose key changed, unless the class groups
    # changed or a class kept its key but not its id (an id clash settled anew): then any Pod.
    if fresh or gone or (not kept and any(old.by_key.get(k, cid) != cid for k, cid in by_key.items())):
        ids = {pk: by_key[k] for pk, k in keys.items()}
        suspects: set[PodKey] = keys.keys() | old.keys.keys()
    else:  # every class kept its id: the other Pods' ids are the ones they had
        ids = old.ids  # (copied only if a Pod's id differs)
        for pk in changed:
            cid = by_key[keys[pk]] if pk in keys else None
            if ids.get(pk) == cid:
                continue
            ids = dict(old.ids) if ids is old.ids else ids
            if cid is None:
                ids.pop(pk, None)
            else:
                ids[pk] = cid
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
    cls = _Classes(cgroups, known, keys, ids, counts, of_group, flows, old.cache, by_key, key_counts, key_of, free)
    return cls, class_changed, added, removed


def _class_ids(old: _Classes, keys: dict[PodKey, ClassKey], changed: set[PodKey], regroup: bool
               ) -> tuple[dict[ClassKey, int], dict[ClassKey, int], bool, bool]:
    """(class key -> id, class key -> its number of Pods, whether no id clashed, whether every key of `old`
    still there kept its id) for `keys`, which differ from `old.keys` only in the Pods `changed` unless
    `regroup`. Ids are a function of the set of keys alone (classes.assign_ids): while no class appears
    or empties they are `old`'s; while no hash clashes, a class coming or going moves no other."""
    if regroup:
        counts: dict[ClassKey, int] = {}
        for key in keys.values():
            if key:
                counts[key] = counts.get(key, 0) + 1
        ids = classes.assign_ids(counts, old.cache)
        return ids, counts, classes.clash_free(ids, old.cache), False
    counts = old.key_counts
    copied, first = False, not old.by_key  # (the first state has no ids yet, not even the empty key's)
    moved: set[ClassKey] = set()
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
                moved.add(before)
        if after:
            n = counts.get(after, 0)
            counts[after] = n + 1
            if not n:
                moved.add(after)
    appeared = [k for k in moved if k in counts and k not in old.key_counts]
    emptied = [k for k in moved if k not in counts and k in old.key_counts]
    if not first and not appeared and not emptied:
        return old.by_key, counts, old.clash_free, True
    kept = classes.reassign_ids(old.by_key, appeared, emptied, old.cache) if old.clash_free and not first else None
    if kept is not None:
        return kept, counts, True, True
    ids = classes.assign_ids(counts, old.cache)
    return ids, counts, classes.clash_free(ids, old.cache), False
