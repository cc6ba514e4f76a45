"""Manifest loading: Kubernetes and Antrea YAML/JSON objects validated into the policy model, all or nothing."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from policy_agent.policy.model import (
    BASELINE_TIER, DEFAULT_TIER, STANDARD_TIERS, Action, AppliedTo, ContainerPort, Direction,
    IPBlock, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, PortSpec, Requirement,
    Rule, Tier,
)

K8S_NETWORKING = "networking.k8s.io/v1"
# Current group first; the legacy groups are accepted identically so manifests written
# for older Antrea releases keep working after an upgrade.
ANTREA_GROUPS = ("crd.antrea.io/v1beta1", "crd.antrea.io/v1alpha1",
                 "security.antrea.tanzu.vmware.com/v1alpha1")
PROTOCOLS = ("TCP", "UDP", "SCTP")
# Antrea reserves these Tier priorities besides the standard tiers' own.
RESERVED_TIER_PRIORITIES = frozenset({251, 252, 254, 255})
# Policies written for old Antrea releases name the standard tiers in CamelCase.
_LEGACY_TIER_NAMES = {"Emergency": "emergency", "SecurityOps": "securityops", "NetworkOps": "networkops",
                      "Platform": "platform", "Application": "application", "Baseline": "baseline"}

_SERVED: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "Pod"): "Pod",
    (K8S_NETWORKING, "NetworkPolicy"): PolicyKind.K8S.value,
    **{(g, "ClusterNetworkPolicy"): PolicyKind.ACNP.value for g in ANTREA_GROUPS},
    **{(g, "NetworkPolicy"): PolicyKind.ANP.value for g in ANTREA_GROUPS},
    **{(g, "Tier"): "Tier" for g in ANTREA_GROUPS},
}
_CLUSTER_SCOPED = {"Namespace", "Tier", PolicyKind.ACNP.value}

_KIND_NAMES: dict[str, str] = {
    **dict.fromkeys(("acnp", "clusternetworkpolicy", "clusternetworkpolicies",
                     "clusternetworkpolicies.crd.antrea.io"), PolicyKind.ACNP.value),
    **dict.fromkeys(("anp", "antreanetworkpolicy", "antreanetworkpolicies",
                     "networkpolicies.crd.antrea.io"), PolicyKind.ANP.value),
    **dict.fromkeys(("netpol", "networkpolicy", "networkpolicies",
                     "networkpolicies.networking.k8s.io"), PolicyKind.K8S.value),
    **dict.fromkeys(("tr", "tier", "tiers"), "Tier"),
    **dict.fromkeys(("po", "pod", "pods"), "Pod"),
    **dict.fromkeys(("ns", "namespace", "namespaces"), "Namespace"),
}

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_LABEL_VALUE_RE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_LOG_LABEL_RE = re.compile(r"[A-Za-z0-9._-]*")
_PORT_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")

Errs = list[tuple[str, str]]  # (field path, reason) for one object


class ManifestError(Exception):
    """The manifests are invalid and none were applied; `errors` has one line per problem:
    "<Kind>/<namespace>/<name> (<source>#<doc index>): <field path>: <reason>"."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class ObjectSet:
    """Everything one load produced, in input order."""

    namespaces: tuple[Namespace, ...] = ()
    pods: tuple[Pod, ...] = ()
    tiers: tuple[Tier, ...] = ()
    policies: tuple[Policy, ...] = ()


def resolve_kind(name: str) -> str:
    """A CLI kind name or short name (acnp, anp, netpol, tr, ns, po...) to the model's kind."""
    kind = _KIND_NAMES.get(name.strip().lower())
    if kind is None:
        raise ValueError(f"unknown kind {name!r}; expected one of {', '.join(sorted(_KIND_NAMES))}")
    return kind


def load_text(text: str, source: str) -> ObjectSet:
    """Load every document of a multi-document YAML (or JSON) text as one set."""
    problems: list[str] = []
    docs = _parse_yaml(text, source, problems)
    return _load([(source, docs)], problems)


