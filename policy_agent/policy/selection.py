"""Which running Pods a policy's selectors pick: the predicates, and a scan over every Pod."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

from policy_agent.policy.model import AppliedTo, Namespace, Peer, Pod, Policy, PolicyKind


@dataclass(frozen=True)
class Endpoint:
    """A running Pod: what the CNI path knows about its interface."""

    pod: Pod
    ip: str
    mac: str
    ofport: int


@dataclass(frozen=True)
class RemotePod(Pod):
    """A Pod that does not run on this node (pod_directory.with_remote): its Endpoint has no port
    (ofport 0). Rules match it as a peer by its address; no rule applies to it here (its node does)."""


class Selection(Protocol):
    """Which running Pods a policy's selectors pick (each list sorted by Pod key)."""

    def applied(self, policy: Policy, applied: tuple[AppliedTo, ...]) -> Sequence[Endpoint]: ...

    def peers(self, policy: Policy, peer: Peer, own_ns: str) -> Sequence[Endpoint]: ...

    def endpoints(self) -> Sequence[Endpoint]: ...

    def applied_classes(self, policy: Policy, applied: tuple[AppliedTo, ...]) -> Sequence[int]:
        """The Pod classes (policy/classes.py) of the known Pods `applied` picks, running or not."""
        ...

    def peer_classes(self, policy: Policy, peer: Peer) -> Sequence[int]:
        """The Pod classes of a peer's Pods (not namespaces-Self: that stays per Pod)."""
        ...


NsLabels = Callable[[str], dict[str, str]]


def ns_labels_of(namespaces: dict[str, Namespace]) -> NsLabels:
    def labels(name: str) -> dict[str, str]:
        ns = namespaces.get(name)
        return dict(ns.labels) if ns else {"kubernetes.io/metadata.name": name}
    return labels


def scope(policy: Policy) -> str | None:
    """The Namespace a policy's bare selectors are confined to (None: cluster-wide ACNP)."""
    return None if policy.kind == PolicyKind.ACNP else policy.namespace


def in_applied(ns_labels: NsLabels, where: str | None, applied: tuple[AppliedTo, ...], pod: Pod) -> bool:
    """Is `pod` selected by any of `applied` (of a policy whose scope is `where`)? Never a RemotePod."""
    if isinstance(pod, RemotePod):
        return False
    if where is not None and pod.namespace != where:
        return False
    for at in applied:
        if at.namespace_selector is not None and not at.namespace_selector.matches(ns_labels(pod.namespace)):
            continue
        if at.pod_selector is not None and not at.pod_selector.matches(pod.labels):
            continue
        return True
    return False


def in_peer(ns_labels: NsLabels, where: str | None, peer: Peer, pod: Pod, own_ns: str | None) -> bool:
    """Is `pod` this peer? `own_ns` None leaves Antrea's namespaces-Self to the caller."""
    ns = pod.namespace
    if peer.namespace_self:
        if own_ns is not None and ns != own_ns:
            return False
    elif peer.namespace_selector is not None:
        if not peer.namespace_selector.matches(ns_labels(ns)):
            return False
    elif where is not None and ns != where:
        return False  # K8s/ANP: a bare podSelector means the policy's own Namespace
    return peer.pod_selector is None or peer.pod_selector.matches(pod.labels)


class ScanSelection:
    """Selection by testing every endpoint: the full compile's reference."""

    def __init__(self, namespaces: dict[str, Namespace], endpoints: Iterable[Endpoint],
                 classes: dict[tuple[str, str], int] | None = None, known: Iterable[Pod] = ()) -> None:
        self._eps = sorted(endpoints, key=lambda e: e.pod.key)
        self._labels = ns_labels_of(namespaces)
        self._classes = classes or {}
        self._known = list(known)  # the Pods `classes` has (running or not)

    def applied(self, policy: Policy, applied: tuple[AppliedTo, ...]) -> Sequence[Endpoint]:
        return [ep for ep in self._eps if in_applied(self._labels, scope(policy), applied, ep.pod)]

    def peers(self, policy: Policy, peer: Peer, own_ns: str) -> Sequence[Endpoint]:
        return [ep for ep in self._eps if in_peer(self._labels, scope(policy), peer, ep.pod, own_ns)]

    def endpoints(self) -> Sequence[Endpoint]:
        return self._eps

    def applied_classes(self, policy: Policy, applied: tuple[AppliedTo, ...]) -> Sequence[int]:
        where = scope(policy)
        return sorted({self._classes[p.key] for p in self._known if in_applied(self._labels, where, applied, p)})

    def peer_classes(self, policy: Policy, peer: Peer) -> Sequence[int]:
        where = scope(policy)
        return sorted({self._classes[p.key] for p in self._known if in_peer(self._labels, where, peer, p, None)})
