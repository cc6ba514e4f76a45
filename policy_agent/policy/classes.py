"""Pod classes: the address-set ids that let a rule match groups of Pods, not each Pod.

A rule whose flows would otherwise name every applied-to Pod and every peer Pod
(one flow, or one conjunction clause, per Pod and rule) names their classes
instead. A Pod's class is the set of selector groups it belongs to (the applied-to
and peer groups of every such rule), so Pods with the same labels share one; two
per-Pod flows load it into registers for each new connection (tables.T_SRC_CLASS by
in_port into REG_SRC_CLASS, tables.T_DST_CLASS by destination address into
REG_DST_CLASS) and the rules match the registers. A Pod joining an existing class
then costs its own two flows, whatever the number of rules (issue 9).

The classifier accepts IPv4 from a Pod port only with that Pod's source address,
so its source class names the same Pods the address would. A class id is a pure
function of the set of classes (a hash, collisions settled in a fixed order), so a
full compile and an incremental one agree. 0 is "no class": addresses that are no
Pod of this node, and Pods no such rule selects.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Sequence

from packetin import messages
from packetin.protocol_numbers import ETH_TYPE_IPV4
from packetin.registers import REG_DST_CLASS_FIELD, REG_SRC_CLASS_FIELD
from policy_agent.ovs import tables
from policy_agent.policy.model import AppliedTo, Direction, Namespace, Peer, Pod, Policy, Rule
from policy_agent.policy.selection import Endpoint, NsLabels, in_applied, in_peer, ns_labels_of, scope

PodKey = tuple[str, str]
# ("applied", scope, appliedTo) | ("peer", scope, peer) | ("all",): one selector's Pods.
GroupKey = tuple[Any, ...]
ClassKey = frozenset  # of GroupKey
Items = tuple[tuple[str, Any], ...]  # one match dimension's element, e.g. (("eth_type", 0x800), ("ipv4_src", ip))
ALL: GroupKey = ("all",)
_CLASS_PRIORITY = 100
_ID_SPACE = (1 << 31) - 1


def group_keys(policy: Policy, applied: tuple[AppliedTo, ...], peers: Sequence[Peer], any_pod: bool) -> list[GroupKey]:
    where = scope(policy)
    keys: list[GroupKey] = [("applied", where, applied)]
    keys += [("peer", where, peer) for peer in peers if peer.ip_block is None]
    if any_pod:
        keys.append(ALL)
    return keys


def by_class(rule: Rule) -> bool:
    """The rule is matched by Pod class: at most one term over all its applied-to Pods (no
    per-Pod peers or ports: Antrea's namespaces-Self and named ports stay per Pod)."""
    return not any(p.namespace_self for p in rule.peers) and not any(isinstance(ps.port, str) for ps in rule.ports)


def rule_groups(policy: Policy, rule: Rule) -> list[GroupKey]:
    # An egress rule to a named port with "any peer" looks at every Pod's ports.
    any_pod = not rule.peers and rule.direction == Direction.EGRESS and any(isinstance(p.port, str) for p in rule.ports)
    return group_keys(policy, rule.applied_to or policy.applied_to, rule.peers, any_pod)


def class_groups(rules: Iterable[tuple[Policy, Rule]]) -> frozenset[GroupKey]:
    """The groups that make up Pod classes: those of the rules matched by class."""
    return frozenset(g for policy, rule in rules if by_class(rule) for g in rule_groups(policy, rule))


def _raw_id(key: ClassKey) -> int:
    text = "\n".join(sorted(repr(g) for g in key))
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:4], "big") % _ID_SPACE + 1


def _canonical(key: ClassKey) -> list[str]:
    return sorted(repr(g) for g in key)


def assign_ids(keys: Iterable[ClassKey], cache: dict[ClassKey, int]) -> dict[ClassKey, int]:
    """An id per non-empty class key (empty: 0), a function of the set of keys alone: the
    key's hash, or on a clash (in a fixed order) the next free one. `cache` keeps hashes."""
    wanted: dict[int, list[ClassKey]] = {}
    for key in set(keys):
        if key:
            raw = cache.get(key)
            if raw is None:
                raw = cache[key] = _raw_id(key)
            wanted.setdefault(raw, []).append(key)
    ids: dict[ClassKey, int] = {frozenset(): 0}
    taken = set(wanted)
    for raw in sorted(wanted):
        same = wanted[raw] if len(wanted[raw]) == 1 else sorted(wanted[raw], key=_canonical)
        ids[same[0]] = raw
        for key in same[1:]:
            free = raw
            while free in taken:
                free = free % _ID_SPACE + 1
            taken.add(free)
            ids[key] = free
    return ids