def load_path(path: str | Path) -> ObjectSet:
    """Load a file, or every *.yaml/*.yml/*.json file of a directory in name order, as one set."""
    root = Path(path)
    problems: list[str] = []
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))
    elif root.exists():
        files = [root]
    else:
        raise ManifestError([f"{root}: no such file or directory"])
    sources: list[tuple[str, list[Any]]] = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{file.name}: cannot read: {exc}")
            continue
        parse = _parse_json if file.suffix == ".json" else _parse_yaml
        sources.append((file.name, parse(text, file.name, problems)))
    return _load(sources, problems)


def load_documents(docs: Iterable[Any], source: str) -> ObjectSet:
    """Validate already-parsed documents (None entries are empty documents and skipped)."""
    return _load([(source, list(docs))], [])


# --- parsing --------------------------------------------------------------------------------

def _parse_yaml(text: str, source: str, problems: list[str]) -> list[Any]:
    try:
        return list(yaml.safe_load_all(text))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problems.append(f"{source}: invalid YAML{where}: {exc.problem or exc.context or exc}")
    # PyYAML raises ValueError for impossible dates and over-long integers.
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        problems.append(f"{source}: invalid YAML: {exc}")
    return []


def _parse_json(text: str, source: str, problems: list[str]) -> list[Any]:
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as exc:
        problems.append(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")
    except (ValueError, RecursionError) as exc:
        problems.append(f"{source}: invalid JSON: {exc}")
    return []


def _load(sources: list[tuple[str, list[Any]]], problems: list[str]) -> ObjectSet:
    built: list[tuple[str, Any]] = []  # (header, model object)
    for source, docs in sources:
        for index, doc in enumerate(docs, start=1):
            if doc is None:
                continue
            where = f"{source}#{index}"
            if isinstance(doc, dict) and doc.get("kind") == "List":
                errs: Errs = []
                d = _fields(doc, "", errs, {"apiVersion", "kind", "metadata", "items"}) or {}
                items = _items(d.get("items"), "items", errs)
                problems += _format(f"List ({where})", errs)
                for i, item in items:
                    _load_object(item, f"{where}.items[{i}]", built, problems)
            else:
                _load_object(doc, where, built, problems)
    problems += _cross_check(built)
    if problems:
        raise ManifestError(problems)
    objs = [obj for _, obj in built]
    return ObjectSet(namespaces=tuple(o for o in objs if isinstance(o, Namespace)),
                     pods=tuple(o for o in objs if isinstance(o, Pod)),
                     tiers=tuple(o for o in objs if isinstance(o, Tier)),
                     policies=tuple(o for o in objs if isinstance(o, Policy)))


def _load_object(doc: Any, where: str, built: list[tuple[str, Any]], problems: list[str]) -> None:
    if not isinstance(doc, dict):
        problems.append(f"Document ({where}): must be a mapping with apiVersion and kind, got {_type(doc)}")
        return
    api, raw_kind = doc.get("apiVersion"), doc.get("kind")
    kind = _SERVED.get((api, raw_kind)) if isinstance(api, str) and isinstance(raw_kind, str) else None
    header = _header(doc, kind, where)
    errs: Errs = []
    obj: Any = None
    if kind is None:
        _kind_errors(doc, errs)
    else:
        _fields(doc, "", errs, {"apiVersion", "kind", "metadata", "spec", "status"})
        obj = _BUILDERS[kind](doc, errs)
    if errs:
        problems += _format(header, errs)
    elif obj is not None:
        built.append((header, obj))


def _kind_errors(doc: dict[Any, Any], errs: Errs) -> None:
    kind, api = doc.get("kind"), doc.get("apiVersion")
    kinds = sorted({k for _, k in _SERVED} | {"List"})
    if kind is None:
        errs.append(("kind", "required"))
    elif kind == "List":
        errs.append(("kind", "a List cannot contain another List"))
    elif kind not in kinds:
        errs.append(("kind", f"unknown kind {_show(kind)}; expected one of {', '.join(kinds)}"))
    else:
        apis = [a for a, k in _SERVED if k == kind]
        errs.append(("apiVersion", f"{_show(api)} does not serve kind {kind}; expected one of {', '.join(apis)}"))


def _header(doc: dict[Any, Any], kind: str | None, where: str) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = meta.get("name") if isinstance(meta.get("name"), str) and meta.get("name") else "<unnamed>"
    shown = kind or (doc.get("kind") if isinstance(doc.get("kind"), str) else "<no kind>")
    if kind in _CLUSTER_SCOPED or kind is None and "namespace" not in meta:
        return f"{shown}/{name} ({where})"
    ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) and meta.get("namespace") else "default"
    return f"{shown}/{ns}/{name} ({where})"


