"""What is in force, as `npaudit get` lists it: policies, rules (the ids records carry), Pods with their classes
and flows. Pure reads of the engine's state in force, answered as JSON-ready dicts by the local API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from packetin import messages
    from policy_agent.policy.incremental import Snapshot
    from policy_agent.policy.model import AppliedTo, LabelSelector, Peer, Policy, Pod, Tier
    from policy_agent.policy.rules import RuleInfo
    from policy_agent.policy.selection import Endpoint

KINDS = ("policies", "rules", "pods")


class Rules(Protocol):
    def all(self) -> list[RuleInfo]: ...


@runtime_checkable
class InventoryEngine(Protocol):
    """What `get` reads of the engine (policy_agent/engine.py)."""

    @property
    def registry(self) -> Rules: ...
    @property
    def tiers(self) -> dict[str, Tier]: ...
    @property
    def policies(self) -> dict[tuple[str, str, str], Policy]: ...
    @property
    def pods(self) -> dict[tuple[str, str], Pod]: ...
    @property
    def endpoints(self) -> dict[tuple[str, str], Endpoint]: ...
    @property
    def compiled(self) -> Snapshot | None: ...
    @property
    def round_(self) -> int: ...


def answer(engine: InventoryEngine, request: dict[str, Any]) -> dict[str, Any]:
    """The reply to a `get` request: {"kind": policies|rules|pods, "namespace"?, "name"?, "flows"?}."""
    kind = request.get("kind")
    namespace, name = request.get("namespace"), request.get("name")
    if kind not in KINDS:
        return {"ok": False, "errors": [f"kind: must be one of {', '.join(KINDS)}, got {kind!r}"]}
    for field, value in (("namespace", namespace), ("name", name)):
        if value is not None and not isinstance(value, str):
            return {"ok": False, "errors": [f"{field}: must be a string"]}
    if kind == "policies":
        items = [policy_view(p) for p in sorted(engine.policies.values(), key=lambda p: evaluation_order(engine, p))]
    elif kind == "rules":
        items = sorted((rule_view(r) for r in engine.registry.all()), key=lambda r: r["id"])
    else:
        items = [pod_view(engine, key, bool(request.get("flows"))) for key in sorted(engine.pods)]
    if namespace:
        items = [i for i in items if i.get("namespace") == namespace]
    if name:
        items = [i for i in items if name in (i.get("name"), i.get("policy_name"))]
        if not items:
            where = f" in namespace {namespace}" if namespace else ""
            return {"ok": False, "errors": [f"{kind[:-1] if kind != 'policies' else 'policy'} {name!r}{where}: "
                                            "not found"]}
    return {"ok": True, "kind": kind, "items": items}


def evaluation_order(engine: InventoryEngine, policy: Policy) -> tuple[float, float, str, str]:
    """Antrea tiers by priority, Kubernetes NetworkPolicy after the application tier and before the baseline
    (the compiler's order), then priority and name."""
    from policy_agent.policy.model import DEFAULT_TIER, STANDARD_TIERS, PolicyKind

    if policy.kind == PolicyKind.K8S:
        rank = STANDARD_TIERS[DEFAULT_TIER] + 0.5
    else:
        tier = engine.tiers.get(policy.tier or DEFAULT_TIER)
        rank = tier.priority if tier is not None else STANDARD_TIERS.get(policy.tier or DEFAULT_TIER, 0)
    return rank, policy.priority, policy.namespace, policy.name


def policy_view(policy: Policy) -> dict[str, Any]:
    kind = policy.kind
    tier = policy.tier or ("" if kind.value == "NetworkPolicy" else "application")
    return {"kind": kind.value, "namespace": policy.namespace, "name": policy.name, "ref": policy.ref,
            "tier": tier, "priority": policy.priority,
            "applied_to": [applied_text(a) for a in policy.applied_to],
            "rules": len(policy.rules), "logged": sum(r.enable_logging for r in policy.rules)}


def rule_view(rule: RuleInfo) -> dict[str, Any]:
    return {"id": rule.rule_id, "tier": rule.tier, "policy": rule.ruleset, "policy_name": rule.policy_name,
            "namespace": rule.namespace,
            "name": rule.rule_name, "direction": _value(rule.direction), "action": _value(rule.action),
            "priority": rule.priority, "logged": rule.logged, "log_label": rule.log_label}


def pod_view(engine: InventoryEngine, key: tuple[str, str], flows: bool) -> dict[str, Any]:
    pod = engine.pods[key]
    ep = engine.endpoints.get(key)
    snap = engine.compiled
    class_id = snap.classes.ids.get(key, 0) if snap is not None else 0
    groups = sorted(group_text(g) for g in snap.classes.keys.get(key, ())) if snap is not None else []
    view: dict[str, Any] = {
        "namespace": pod.namespace, "name": pod.name, "labels": dict(pod.labels),
        "ip": ep.ip if ep else (pod.ips[0] if pod.ips else ""), "ofport": ep.ofport if ep else None,
        "running": ep is not None, "class": class_id, "groups": groups}
    if flows:
        view["flows"] = [flow_text(f) for f in pod_flows(engine, key)]
    return view


def pod_flows(engine: InventoryEngine, key: tuple[str, str]) -> list[messages.FlowSpec]:
    """The flows in force that concern the Pod: its forwarding flows, the two that load its class, and every
    policy flow matching its port, its address or its class (by table, then highest priority first)."""
    from packetin.registers import REG_DST_CLASS_FIELD, REG_SRC_CLASS_FIELD
    from policy_agent.ovs import tables

    ep = engine.endpoints.get(key)
    snap = engine.compiled
    out: list[messages.FlowSpec] = []
    if ep is not None:
        out += tables.pod_flows(engine.round_, ip=ep.ip, mac=ep.mac, ofport=ep.ofport)
    if snap is None:
        return out
    class_id = snap.classes.ids.get(key, 0)
    mine: set[tuple[str, Any]] = set()
    if ep is not None:
        mine |= {("in_port", ep.ofport), ("ipv4_src", ep.ip), ("ipv4_dst", ep.ip), ("eth_src", ep.mac),
                 ("eth_dst", ep.mac)}
    if class_id:
        mine |= {(REG_SRC_CLASS_FIELD, class_id), (REG_DST_CLASS_FIELD, class_id)}
    seen = set(out)
    for flow in snap.flows():
        if flow not in seen and any(item in mine for item in flow.match):
            seen.add(flow)
            out.append(flow)
    return sorted(out, key=lambda f: (f.table, -f.priority))


def flow_text(flow: messages.FlowSpec) -> str:
    """One flow on one line, ovs-ofctl-like: table, priority, cookie, match, actions, goto."""
    actions = ",".join(_action_text(a) for a in flow.actions) or "drop"
    goto = f" goto_table:{flow.goto.table}" if flow.goto is not None else ""
    return f"cookie={flow.cookie:#x} {flow.describe()} actions={actions}{goto}"


def _action_text(action: Any) -> str:
    fields = getattr(action, "__dataclass_fields__", None)
    if not fields:
        return repr(action)
    return f"{type(action).__name__.lower()}({','.join(str(getattr(action, f)) for f in fields)})"


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


def selector_text(sel: LabelSelector | None) -> str:
    if sel is None:
        return ""
    parts = [f"{k}={v}" for k, v in sel.match_labels]
    parts += [f"{r.key} {r.operator} ({','.join(r.values)})" if r.values else f"{r.key} {r.operator}"
              for r in sel.match_expressions]
    return ",".join(parts) or "*"


def applied_text(applied: AppliedTo) -> str:
    pods, nss = selector_text(applied.pod_selector), selector_text(applied.namespace_selector)
    return " ".join(x for x in (f"pods({pods})" if pods else "", f"namespaces({nss})" if nss else "") if x) or "*"


def peer_text(peer: Peer) -> str:
    if peer.ip_block is not None:
        return f"ipBlock({peer.ip_block.cidr})"
    pods, nss = selector_text(peer.pod_selector), selector_text(peer.namespace_selector)
    words = [f"pods({pods})" if pods else "", f"namespaces({nss})" if nss else "",
             "namespaces(self)" if peer.namespace_self else ""]
    return " ".join(x for x in words if x) or "*"


def group_text(key: tuple[Any, ...]) -> str:
    """A selector group (policy/classes.py GroupKey) as one line: what selected the Pod into its class."""
    if key[0] == "all":
        return "all Pods"
    where = f"in {key[1]}" if key[1] else "cluster-wide"
    items: Iterable[Any] = key[2] if isinstance(key[2], tuple) else (key[2],)
    text = "; ".join(applied_text(x) if key[0] == "applied" else peer_text(x) for x in items)
    return f"{key[0]} {where}: {text}"
