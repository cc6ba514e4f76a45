"""The policy model: Namespaces, Pods, Tiers and policies as frozen values, source-agnostic.

Manifests (policy_agent/policy/manifests.py) and the Kubernetes source build
these; the compiler turns them into flows. Nothing here does I/O.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from typing import Any, TypeVar

_T = TypeVar("_T")


def _hash_once(cls: type[_T]) -> type[_T]:
    """A frozen value that hashes its fields once. Selectors are in the keys of the compiler's group
    maps (policy/classes.py), looked up on every change: a dataclass's own hash walks every field and
    nested selector each time. The cached hash is never pickled (string hashes differ per process)."""
    fields_hash = cls.__hash__

    def __hash__(self: Any) -> int:
        try:
            return int(self.__dict__["_hash"])
        except KeyError:
            h = fields_hash(self)
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self: Any) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[method-assign]
    return cls


class Action(str, enum.Enum):
    ALLOW = "Allow"
    DROP = "Drop"
    REJECT = "Reject"
    PASS = "Pass"


class Direction(str, enum.Enum):
    INGRESS = "ingress"
    EGRESS = "egress"


class PolicyKind(str, enum.Enum):
    K8S = "NetworkPolicy"                 # networking.k8s.io/v1
    ACNP = "ClusterNetworkPolicy"         # Antrea, cluster scoped
    ANP = "AntreaNetworkPolicy"           # Antrea NetworkPolicy, namespaced

    @property
    def short(self) -> str:
        return {"NetworkPolicy": "K8sNetworkPolicy", "ClusterNetworkPolicy": "AntreaClusterNetworkPolicy",
                "AntreaNetworkPolicy": "AntreaNetworkPolicy"}[self.value]


# Antrea's standard tiers and their priorities (lower = evaluated first).
STANDARD_TIERS: dict[str, int] = {
    "emergency": 50,
    "securityops": 100,
    "networkops": 150,
    "platform": 200,
    "application": 250,
    "baseline": 253,
}
DEFAULT_TIER = "application"
BASELINE_TIER = "baseline"


@dataclass(frozen=True)
class Requirement:
    """A matchExpressions entry: operator In, NotIn, Exists, DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@_hash_once
@dataclass(frozen=True)
class LabelSelector:
    """Kubernetes label selector; the empty selector matches everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str] | tuple[tuple[str, str], ...]) -> bool:
        lab = dict(labels)
        for k, v in self.match_labels:
            if lab.get(k) != v:
                return False
        for req in self.match_expressions:
            present = req.key in lab
            if req.operator == "In" and not (present and lab[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and lab[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


@_hash_once
@dataclass(frozen=True)
class IPBlock:
    cidr: str
    except_: tuple[str, ...] = ()

    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(self.cidr, strict=False)


@_hash_once
@dataclass(frozen=True)
class Peer:
    """One from/to entry. Selectors combine as in Kubernetes: both set = Pods matching
    pod_selector in Namespaces matching namespace_selector; only pod_selector = in the
    policy's own Namespace (K8s/ANP) or any Namespace (ACNP)."""

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None
    # Antrea `namespaces: {match: Self}`: the applied-to Pod's own Namespace.
    namespace_self: bool = False


@dataclass(frozen=True)
class PortSpec:
    protocol: str = "TCP"  # TCP | UDP | SCTP
    port: int | str | None = None  # number, named port, or None = all ports
    end_port: int | None = None


@dataclass(frozen=True)
class IcmpSpec:
    """An Antrea rule's `protocols` entry `{icmp: {icmpType, icmpCode}}`; None = any type/code."""

    icmp_type: int | None = None
    icmp_code: int | None = None


@_hash_once
@dataclass(frozen=True)
class AppliedTo:
    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None


@dataclass(frozen=True)
class Rule:
    direction: Direction
    action: Action = Action.ALLOW
    peers: tuple[Peer, ...] = ()  # empty = any peer
    ports: tuple[PortSpec, ...] = ()  # empty (and no protocols) = any port
    # Antrea `protocols`: the rule matches the union of ports and protocols, as in Antrea.
    protocols: tuple[IcmpSpec, ...] = ()
    name: str = ""
    enable_logging: bool = False
    log_label: str = ""
    applied_to: tuple[AppliedTo, ...] = ()  # rule-level appliedTo (Antrea); empty = the policy's


@dataclass(frozen=True)
class Policy:
    kind: PolicyKind
    name: str
    namespace: str = ""  # "" for cluster-scoped
    tier: str = ""  # Antrea only; "" = application
    priority: float = 0.0  # Antrea only
    applied_to: tuple[AppliedTo, ...] = ()  # K8s: from spec.podSelector in its namespace
    rules: tuple[Rule, ...] = ()
    # K8s only: which directions the policy isolates (policyTypes).
    isolates: tuple[Direction, ...] = ()

    @property
    def ref(self) -> str:
        """`Kind:namespace/name` as written into records (rule.ruleset)."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind.short}:{where}"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind.value, self.namespace, self.name)


@dataclass(frozen=True)
class Tier:
    name: str
    priority: int


ENABLE_LOGGING_KEY = "networkpolicy.antrea.io/enable-logging"


@dataclass(frozen=True)
class Namespace:
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def logging_enabled(self) -> bool:
        """K8s NetworkPolicies in this Namespace are logged: Antrea's annotation
        (also honoured as a label, which is what `kubectl label` users reach for)."""
        return (dict(self.annotations).get(ENABLE_LOGGING_KEY) == "true"
                or dict(self.labels).get(ENABLE_LOGGING_KEY) == "true")


@dataclass(frozen=True)
class ContainerPort:
    name: str
    port: int
    protocol: str = "TCP"


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    ports: tuple[ContainerPort, ...] = ()  # for named ports
    # From the object (status.podIP(s), spec.nodeName): where the Pod runs, on any node (pod_directory.py).
    ips: tuple[str, ...] = ()
    node: str = ""
    # metadata.deletionTimestamp is set: its deletion has begun. Its node gives its address back (CNI
    # DEL) before the object goes, so the address may be another Pod's already: no record names it by
    # that address (pod_directory.py); rules still match it there until the object goes.
    terminating: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)