def _format(header: str, errs: Errs) -> list[str]:
    return [f"{header}: {path}: {reason}" if path else f"{header}: {reason}" for path, reason in errs]


def _cross_check(built: list[tuple[str, Any]]) -> list[str]:
    """Checks that need the whole set: duplicates, Tier priorities, Tier references."""
    problems: list[str] = []
    seen: dict[tuple[str, str, str], str] = {}
    tier_priority: dict[int, str] = {}
    tiers = {t.name for _, t in built if isinstance(t, Tier)}
    for header, obj in built:
        key = _key(obj)
        if key in seen:
            problems.append(f"{header}: metadata.name: duplicate of {seen[key]}")
        seen.setdefault(key, header)
        if isinstance(obj, Tier):
            if obj.priority in tier_priority:
                problems.append(f"{header}: spec.priority: {obj.priority} is already used by "
                                f"{tier_priority[obj.priority]}")
            tier_priority.setdefault(obj.priority, header)
        if isinstance(obj, Policy) and obj.kind is not PolicyKind.K8S and obj.tier not in STANDARD_TIERS \
                and obj.tier not in tiers:
            problems.append(f"{header}: spec.tier: unknown tier {obj.tier!r}; expected a standard tier "
                            f"({', '.join(STANDARD_TIERS)}) or a Tier in this set")
    return problems


def _key(obj: Any) -> tuple[str, str, str]:
    if isinstance(obj, Policy):
        return obj.key
    if isinstance(obj, Pod):
        return ("Pod", obj.namespace, obj.name)
    return (type(obj).__name__, "", obj.name)


# --- objects --------------------------------------------------------------------------------

def _meta(doc: dict[Any, Any], kind: str, errs: Errs) -> tuple[str, str, tuple[tuple[str, str], ...],
                                                              tuple[tuple[str, str], ...]]:
    """(name, namespace, labels, annotations). Other metadata (uid, managedFields...) is ignored
    so objects exported with `kubectl get -o yaml` load as they are."""
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        errs.append(("metadata", "required" if meta is None else f"must be a mapping, got {_type(meta)}"))
        return "", "", (), ()
    name = _str(meta.get("name"), "metadata.name", errs, required=True) or ""
    if name:
        _check_name(name, "metadata.name", errs, label=kind == "Namespace")
    namespace = ""
    if kind in _CLUSTER_SCOPED:
        if meta.get("namespace") is not None:
            errs.append(("metadata.namespace", f"must not be set: {kind} is cluster scoped"))
    else:
        namespace = _str(meta.get("namespace"), "metadata.namespace", errs) or "default"
        _check_name(namespace, "metadata.namespace", errs, label=True)
    labels = _labels(meta.get("labels"), "metadata.labels", errs)
    annotations = _labels(meta.get("annotations"), "metadata.annotations", errs, values=False)
    return name, namespace, labels, annotations


def _namespace(doc: dict[Any, Any], errs: Errs) -> Namespace:
    name, _, labels, annotations = _meta(doc, "Namespace", errs)
    # The API server labels every Namespace with its own name; selectors rely on it.
    auto = "kubernetes.io/metadata.name"
    given = dict(labels).get(auto)
    if given is not None and given != name:
        errs.append((f"metadata.labels.{auto}", f"must equal the Namespace name {name!r}; got {given!r}"))
    labels = tuple(sorted({**dict(labels), auto: name}.items()))
    return Namespace(name=name, labels=labels, annotations=annotations)