def reassign_ids(ids: dict[ClassKey, int], appeared: Iterable[ClassKey], emptied: Iterable[ClassKey],
                 cache: dict[ClassKey, int]) -> dict[ClassKey, int] | None:
    """assign_ids of `ids`' keys with the keys `appeared` added and `emptied` removed, when `ids` gave
    every key its hash (no clash) and the new keys' hashes clash with no key's either: then a key
    coming or going moves no other, and only the keys that came are hashed. None: a clash, for
    assign_ids to settle over every key."""
    out = dict(ids)
    for key in emptied:
        del out[key]
    taken = set(out.values())
    for key in appeared:
        raw = cache.get(key)
        if raw is None:
            raw = cache[key] = _raw_id(key)
        if raw in taken:
            return None
        taken.add(raw)
        out[key] = raw
    return out


def clash_free(ids: dict[ClassKey, int], cache: dict[ClassKey, int]) -> bool:
    """Every class key's id is its hash (what reassign_ids needs of the ids it starts from)."""
    return all(cache[key] == cid for key, cid in ids.items() if key)


def pod_class_flows(ep: Endpoint, class_id: int, cookie: int) -> tuple[messages.FlowSpec, ...]:
    """The two flows that load a Pod's class for its new connections (none for class 0). A Pod of
    another node (no port here) is known by its source address, below every local port's flow:
    the classifier lets a local Pod send only from its own address, so no Pod here can claim it."""
    if not class_id:
        return ()
    src = {"in_port": ep.ofport} if ep.ofport else {"eth_type": ETH_TYPE_IPV4, "ipv4_src": ep.ip}
    return (messages.FlowSpec.make(tables.T_SRC_CLASS, _CLASS_PRIORITY - (0 if ep.ofport else 10), src,
                                   [messages.SetField(REG_SRC_CLASS_FIELD, class_id)], goto=tables.T_DST_CLASS,
                                   cookie=cookie),
            messages.FlowSpec.make(tables.T_DST_CLASS, _CLASS_PRIORITY, {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": ep.ip},
                                   [messages.SetField(REG_DST_CLASS_FIELD, class_id)], goto=tables.T_EGRESS,
                                   cookie=cookie))


def class_items(field_name: str, ids: Iterable[int]) -> list[Items]:
    return [(("eth_type", ETH_TYPE_IPV4), (field_name, c)) for c in sorted(set(ids)) if c]


def pod_member(key: GroupKey, pod: Pod, labels: NsLabels) -> bool:
    """Is `pod` in the group `key` (namespaces-Self peers: filtered per applied Pod)?"""
    if key[0] == "applied":
        return in_applied(labels, key[1], key[2], pod)
    if key[0] == "peer":
        return in_peer(labels, key[1], key[2], pod, None)
    return True


def is_member(key: GroupKey, ep: Endpoint, labels: NsLabels) -> bool:
    return pod_member(key, ep.pod, labels)


def known_pods(state_pods: Iterable[Pod], endpoints: Iterable[Endpoint]) -> dict[PodKey, Pod]:
    """The Pods whose classes rules match: every Pod the agent knows, running or not yet (so a
    Pod's ADD finds the rules matching its class in place), running ones as they run."""
    known = {pod.key: pod for pod in state_pods}
    known.update((ep.pod.key, ep.pod) for ep in endpoints)
    return known


def scan_classes(namespaces: dict[str, Namespace], pods: dict[PodKey, Pod],
                 groups: Iterable[GroupKey]) -> dict[PodKey, int]:
    """Every known Pod's class id, testing each against every class group (the full compile)."""
    labels = ns_labels_of(namespaces)
    groups = list(groups)
    keys = {pk: frozenset(g for g in groups if pod_member(g, pod, labels)) for pk, pod in pods.items()}
    ids = assign_ids(keys.values(), {})
    return {pk: ids[key] for pk, key in keys.items()}
