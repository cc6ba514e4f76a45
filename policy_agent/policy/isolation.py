"""Kubernetes isolation kept by Pod: each Pod a Kubernetes policy isolates gets a default drop per
direction, named by the first isolating policy (in the layout's order) whose applied-to group has it
(compiler.isolation_flows is the full compile's). Kept by (direction, Pod key), so a change of a few
Pods redoes their drops alone, from the groups each moved Pod is in, not every isolated Pod's."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from packetin import messages
from policy_agent.ovs import tables
from policy_agent.policy.classes import GroupKey
from policy_agent.policy.compiler import ISOLATION_PRIORITY, Layout, applied_match
from policy_agent.policy.model import Direction
from policy_agent.policy.selection import Endpoint

PodKey = tuple[str, str]


class _Members(Protocol):
    @property
    def members(self) -> dict[PodKey, Endpoint]: ...


_ISO_DIRECTIONS = ((Direction.EGRESS, tables.T_EGRESS_K8S), (Direction.INGRESS, tables.T_INGRESS_K8S))


def first_isolating(lay: Layout, gkeys: list[GroupKey]) -> dict[Direction, dict[GroupKey, int]]:
    """Per direction, each applied-to group (`gkeys`: of each of lay.isolating) -> the first isolating policy
    of it: the one a Pod of the group gets its drop from, unless a group of an earlier one has it."""
    first: dict[Direction, dict[GroupKey, int]] = {d: {} for d, _ in _ISO_DIRECTIONS}
    for i, (iso, g) in enumerate(zip(lay.isolating, gkeys)):
        first[iso.direction].setdefault(g, i)
    return first


def by_pod(groups: Mapping[GroupKey, _Members], lay: Layout, first: dict[Direction, dict[GroupKey, int]],
           old: dict[Any, messages.FlowSpec],
           moved: tuple[dict[PodKey, Endpoint], set[PodKey], dict[PodKey, frozenset[GroupKey]]] | None
           ) -> dict[Any, messages.FlowSpec]:
    """compiler.isolation_flows' flows, by (direction, Pod key). `moved`: (the endpoints, the only Pods
    whose flows may differ from `old`'s, the groups of each running one); None: any Pod's may. A flow
    whose content is unchanged stays the same object."""
    memo: dict[Any, messages.FlowSpec] = {}
    drops: list[tuple[Direction, PodKey, Endpoint, int]] = []
    for direction, _ in _ISO_DIRECTIONS:
        at = first[direction]
        if moved is None:
            found: dict[PodKey, tuple[int, Endpoint]] = {}
            for g, i in at.items():
                for pk, ep in groups[g].members.items():
                    if pk not in found or i < found[pk][0]:
                        found[pk] = (i, ep)
            drops += [(direction, pk, ep, i) for pk, (i, ep) in found.items()]
            continue
        endpoints, pods, now_in = moved
        for pk in pods:
            ins = now_in.get(pk)
            pos = min((at[g] for g in ins if g in at), default=None) if ins else None
            if pos is not None:
                drops.append((direction, pk, endpoints[pk], pos))
    if moved is not None:
        memo = dict(old)
        for pk in moved[1]:
            for d, _ in _ISO_DIRECTIONS:
                memo.pop((d, pk), None)
    tables_of = dict(_ISO_DIRECTIONS)
    for direction, pk, ep, i in drops:
        iso = lay.isolating[i]
        match = applied_match(ep, direction)
        was = old.get((direction, pk))
        if was is None or was.match != match or was.actions != iso.actions or was.cookie != lay.cookie:
            was = messages.FlowSpec.make(tables_of[direction], ISOLATION_PRIORITY, dict(match), iso.actions,
                                         cookie=lay.cookie)
        memo[(direction, pk)] = was
    return memo