def _pod(doc: dict[Any, Any], errs: Errs) -> Pod:
    name, namespace, labels, _ = _meta(doc, "Pod", errs)
    ports: list[ContainerPort] = []
    spec = doc.get("spec")
    if spec is not None and not isinstance(spec, dict):
        errs.append(("spec", f"must be a mapping, got {_type(spec)}"))
        spec = None
    # Only container ports are read; the rest of a Pod spec does not affect policy.
    for ci, container in _items((spec or {}).get("containers"), "spec.containers", errs):
        cpath = f"spec.containers[{ci}]"
        if not isinstance(container, dict):
            errs.append((cpath, f"must be a mapping, got {_type(container)}"))
            continue
        for pi, port in _items(container.get("ports"), f"{cpath}.ports", errs):
            ppath = f"{cpath}.ports[{pi}]"
            if not isinstance(port, dict):
                errs.append((ppath, f"must be a mapping, got {_type(port)}"))
                continue
            pname = _str(port.get("name"), f"{ppath}.name", errs) or ""
            if pname:
                _check_port_name(pname, f"{ppath}.name", errs)
                if any(p.name == pname for p in ports):
                    errs.append((f"{ppath}.name", f"duplicate port name {pname!r}"))
            number = _int(port.get("containerPort"), f"{ppath}.containerPort", errs, 1, 65535, required=True)
            proto = _protocol(port.get("protocol"), f"{ppath}.protocol", errs)
            if number is not None:
                ports.append(ContainerPort(name=pname, port=number, protocol=proto))
    return Pod(namespace=namespace, name=name, labels=labels, ports=tuple(ports))


def _tier(doc: dict[Any, Any], errs: Errs) -> Tier:
    name, *_ = _meta(doc, "Tier", errs)
    if name in STANDARD_TIERS:
        errs.append(("metadata.name", f"{name!r} is reserved for a standard tier"))
    spec = _fields(doc.get("spec"), "spec", errs, {"priority", "description"}, required=("priority",)) or {}
    priority = _int(spec.get("priority"), "spec.priority", errs, 1, 255)
    _str(spec.get("description"), "spec.description", errs)
    standard = {p: n for n, p in STANDARD_TIERS.items()}
    if priority in standard:
        errs.append(("spec.priority", f"{priority} is reserved by the standard tier {standard[priority]}"))
    elif priority in RESERVED_TIER_PRIORITIES:
        errs.append(("spec.priority", f"{priority} is reserved by Antrea "
                                      f"({', '.join(map(str, sorted(RESERVED_TIER_PRIORITIES)))})"))
    return Tier(name=name, priority=priority or 0)


def _k8s_policy(doc: dict[Any, Any], errs: Errs) -> Policy:
    name, namespace, *_ = _meta(doc, PolicyKind.K8S.value, errs)
    spec = _fields(doc.get("spec"), "spec", errs, {"podSelector", "policyTypes", "ingress", "egress"},
                   required=("podSelector",)) or {}
    selector = _selector(spec.get("podSelector"), "spec.podSelector", errs)
    types: set[Direction] = set()
    for i, t in _items(spec.get("policyTypes"), "spec.policyTypes", errs):
        if t in ("Ingress", "Egress"):
            types.add(Direction(t.lower()))
        else:
            errs.append((f"spec.policyTypes[{i}]", f"must be one of Ingress, Egress; got {_show(t)}"))
    if not spec.get("policyTypes"):
        # Kubernetes' defaulting: Ingress always, Egress only when there are egress rules.
        types = {Direction.INGRESS} | ({Direction.EGRESS} if spec.get("egress") else set())
    rules: list[Rule] = []
    for direction in Direction:
        for i, raw in _items(spec.get(direction.value), f"spec.{direction.value}", errs):
            rule = _rule(raw, f"spec.{direction.value}[{i}]", errs, direction, i, None)
            # Rules of a direction the policy does not isolate have no effect in Kubernetes.
            if rule is not None and direction in types:
                rules.append(rule)
    return Policy(kind=PolicyKind.K8S, name=name, namespace=namespace,
                  applied_to=(AppliedTo(pod_selector=selector),) if selector else (),
                  rules=tuple(rules), isolates=tuple(d for d in Direction if d in types))


