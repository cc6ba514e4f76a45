"""Manifest loading: Kubernetes and Antrea YAML/JSON objects validated into the policy model, all or nothing.

Documents are read and dispatched by kind here, and objects checked against each
other; the checks of one field's value live in validation.py.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from policy_agent.errors import AgentError
from policy_agent.policy import documents
from policy_agent.policy.kinds import CLUSTER_SCOPED, NAMESPACE, POD, SERVED, TIER
from policy_agent.policy.model import (
    BASELINE_TIER, DEFAULT_TIER, STANDARD_TIERS, Action, AppliedTo, ContainerPort, Direction,
    Namespace, Pod, Policy, PolicyKind, Rule, Tier,
)
from policy_agent.policy.validation import (
    Errs, applied_to_list, capacity_problems, check_log_label, check_name, check_port_name, fields_of, integer,
    items_of, label_map, label_selector, number, peer, port_spec, protocol, rule_count_problem, rule_protocol, show,
    string, type_name,
)

# Antrea reserves these Tier priorities besides the standard tiers' own.
RESERVED_TIER_PRIORITIES = frozenset({251, 252, 254, 255})
# Policies written for old Antrea releases name the standard tiers in CamelCase.
_LEGACY_TIER_NAMES = {"Emergency": "emergency", "SecurityOps": "securityops", "NetworkOps": "networkops",
                      "Platform": "platform", "Application": "application", "Baseline": "baseline"}


class ManifestError(AgentError):
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


@dataclass(frozen=True)
class Loaded:
    """A validated set and the documents it came from (Lists flattened), for the applied store."""

    objects: ObjectSet
    documents: tuple[dict[str, Any], ...]


def read_text(text: str, source: str, known_tiers: Iterable[str] = ()) -> Loaded:
    """Parse (documents.parse_text) and validate every document of `text` as one set. Policies may
    name a Tier of the set or one of `known_tiers` (those a running agent already has)."""
    problems: list[str] = []
    docs = documents.parse_text(text, source, problems)
    return _load([(source, docs)], problems, known_tiers)


def load_text(text: str, source: str, known_tiers: Iterable[str] = ()) -> ObjectSet:
    """Load every document of a multi-document YAML (or JSON) text as one set (see read_text)."""
    return read_text(text, source, known_tiers).objects


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
            too_big = documents.size_problem(file.stat().st_size, file.name)
            if too_big:
                problems.append(too_big)
                continue
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{file.name}: cannot read: {exc}")
            continue
        sources.append((file.name, documents.parse_text(text, file.name, problems)))
    return _load(sources, problems).objects


def load_documents(docs: Iterable[Any], source: str) -> ObjectSet:
    """Validate already-parsed documents (None entries are empty documents and skipped)."""
    problems: list[str] = []
    checked = [documents.checked(doc, f"{source}#{i}", problems) for i, doc in enumerate(docs, start=1)]
    return _load([(source, checked)], problems).objects


# --- sets -------------------------------------------------------------------------------------

def _load(sources: list[tuple[str, list[Any]]], problems: list[str], known_tiers: Iterable[str] = ()) -> Loaded:
    built: list[tuple[str, Any, dict[str, Any]]] = []  # (header, model object, document)
    for source, docs in sources:
        for index, doc in enumerate(docs, start=1):
            if doc is None:
                continue
            where = f"{source}#{index}"
            if isinstance(doc, dict) and doc.get("kind") == "List":
                errs: Errs = []
                d = fields_of(doc, "", errs, {"apiVersion", "kind", "metadata", "items"}) or {}
                items = items_of(d.get("items"), "items", errs)
                problems += _format(f"List ({where})", errs)
                for i, item in items:
                    _load_object(item, f"{where}.items[{i}]", built, problems)
            else:
                _load_object(doc, where, built, problems)
    problems += _cross_check([(header, obj) for header, obj, _ in built], known_tiers)
    if problems:
        raise ManifestError(problems)
    objs = [obj for _, obj, _ in built]
    return Loaded(ObjectSet(namespaces=tuple(o for o in objs if isinstance(o, Namespace)),
                            pods=tuple(o for o in objs if isinstance(o, Pod)),
                            tiers=tuple(o for o in objs if isinstance(o, Tier)),
                            policies=tuple(o for o in objs if isinstance(o, Policy))),
                  tuple(doc for _, _, doc in built))


def _load_object(doc: Any, where: str, built: list[tuple[str, Any, dict[str, Any]]], problems: list[str]) -> None:
    if not isinstance(doc, dict):
        problems.append(f"Document ({where}): must be a mapping with apiVersion and kind, got {type_name(doc)}")
        return
    api, raw_kind = doc.get("apiVersion"), doc.get("kind")
    kind = SERVED.get((api, raw_kind)) if isinstance(api, str) and isinstance(raw_kind, str) else None
    header = documents.describe(doc, where)
    errs: Errs = []
    obj: Any = None
    if kind is None:
        _kind_errors(doc, errs)
    else:
        fields_of(doc, "", errs, {"apiVersion", "kind", "metadata", "spec", "status"})
        obj = _BUILDERS[kind](doc, errs)
    if errs:
        problems += _format(header, errs)
    elif obj is not None:
        built.append((header, obj, doc))


def _kind_errors(doc: dict[Any, Any], errs: Errs) -> None:
    kind, api = doc.get("kind"), doc.get("apiVersion")
    kinds = sorted({k for _, k in SERVED} | {"List"})
    if kind is None:
        errs.append(("kind", "required"))
    elif kind == "List":
        errs.append(("kind", "a List cannot contain another List"))
    elif kind not in kinds:
        errs.append(("kind", f"unknown kind {show(kind)}; expected one of {', '.join(kinds)}"))
    else:
        apis = [a for a, k in SERVED if k == kind]
        errs.append(("apiVersion", f"{show(api)} does not serve kind {kind}; expected one of {', '.join(apis)}"))


def _format(header: str, errs: Errs) -> list[str]:
    return [f"{header}: {path}: {reason}" if path else f"{header}: {reason}" for path, reason in errs]


def _cross_check(built: list[tuple[str, Any]], known_tiers: Iterable[str] = ()) -> list[str]:
    """Checks that need the whole set: duplicates, Tier priorities, Tier references, priority capacity."""
    problems: list[str] = []
    seen: dict[tuple[str, str, str], str] = {}
    tier_priority: dict[int, str] = {}
    tiers = {t.name for _, t in built if isinstance(t, Tier)} | set(known_tiers)
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
                            f"({', '.join(STANDARD_TIERS)}), a Tier in this set or one applied earlier")
    problems += capacity_problems((header, obj) for header, obj in built if isinstance(obj, Policy))
    return problems


def _key(obj: Any) -> tuple[str, str, str]:
    if isinstance(obj, Policy):
        return obj.key
    if isinstance(obj, Pod):
        return (POD, obj.namespace, obj.name)
    return (type(obj).__name__, "", obj.name)


# --- objects ----------------------------------------------------------------------------------

def _meta(doc: dict[Any, Any], kind: str, errs: Errs) -> tuple[str, str, tuple[tuple[str, str], ...],
                                                              tuple[tuple[str, str], ...]]:
    """(name, namespace, labels, annotations). Other metadata (uid, managedFields...) is ignored
    so objects exported with `kubectl get -o yaml` load as they are."""
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        errs.append(("metadata", "required" if meta is None else f"must be a mapping, got {type_name(meta)}"))
        return "", "", (), ()
    name = string(meta.get("name"), "metadata.name", errs, required=True) or ""
    if name:
        check_name(name, "metadata.name", errs, label=kind == NAMESPACE)
    namespace = ""
    if kind in CLUSTER_SCOPED:
        if meta.get("namespace") is not None:
            errs.append(("metadata.namespace", f"must not be set: {kind} is cluster scoped"))
    else:
        namespace = string(meta.get("namespace"), "metadata.namespace", errs) or "default"
        check_name(namespace, "metadata.namespace", errs, label=True)
    labels = label_map(meta.get("labels"), "metadata.labels", errs)
    annotations = label_map(meta.get("annotations"), "metadata.annotations", errs, values=False)
    return name, namespace, labels, annotations


def _namespace(doc: dict[Any, Any], errs: Errs) -> Namespace:
    name, _, labels, annotations = _meta(doc, NAMESPACE, errs)
    # The API server labels every Namespace with its own name; selectors rely on it.
    auto = "kubernetes.io/metadata.name"
    given = dict(labels).get(auto)
    if given is not None and given != name:
        errs.append((f"metadata.labels.{auto}", f"must equal the Namespace name {name!r}; got {given!r}"))
    labels = tuple(sorted({**dict(labels), auto: name}.items()))
    return Namespace(name=name, labels=labels, annotations=annotations)


def _pod(doc: dict[Any, Any], errs: Errs) -> Pod:
    name, namespace, labels, _ = _meta(doc, POD, errs)
    ports: list[ContainerPort] = []
    spec = doc.get("spec")
    if spec is not None and not isinstance(spec, dict):
        errs.append(("spec", f"must be a mapping, got {type_name(spec)}"))
        spec = None
    # Only container ports are read; the rest of a Pod spec does not affect policy.
    for ci, container in items_of((spec or {}).get("containers"), "spec.containers", errs):
        cpath = f"spec.containers[{ci}]"
        if not isinstance(container, dict):
            errs.append((cpath, f"must be a mapping, got {type_name(container)}"))
            continue
        for pi, port in items_of(container.get("ports"), f"{cpath}.ports", errs):
            ppath = f"{cpath}.ports[{pi}]"
            if not isinstance(port, dict):
                errs.append((ppath, f"must be a mapping, got {type_name(port)}"))
                continue
            pname = string(port.get("name"), f"{ppath}.name", errs) or ""
            if pname:
                check_port_name(pname, f"{ppath}.name", errs)
                if any(p.name == pname for p in ports):
                    errs.append((f"{ppath}.name", f"duplicate port name {pname!r}"))
            port_number = integer(port.get("containerPort"), f"{ppath}.containerPort", errs, 1, 65535,
                                  required=True)
            proto = protocol(port.get("protocol"), f"{ppath}.protocol", errs)
            if port_number is not None:
                ports.append(ContainerPort(name=pname, port=port_number, protocol=proto))
    node = string((spec or {}).get("nodeName"), "spec.nodeName", errs) or ""
    meta = doc.get("metadata")
    terminating = isinstance(meta, dict) and meta.get("deletionTimestamp") not in (None, "")
    return Pod(namespace=namespace, name=name, labels=labels, ports=tuple(ports), ips=pod_ips(doc, errs),
               node=node, terminating=terminating)


def pod_ips(doc: dict[Any, Any], errs: Errs) -> tuple[str, ...]:
    """The IPv4 addresses of status.podIPs (else status.podIP), as the API server reports them."""
    status = doc.get("status")
    if status is None:
        return ()
    if not isinstance(status, dict):
        errs.append(("status", f"must be a mapping, got {type_name(status)}"))
        return ()
    given: list[tuple[str, Any]] = [(f"status.podIPs[{i}].ip", e.get("ip") if isinstance(e, dict) else e)
                                    for i, e in items_of(status.get("podIPs"), "status.podIPs", errs)]
    if not given and status.get("podIP") not in (None, ""):
        given = [("status.podIP", status.get("podIP"))]
    ips: list[str] = []
    for path, value in given:
        try:
            ip = ipaddress.ip_address(value if isinstance(value, str) else "")
        except ValueError:
            errs.append((path, f"must be an IP address, got {show(value)}"))
            continue
        if ip.version == 4 and str(ip) not in ips:
            ips.append(str(ip))
    return tuple(ips)


def _tier(doc: dict[Any, Any], errs: Errs) -> Tier:
    name, *_ = _meta(doc, TIER, errs)
    if name in STANDARD_TIERS:
        errs.append(("metadata.name", f"{name!r} is reserved for a standard tier"))
    spec = fields_of(doc.get("spec"), "spec", errs, {"priority", "description"}, required=("priority",)) or {}
    priority = integer(spec.get("priority"), "spec.priority", errs, 1, 255)
    string(spec.get("description"), "spec.description", errs)
    standard = {p: n for n, p in STANDARD_TIERS.items()}
    if priority in standard:
        errs.append(("spec.priority", f"{priority} is reserved by the standard tier {standard[priority]}"))
    elif priority in RESERVED_TIER_PRIORITIES:
        errs.append(("spec.priority", f"{priority} is reserved by Antrea "
                                      f"({', '.join(map(str, sorted(RESERVED_TIER_PRIORITIES)))})"))
    return Tier(name=name, priority=priority or 0)


def _k8s_policy(doc: dict[Any, Any], errs: Errs) -> Policy:
    name, namespace, *_ = _meta(doc, PolicyKind.K8S.value, errs)
    spec = fields_of(doc.get("spec"), "spec", errs, {"podSelector", "policyTypes", "ingress", "egress"},
                     required=("podSelector",)) or {}
    selector = label_selector(spec.get("podSelector"), "spec.podSelector", errs)
    types: set[Direction] = set()
    for i, t in items_of(spec.get("policyTypes"), "spec.policyTypes", errs):
        if t in ("Ingress", "Egress"):
            types.add(Direction(t.lower()))
        else:
            errs.append((f"spec.policyTypes[{i}]", f"must be one of Ingress, Egress; got {show(t)}"))
    if not spec.get("policyTypes"):
        # Kubernetes' defaulting: Ingress always, Egress only when there are egress rules.
        types = {Direction.INGRESS} | ({Direction.EGRESS} if spec.get("egress") else set())
    rules: list[Rule] = []
    for direction in Direction if not rule_count_problem(spec, errs) else ():
        for i, raw in items_of(spec.get(direction.value), f"spec.{direction.value}", errs):
            rule = _rule(raw, f"spec.{direction.value}[{i}]", errs, direction, i, None)
            # Rules of a direction the policy does not isolate have no effect in Kubernetes.
            if rule is not None and direction in types:
                rules.append(rule)
    return Policy(kind=PolicyKind.K8S, name=name, namespace=namespace,
                  applied_to=(AppliedTo(pod_selector=selector),) if selector else (),
                  rules=tuple(rules), isolates=tuple(d for d in Direction if d in types))


def _antrea_policy(doc: dict[Any, Any], errs: Errs, kind: PolicyKind) -> Policy:
    name, namespace, *_ = _meta(doc, kind.value, errs)
    spec = fields_of(doc.get("spec"), "spec", errs, {"tier", "priority", "appliedTo", "ingress", "egress"},
                     required=("priority",))
    if spec is None:
        return Policy(kind=kind, name=name)
    tier = string(spec.get("tier"), "spec.tier", errs) or DEFAULT_TIER
    tier = _LEGACY_TIER_NAMES.get(tier, tier)
    priority = number(spec.get("priority"), "spec.priority", errs, 1.0, 10000.0)
    applied_to = applied_to_list(spec.get("appliedTo"), "spec.appliedTo", errs, kind)
    rules: list[Rule] = []
    rule_paths: list[str] = []
    for direction in Direction if not rule_count_problem(spec, errs) else ():
        for i, raw in items_of(spec.get(direction.value), f"spec.{direction.value}", errs):
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
    NAMESPACE: _namespace,
    POD: _pod,
    TIER: _tier,
    PolicyKind.K8S.value: _k8s_policy,
    PolicyKind.ACNP.value: lambda doc, errs: _antrea_policy(doc, errs, PolicyKind.ACNP),
    PolicyKind.ANP.value: lambda doc, errs: _antrea_policy(doc, errs, PolicyKind.ANP),
}


# --- rules ------------------------------------------------------------------------------------

def _rule(raw: Any, path: str, errs: Errs, direction: Direction, index: int,
          kind: PolicyKind | None) -> Rule | None:
    """One ingress/egress rule; kind None = Kubernetes (allow-only, no Antrea fields)."""
    peer_key = "from" if direction is Direction.INGRESS else "to"
    allowed = {peer_key, "ports"}
    if kind is not None:
        allowed |= {"action", "name", "enableLogging", "logLabel", "appliedTo", "protocols"}
    d = fields_of(raw if raw is not None else {}, path, errs, allowed,
                  required=("action",) if kind is not None else ())
    if d is None:
        return None
    action = Action.ALLOW
    if kind is not None and d.get("action") is not None:
        choices = [a.value for a in Action]
        if d["action"] in choices:
            action = Action(d["action"])
        else:
            errs.append((f"{path}.action", f"must be one of {', '.join(choices)}; got {show(d['action'])}"))
    name = string(d.get("name"), f"{path}.name", errs) or f"{direction.value}-{index}"
    logging = d.get("enableLogging", False)
    if logging is not None and not isinstance(logging, bool):
        errs.append((f"{path}.enableLogging", f"must be a boolean, got {type_name(logging)}"))
    log_label = string(d.get("logLabel"), f"{path}.logLabel", errs) or ""
    check_log_label(log_label, f"{path}.logLabel", errs)
    applied_to = applied_to_list(d.get("appliedTo"), f"{path}.appliedTo", errs, kind) if kind else ()
    peers = [peer(p, f"{path}.{peer_key}[{i}]", errs, antrea=kind is not None)
             for i, p in items_of(d.get(peer_key), f"{path}.{peer_key}", errs)]
    ports = [port_spec(p, f"{path}.ports[{i}]", errs) for i, p in items_of(d.get("ports"), f"{path}.ports", errs)]
    protocols = [rule_protocol(p, f"{path}.protocols[{i}]", errs)
                 for i, p in items_of(d.get("protocols"), f"{path}.protocols", errs)]
    return Rule(direction=direction, action=action, peers=tuple(p for p in peers if p),
                ports=tuple(p for p in ports if p), protocols=tuple(dict.fromkeys(p for p in protocols if p)),
                name=name, enable_logging=logging is True, log_label=log_label, applied_to=applied_to)