def _antrea_policy(doc: dict[Any, Any], errs: Errs, kind: PolicyKind) -> Policy:
    name, namespace, *_ = _meta(doc, kind.value, errs)
    spec = _fields(doc.get("spec"), "spec", errs, {"tier", "priority", "appliedTo", "ingress", "egress"},
                   required=("priority",))
    if spec is None:
        return Policy(kind=kind, name=name)
    tier = _str(spec.get("tier"), "spec.tier", errs) or DEFAULT_TIER
    tier = _LEGACY_TIER_NAMES.get(tier, tier)
    priority = _number(spec.get("priority"), "spec.priority", errs, 1.0, 10000.0)
    applied_to = _applied_to(spec.get("appliedTo"), "spec.appliedTo", errs, kind)
    rules: list[Rule] = []
    rule_paths: list[str] = []
    for direction in Direction:
        for i, raw in _items(spec.get(direction.value), f"spec.{direction.value}", errs):
            path = f"spec.{direction.value}[{i}]"
            rule = _rule(raw, path, errs, direction, i, kind)
            if rule is not None:
                rules.append(rule)
                rule_paths.append(path)
    names: set[str] = set()
    for rule, path in zip(rules, rule_paths):
        if rule.name in names:
            errs.append((f"{path}.name", f"duplicate rule name {rule.name!r}; rule names must be unique"))
        names.add(rule.name)
        if rule.action is Action.PASS and tier == BASELINE_TIER:
            errs.append((f"{path}.action", "Pass is not allowed in the baseline tier"))
    _check_applied_to_placement(applied_to, rules, rule_paths, errs)
    return Policy(kind=kind, name=name, namespace=namespace, tier=tier, priority=priority or 0.0,
                  applied_to=applied_to, rules=tuple(rules))


def _check_applied_to_placement(applied_to: tuple[AppliedTo, ...], rules: list[Rule],
                                rule_paths: list[str], errs: Errs) -> None:
    """Antrea's rule: appliedTo is set on the policy, or on every rule, never both."""
    with_own = [p for r, p in zip(rules, rule_paths) if r.applied_to]
    if applied_to and with_own:
        errs.append(("spec.appliedTo", f"must not be set when rules set appliedTo ({with_own[0]}.appliedTo)"))
    elif with_own:
        for rule, path in zip(rules, rule_paths):
            if not rule.applied_to:
                errs.append((f"{path}.appliedTo", "required: other rules set appliedTo, so every rule must"))
    elif not applied_to:
        errs.append(("spec.appliedTo", "required (or set appliedTo on every rule)"))


_BUILDERS: dict[str, Callable[[dict[Any, Any], Errs], Any]] = {
    "Namespace": _namespace,
    "Pod": _pod,
    "Tier": _tier,
    PolicyKind.K8S.value: _k8s_policy,
    PolicyKind.ACNP.value: lambda doc, errs: _antrea_policy(doc, errs, PolicyKind.ACNP),
    PolicyKind.ANP.value: lambda doc, errs: _antrea_policy(doc, errs, PolicyKind.ANP),
}


# --- rules, peers, selectors ------------------------------------------------------------------

def _rule(raw: Any, path: str, errs: Errs, direction: Direction, index: int,
          kind: PolicyKind | None) -> Rule | None:
    """One ingress/egress rule; kind None = Kubernetes (allow-only, no Antrea fields)."""
    peer_key = "from" if direction is Direction.INGRESS else "to"
    allowed = {peer_key, "ports"}
    if kind is not None:
        allowed |= {"action", "name", "enableLogging", "logLabel", "appliedTo"}
    d = _fields(raw if raw is not None else {}, path, errs, allowed,
                required=("action",) if kind is not None else ())
    if d is None:
        return None
    action = Action.ALLOW
    if kind is not None and d.get("action") is not None:
        choices = [a.value for a in Action]
        if d["action"] in choices:
            action = Action(d["action"])
        else:
            errs.append((f"{path}.action", f"must be one of {', '.join(choices)}; got {_show(d['action'])}"))
    name = _str(d.get("name"), f"{path}.name", errs) or f"{direction.value}-{index}"
    logging = d.get("enableLogging", False)
    if logging is not None and not isinstance(logging, bool):
        errs.append((f"{path}.enableLogging", f"must be a boolean, got {_type(logging)}"))
    log_label = _str(d.get("logLabel"), f"{path}.logLabel", errs) or ""
    if len(log_label) > 63 or not _LOG_LABEL_RE.fullmatch(log_label):
        errs.append((f"{path}.logLabel", f"must be at most 63 characters of [A-Za-z0-9._-]; got {_show(log_label)}"))
    applied_to = _applied_to(d.get("appliedTo"), f"{path}.appliedTo", errs, kind) if kind else ()
    peers = [_peer(p, f"{path}.{peer_key}[{i}]", errs, antrea=kind is not None)
             for i, p in _items(d.get(peer_key), f"{path}.{peer_key}", errs)]
    ports = [_port(p, f"{path}.ports[{i}]", errs) for i, p in _items(d.get("ports"), f"{path}.ports", errs)]
    return Rule(direction=direction, action=action, peers=tuple(p for p in peers if p),
                ports=tuple(p for p in ports if p), name=name, enable_logging=logging is True,
                log_label=log_label, applied_to=applied_to)


def _applied_to(raw: Any, path: str, errs: Errs, kind: PolicyKind | None) -> tuple[AppliedTo, ...]:
    out: list[AppliedTo] = []
    for i, item in _items(raw, path, errs):
        p = f"{path}[{i}]"
        d = _fields(item, p, errs, {"podSelector", "namespaceSelector"})
        if d is None:
            continue
        if kind is PolicyKind.ANP and d.get("namespaceSelector") is not None:
            errs.append((f"{p}.namespaceSelector", "not allowed in an Antrea NetworkPolicy, which applies "
                                                   "only in its own Namespace"))
        if d.get("podSelector") is None and d.get("namespaceSelector") is None and len(d) == len(item):
            errs.append((p, "must set podSelector or namespaceSelector"))
        out.append(AppliedTo(pod_selector=_selector(d.get("podSelector"), f"{p}.podSelector", errs),
                             namespace_selector=_selector(d.get("namespaceSelector"),
                                                          f"{p}.namespaceSelector", errs)))
    return tuple(out)


def _peer(raw: Any, path: str, errs: Errs, antrea: bool) -> Peer | None:
    fields = {"podSelector", "namespaceSelector", "ipBlock"} | ({"namespaces"} if antrea else set())
    d = _fields(raw, path, errs, fields)
    if d is None:
        return None
    present = sorted(k for k, v in d.items() if v is not None)
    if not present and len(d) == len(raw):  # a misspelt field was already reported
        errs.append((path, f"must set one of {', '.join(sorted(fields))}"))
    if "ipBlock" in present and len(present) > 1:
        errs.append((path, f"ipBlock cannot be combined with {', '.join(k for k in present if k != 'ipBlock')}"))
    if "namespaces" in present and "namespaceSelector" in present:
        errs.append((path, "namespaces and namespaceSelector cannot both be set"))
    ns_self = False
    if "namespaces" in present:
        nd = _fields(d["namespaces"], f"{path}.namespaces", errs, {"match"}, required=("match",))
        if nd and nd.get("match") is not None and nd["match"] != "Self":
            errs.append((f"{path}.namespaces.match", f"must be Self; got {_show(nd['match'])}"))
        ns_self = True
    return Peer(pod_selector=_selector(d.get("podSelector"), f"{path}.podSelector", errs),
                namespace_selector=_selector(d.get("namespaceSelector"), f"{path}.namespaceSelector", errs),
                ip_block=_ip_block(d.get("ipBlock"), f"{path}.ipBlock", errs), namespace_self=ns_self)


def _selector(raw: Any, path: str, errs: Errs) -> LabelSelector | None:
    """None when absent; `{}` is the empty selector that matches everything."""
    if raw is None:
        return None
    d = _fields(raw, path, errs, {"matchLabels", "matchExpressions"})
    if d is None:
        return None
    exprs: list[Requirement] = []
    for i, e in _items(d.get("matchExpressions"), f"{path}.matchExpressions", errs):
        p = f"{path}.matchExpressions[{i}]"
        ed = _fields(e, p, errs, {"key", "operator", "values"}, required=("key", "operator"))
        if ed is None:
            continue
        key = _str(ed.get("key"), f"{p}.key", errs)
        if key is not None and (problem := _label_key_problem(key)):
            errs.append((f"{p}.key", problem))
        op = ed.get("operator")
        values: list[str] = []
        for j, v in _items(ed.get("values"), f"{p}.values", errs):
            if isinstance(v, str) and not _label_value_problem(v):
                values.append(v)
            else:
                errs.append((f"{p}.values[{j}]", _label_value_problem(v) or ""))
        if op in ("In", "NotIn") and not ed.get("values"):
            errs.append((f"{p}.values", f"must be non-empty for operator {op}"))
        elif op in ("Exists", "DoesNotExist") and ed.get("values"):
            errs.append((f"{p}.values", f"must be empty for operator {op}"))
        elif op is not None and op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            errs.append((f"{p}.operator", f"must be one of In, NotIn, Exists, DoesNotExist; got {_show(op)}"))
        if key is not None and isinstance(op, str):
            exprs.append(Requirement(key=key, operator=op, values=tuple(sorted(set(values)))))
    return LabelSelector(match_labels=_labels(d.get("matchLabels"), f"{path}.matchLabels", errs),
                         match_expressions=tuple(sorted(exprs, key=lambda r: (r.key, r.operator, r.values))))


def _ip_block(raw: Any, path: str, errs: Errs) -> IPBlock | None:
    if raw is None:
        return None
    d = _fields(raw, path, errs, {"cidr", "except"}, required=("cidr",))
    if d is None:
        return None
    net = _cidr(d["cidr"], f"{path}.cidr", errs) if d.get("cidr") is not None else None
    excepts = []
    for i, e in _items(d.get("except"), f"{path}.except", errs):
        p = f"{path}.except[{i}]"
        sub = _cidr(e, p, errs)
        if sub is None or net is None:
            continue
        if sub.version != net.version:
            errs.append((p, f"{sub} is not of the same address family as cidr {net}"))
        elif not (sub.subnet_of(net) and sub.prefixlen > net.prefixlen):  # type: ignore[arg-type]
            errs.append((p, f"{sub} is not a strict subset of cidr {net}"))
        else:
            excepts.append(sub)
    if net is None:
        return None
    excepts.sort(key=lambda n: (n.network_address, n.prefixlen))
    return IPBlock(cidr=str(net), except_=tuple(dict.fromkeys(str(n) for n in excepts)))


def _cidr(raw: Any, path: str, errs: Errs) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    text = _str(raw, path, errs, required=True)
    if text is None:
        return None
    try:
        if "/" not in text:
            raise ValueError("no prefix length")
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        errs.append((path, f"must be a CIDR like 10.0.0.0/24 or fd00::/64; got {_show(text)}"))
        return None


def _port(raw: Any, path: str, errs: Errs) -> PortSpec | None:
    d = _fields(raw if raw is not None else {}, path, errs, {"protocol", "port", "endPort"})
    if d is None:
        return None
    proto = _protocol(d.get("protocol"), f"{path}.protocol", errs)
    port = d.get("port")
    if isinstance(port, str):
        _check_port_name(port, f"{path}.port", errs)
    elif port is not None:
        port = _int(port, f"{path}.port", errs, 1, 65535)
    end = _int(d.get("endPort"), f"{path}.endPort", errs, 1, 65535)
    if d.get("endPort") is not None:
        if d.get("port") is None:
            errs.append((f"{path}.endPort", "requires port"))
        elif isinstance(d.get("port"), str):
            errs.append((f"{path}.endPort", f"requires a numeric port, not the named port {_show(d['port'])}"))
        elif isinstance(port, int) and end is not None and end < port:
            errs.append((f"{path}.endPort", f"must be >= port {port}; got {end}"))
    return PortSpec(protocol=proto, port=port, end_port=end)


# --- scalars ----------------------------------------------------------------------------------

def _fields(raw: Any, path: str, errs: Errs, allowed: set[str],
            required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The mapping at `path`; unknown keys are errors so a typo never widens a policy."""
    if not isinstance(raw, dict):
        # A null list item is a wrong value, not a missing field.
        missing = raw is None and not path.endswith("]")
        errs.append((path, "required" if missing else f"must be a mapping, got {_type(raw)}"))
        return None
    for key in raw:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            errs.append((_join(path, str(key)), f"unknown field{hint}; expected one of {', '.join(sorted(allowed))}"))
    for key in required:
        if raw.get(key) is None:
            errs.append((_join(path, key), "required"))
    return {k: v for k, v in raw.items() if k in allowed}


def _items(raw: Any, path: str, errs: Errs) -> list[tuple[int, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errs.append((path, f"must be a list, got {_type(raw)}"))
        return []
    return list(enumerate(raw))


def _str(raw: Any, path: str, errs: Errs, required: bool = False) -> str | None:
    if isinstance(raw, str):
        return raw
    if raw is not None:
        errs.append((path, f"must be a string, got {_type(raw)}"))
    elif required:
        errs.append((path, "required"))
    return None


def _int(raw: Any, path: str, errs: Errs, lo: int, hi: int, required: bool = False) -> int | None:
    if raw is None:
        if required:
            errs.append((path, "required"))
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        errs.append((path, f"must be an integer, got {_type(raw)}"))
        return None
    if not lo <= raw <= hi:
        errs.append((path, f"must be {lo}..{hi}; got {_show(raw)}"))
        return None
    return raw


def _number(raw: Any, path: str, errs: Errs, lo: float, hi: float) -> float | None:
    if raw is None:
        return None  # required-ness reported by _fields
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        errs.append((path, f"must be a number, got {_type(raw)}"))
        return None
    if not lo <= raw <= hi:  # also rejects NaN
        errs.append((path, f"must be {lo}..{hi}; got {_show(raw)}"))
        return None
    return float(raw)


def _protocol(raw: Any, path: str, errs: Errs) -> str:
    if raw is None:
        return "TCP"
    if raw not in PROTOCOLS:
        errs.append((path, f"must be one of {', '.join(PROTOCOLS)}; got {_show(raw)}"))
        return "TCP"
    return str(raw)


def _labels(raw: Any, path: str, errs: Errs, values: bool = True) -> tuple[tuple[str, str], ...]:
    """A label (or, values=False, annotation) map as sorted pairs."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        errs.append((path, f"must be a mapping, got {_type(raw)}"))
        return ()
    out: list[tuple[str, str]] = []
    for key, value in raw.items():
        p = _join(path, str(key))
        problem = _label_key_problem(key) or (
            _label_value_problem(value) if values else
            None if isinstance(value, str) else f"must be a string, got {_type(value)}")
        if problem:
            errs.append((p, problem))
        else:
            out.append((key, value))
    return tuple(sorted(out))


def _label_key_problem(key: Any) -> str | None:
    if not isinstance(key, str):
        return f"label key must be a string, got {_type(key)}"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN_RE.fullmatch(prefix)):
        return f"invalid label key {_show(key)}: the prefix must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_VALUE_RE.fullmatch(name):
        return (f"invalid label key {_show(key)}: the name must be 1-63 characters of [A-Za-z0-9._-], "
                "starting and ending alphanumeric")
    return None


def _label_value_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"label value must be a string, got {_type(value)}"
    if len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
        return (f"invalid label value {_show(value)}: must be at most 63 characters of [A-Za-z0-9._-], "
                "starting and ending alphanumeric")
    return None


def _check_name(name: str, path: str, errs: Errs, label: bool) -> None:
    if label and (len(name) > 63 or not _DNS_LABEL_RE.fullmatch(name)):
        errs.append((path, f"must be a DNS-1123 label (at most 63 characters: lowercase letters, digits "
                           f"and '-', starting and ending alphanumeric); got {_show(name)}"))
    elif not label and (len(name) > 253 or not _SUBDOMAIN_RE.fullmatch(name)):
        errs.append((path, f"must be a DNS-1123 subdomain (at most 253 characters: lowercase letters, "
                           f"digits, '-' and '.', starting and ending alphanumeric); got {_show(name)}"))


def _check_port_name(name: str, path: str, errs: Errs) -> None:
    if (len(name) > 15 or not _PORT_NAME_RE.fullmatch(name) or "--" in name
            or not any(c.isalpha() for c in name)):
        errs.append((path, f"named port {_show(name)} must be at most 15 characters of [a-z0-9-] with at "
                           "least one letter and no leading, trailing or double '-'"))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_TYPE_NAMES = {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
               float: "number", type(None): "null"}


def _type(value: Any) -> str:
    """YAML's name for a value's type, as users see it in their manifests."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """repr() for messages, bounded: manifests can hold huge or odd values."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. ints beyond Python's str conversion limit
        return f"<{_type(value)}>"
    return text if len(text) <= 80 else text[:77] + "..."
