"""Field-level manifest checks: one field's value checked and turned into its model value.

Each check appends `(field path, reason)` to the caller's error list and returns
None (or a neutral default) for a bad value, so one pass reports every problem.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections import Counter
from typing import Any, Iterable, Mapping

from policy_agent.policy import priorities
from policy_agent.policy.model import (
    BASELINE_TIER, DEFAULT_TIER, STANDARD_TIERS, AppliedTo, Direction, IcmpSpec, IPBlock, LabelSelector, Peer, Policy,
    PolicyKind, PortSpec, Requirement, Tier,
)

PROTOCOLS = ("TCP", "UDP", "SCTP")
# Documented cap: ingress plus egress rules of one policy. Validation, compilation and
# every flow change are linear in it; a bigger policy is more likely a bomb than a design.
MAX_RULES_PER_POLICY = 20_000
# How many rules one OpenFlow table can order: priorities.spread gives each rule its own
# priority in TOP..FLOOR and fails beyond that.
RULES_PER_TABLE = priorities.TOP - priorities.FLOOR

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_LABEL_VALUE_RE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_LOG_LABEL_RE = re.compile(r"[A-Za-z0-9._-]*")
_PORT_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")

Errs = list[tuple[str, str]]  # (field path, reason) for one object


# --- structure --------------------------------------------------------------------------------

def fields_of(raw: Any, path: str, errs: Errs, allowed: set[str],
              required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The mapping at `path`; unknown keys are errors so a typo never widens a policy."""
    if not isinstance(raw, dict):
        # A null list item is a wrong value, not a missing field.
        missing = raw is None and not path.endswith("]")
        errs.append((path, "required" if missing else f"must be a mapping, got {type_name(raw)}"))
        return None
    for key in raw:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            errs.append((_join(path, str(key)),
                         f"unknown field{hint}; expected one of {', '.join(sorted(allowed))}"))
    for key in required:
        if raw.get(key) is None:
            errs.append((_join(path, key), "required"))
    return {k: v for k, v in raw.items() if k in allowed}


def items_of(raw: Any, path: str, errs: Errs) -> list[tuple[int, Any]]:
    """(index, item) of the list at `path`; absent is empty."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        errs.append((path, f"must be a list, got {type_name(raw)}"))
        return []
    return list(enumerate(raw))


# --- scalars ----------------------------------------------------------------------------------

def string(raw: Any, path: str, errs: Errs, required: bool = False) -> str | None:
    if isinstance(raw, str):
        return raw
    if raw is not None:
        errs.append((path, f"must be a string, got {type_name(raw)}"))
    elif required:
        errs.append((path, "required"))
    return None


def integer(raw: Any, path: str, errs: Errs, lo: int, hi: int, required: bool = False) -> int | None:
    if raw is None:
        if required:
            errs.append((path, "required"))
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        errs.append((path, f"must be an integer, got {type_name(raw)}"))
        return None
    if not lo <= raw <= hi:
        errs.append((path, f"must be {lo}..{hi}; got {show(raw)}"))
        return None
    return raw


def number(raw: Any, path: str, errs: Errs, lo: float, hi: float) -> float | None:
    if raw is None:
        return None  # required-ness reported by fields_of
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        errs.append((path, f"must be a number, got {type_name(raw)}"))
        return None
    if not lo <= raw <= hi:  # also rejects NaN
        errs.append((path, f"must be {lo}..{hi}; got {show(raw)}"))
        return None
    return float(raw)


def protocol(raw: Any, path: str, errs: Errs) -> str:
    if raw is None:
        return "TCP"
    if raw not in PROTOCOLS:
        errs.append((path, f"must be one of {', '.join(PROTOCOLS)}; got {show(raw)}"))
        return "TCP"
    return str(raw)


def check_name(name: str, path: str, errs: Errs, label: bool) -> None:
    """An object name: a DNS-1123 label (label=True, e.g. Namespaces) or subdomain."""
    if label and (len(name) > 63 or not _DNS_LABEL_RE.fullmatch(name)):
        errs.append((path, f"must be a DNS-1123 label (at most 63 characters: lowercase letters, digits "
                           f"and '-', starting and ending alphanumeric); got {show(name)}"))
    elif not label and (len(name) > 253 or not _SUBDOMAIN_RE.fullmatch(name)):
        errs.append((path, f"must be a DNS-1123 subdomain (at most 253 characters: lowercase letters, "
                           f"digits, '-' and '.', starting and ending alphanumeric); got {show(name)}"))


def check_port_name(name: str, path: str, errs: Errs) -> None:
    if (len(name) > 15 or not _PORT_NAME_RE.fullmatch(name) or "--" in name
            or not any(c.isalpha() for c in name)):
        errs.append((path, f"named port {show(name)} must be at most 15 characters of [a-z0-9-] with at "
                           "least one letter and no leading, trailing or double '-'"))


def check_log_label(label: str, path: str, errs: Errs) -> None:
    if len(label) > 63 or not _LOG_LABEL_RE.fullmatch(label):
        errs.append((path, f"must be at most 63 characters of [A-Za-z0-9._-]; got {show(label)}"))


# --- labels and selectors ---------------------------------------------------------------------

def label_map(raw: Any, path: str, errs: Errs, values: bool = True) -> tuple[tuple[str, str], ...]:
    """A label (or, values=False, annotation) map as sorted pairs."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        errs.append((path, f"must be a mapping, got {type_name(raw)}"))
        return ()
    out: list[tuple[str, str]] = []
    for key, value in raw.items():
        p = _join(path, str(key))
        problem = label_key_problem(key) or (
            label_value_problem(value) if values else
            None if isinstance(value, str) else f"must be a string, got {type_name(value)}")
        if problem:
            errs.append((p, problem))
        else:
            out.append((key, value))
    return tuple(sorted(out))


def label_key_problem(key: Any) -> str | None:
    if not isinstance(key, str):
        return f"label key must be a string, got {type_name(key)}"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN_RE.fullmatch(prefix)):
        return f"invalid label key {show(key)}: the prefix must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_VALUE_RE.fullmatch(name):
        return (f"invalid label key {show(key)}: the name must be 1-63 characters of [A-Za-z0-9._-], "
                "starting and ending alphanumeric")
    return None


def label_value_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"label value must be a string, got {type_name(value)}"
    if len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
        return (f"invalid label value {show(value)}: must be at most 63 characters of [A-Za-z0-9._-], "
                "starting and ending alphanumeric")
    return None


def label_selector(raw: Any, path: str, errs: Errs) -> LabelSelector | None:
    """None when absent; `{}` is the empty selector that matches everything."""
    if raw is None:
        return None
    d = fields_of(raw, path, errs, {"matchLabels", "matchExpressions"})
    if d is None:
        return None
    exprs: list[Requirement] = []
    for i, e in items_of(d.get("matchExpressions"), f"{path}.matchExpressions", errs):
        p = f"{path}.matchExpressions[{i}]"
        ed = fields_of(e, p, errs, {"key", "operator", "values"}, required=("key", "operator"))
        if ed is None:
            continue
        key = string(ed.get("key"), f"{p}.key", errs)
        if key is not None and (problem := label_key_problem(key)):
            errs.append((f"{p}.key", problem))
        op = ed.get("operator")
        values: list[str] = []
        for j, v in items_of(ed.get("values"), f"{p}.values", errs):
            if isinstance(v, str) and not label_value_problem(v):
                values.append(v)
            else:
                errs.append((f"{p}.values[{j}]", label_value_problem(v) or ""))
        if op in ("In", "NotIn") and not ed.get("values"):
            errs.append((f"{p}.values", f"must be non-empty for operator {op}"))
        elif op in ("Exists", "DoesNotExist") and ed.get("values"):
            errs.append((f"{p}.values", f"must be empty for operator {op}"))
        elif op is not None and op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            errs.append((f"{p}.operator", f"must be one of In, NotIn, Exists, DoesNotExist; got {show(op)}"))
        if key is not None and isinstance(op, str):
            exprs.append(Requirement(key=key, operator=op, values=tuple(sorted(set(values)))))
    return LabelSelector(match_labels=label_map(d.get("matchLabels"), f"{path}.matchLabels", errs),
                         match_expressions=tuple(sorted(exprs, key=lambda r: (r.key, r.operator, r.values))))


# --- who a rule selects: appliedTo and peers --------------------------------------------------

def applied_to_list(raw: Any, path: str, errs: Errs, kind: PolicyKind | None) -> tuple[AppliedTo, ...]:
    """A policy's or rule's appliedTo; kind None = Kubernetes."""
    out: list[AppliedTo] = []
    for i, item in items_of(raw, path, errs):
        p = f"{path}[{i}]"
        d = fields_of(item, p, errs, {"podSelector", "namespaceSelector"})
        if d is None:
            continue
        if kind is PolicyKind.ANP and d.get("namespaceSelector") is not None:
            errs.append((f"{p}.namespaceSelector", "not allowed in an Antrea NetworkPolicy, which applies "
                                                   "only in its own Namespace"))
        if d.get("podSelector") is None and d.get("namespaceSelector") is None and len(d) == len(item):
            errs.append((p, "must set podSelector or namespaceSelector"))
        out.append(AppliedTo(pod_selector=label_selector(d.get("podSelector"), f"{p}.podSelector", errs),
                             namespace_selector=label_selector(d.get("namespaceSelector"),
                                                               f"{p}.namespaceSelector", errs)))
    return tuple(out)


def peer(raw: Any, path: str, errs: Errs, antrea: bool) -> Peer | None:
    """One from/to entry of a rule; `antrea` allows `namespaces: {match: Self}`."""
    fields = {"podSelector", "namespaceSelector", "ipBlock"} | ({"namespaces"} if antrea else set())
    d = fields_of(raw, path, errs, fields)
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
        nd = fields_of(d["namespaces"], f"{path}.namespaces", errs, {"match"}, required=("match",))
        if nd and nd.get("match") is not None and nd["match"] != "Self":
            errs.append((f"{path}.namespaces.match", f"must be Self; got {show(nd['match'])}"))
        ns_self = True
    return Peer(pod_selector=label_selector(d.get("podSelector"), f"{path}.podSelector", errs),
                namespace_selector=label_selector(d.get("namespaceSelector"), f"{path}.namespaceSelector", errs),
                ip_block=ip_block(d.get("ipBlock"), f"{path}.ipBlock", errs), namespace_self=ns_self)


# --- addresses and ports ----------------------------------------------------------------------

def ip_block(raw: Any, path: str, errs: Errs) -> IPBlock | None:
    if raw is None:
        return None
    d = fields_of(raw, path, errs, {"cidr", "except"}, required=("cidr",))
    if d is None:
        return None
    net = _cidr(d["cidr"], f"{path}.cidr", errs) if d.get("cidr") is not None else None
    excepts = []
    for i, e in items_of(d.get("except"), f"{path}.except", errs):
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
    text = string(raw, path, errs, required=True)
    if text is None:
        return None
    try:
        if "/" not in text:
            raise ValueError("no prefix length")
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        errs.append((path, f"must be a CIDR like 10.0.0.0/24 or fd00::/64; got {show(text)}"))
        return None


def port_spec(raw: Any, path: str, errs: Errs) -> PortSpec | None:
    """A policy rule's port entry: protocol, number or named port, optional endPort."""
    d = fields_of(raw if raw is not None else {}, path, errs, {"protocol", "port", "endPort"})
    if d is None:
        return None
    proto = protocol(d.get("protocol"), f"{path}.protocol", errs)
    port = d.get("port")
    if isinstance(port, str):
        check_port_name(port, f"{path}.port", errs)
    elif port is not None:
        port = integer(port, f"{path}.port", errs, 1, 65535)
    end = integer(d.get("endPort"), f"{path}.endPort", errs, 1, 65535)
    if d.get("endPort") is not None:
        if d.get("port") is None:
            errs.append((f"{path}.endPort", "requires port"))
        elif isinstance(d.get("port"), str):
            errs.append((f"{path}.endPort", f"requires a numeric port, not the named port {show(d['port'])}"))
        elif isinstance(port, int) and end is not None and end < port:
            errs.append((f"{path}.endPort", f"must be >= port {port}; got {end}"))
    return PortSpec(protocol=proto, port=port, end_port=end)


def rule_protocol(raw: Any, path: str, errs: Errs) -> IcmpSpec | None:
    """An Antrea rule's `protocols` entry: `{icmp: {icmpType, icmpCode}}`, each optional."""
    d = fields_of(raw, path, errs, {"icmp", "igmp"})
    if d is None:
        return None
    if "igmp" in d:
        errs.append((f"{path}.igmp", "IGMP is not supported; only icmp (icmpType, icmpCode) can be matched"))
        return None
    if d.get("icmp") is None:
        if len(d) == len(raw):  # a misspelt field was already reported
            errs.append((f"{path}.icmp", "required (icmp: {} matches all ICMP)"))
        return None
    icmp = fields_of(d["icmp"], f"{path}.icmp", errs, {"icmpType", "icmpCode"})
    if icmp is None:
        return None
    icmp_type = integer(icmp.get("icmpType"), f"{path}.icmp.icmpType", errs, 0, 255)
    icmp_code = integer(icmp.get("icmpCode"), f"{path}.icmp.icmpCode", errs, 0, 255)
    return IcmpSpec(icmp_type=icmp_type, icmp_code=icmp_code)


# --- size ---------------------------------------------------------------------------------------

def rule_count_problem(spec: dict[str, Any], errs: Errs) -> bool:
    """True (and an error) when a policy spec has more rules than MAX_RULES_PER_POLICY;
    checked before any rule, so an oversized policy is refused without walking it."""
    counts = {d.value: len(spec[d.value]) for d in Direction if isinstance(spec.get(d.value), list)}
    total = sum(counts.values())
    if total <= MAX_RULES_PER_POLICY:
        return False
    field = max(counts, key=lambda d: counts[d])
    errs.append((f"spec.{field}", f"{total:,} rules ({', '.join(f'{n:,} {d}' for d, n in counts.items())}); "
                                  f"a policy may have at most {MAX_RULES_PER_POLICY:,}"))
    return True


def capacity_problems(policies: Iterable[tuple[str, Policy]]) -> list[str]:
    """One line per OpenFlow table that `policies` (header, policy) would overfill: the
    compiler gives every rule a priority of its own, and a table has RULES_PER_TABLE."""
    used: Counter[tuple[str, Direction]] = Counter()
    problems: list[str] = []
    for header, policy in policies:
        before = dict(used)
        for rule in policy.rules:
            used[(_table_name(policy), rule.direction)] += 1
        for (table, direction), n in used.items():
            if n > RULES_PER_TABLE >= before.get((table, direction), 0):
                problems.append(f"{header}: spec.{direction.value}: brings the {table} {direction.value} rules "
                                f"to {n:,}; one table orders at most {RULES_PER_TABLE:,} rules")
    return problems


def _table_name(policy: Policy) -> str:
    """Which of the compiler's rule tables a policy's rules share (see compiler.compile_policies)."""
    if policy.kind is PolicyKind.K8S:
        return "Kubernetes NetworkPolicy"
    return "Antrea baseline tier" if (policy.tier or DEFAULT_TIER) == BASELINE_TIER else "Antrea"


# --- messages ---------------------------------------------------------------------------------

def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_TYPE_NAMES = {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
               float: "number", type(None): "null"}


def type_name(value: Any) -> str:
    """YAML's name for a value's type, as users see it in their manifests."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def show(value: Any) -> str:
    """repr() for messages, bounded: manifests can hold huge or odd values."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. ints beyond Python's str conversion limit
        return f"<{type_name(value)}>"
    return text if len(text) <= 80 else text[:77] + "..."


def policy_name(policy: Policy) -> str:
    """`kind/namespace/name` (no namespace for a cluster-scoped one), as errors name a policy."""
    return "/".join(x for x in (policy.kind.value, policy.namespace, policy.name) if x)


def tier_problems(all_tiers: Mapping[str, Tier], all_policies: Iterable[Policy], tiers: Iterable[str] = (),
                  policies: Iterable[Policy] = (), deleted: Iterable[str] = ()) -> list[str]:
    """Tiers across a whole state (`all_tiers` by name, `all_policies`), as Antrea checks them: the
    changed `tiers` keep priorities unique, the changed `policies` name known tiers, and a `deleted`
    Tier is used by no policy left (the error names them)."""
    problems: list[str] = []
    for name in sorted(set(tiers)):
        tier = all_tiers[name]
        same = sorted(t.name for t in all_tiers.values() if t.priority == tier.priority and t.name != name)
        if same:
            problems.append(f"Tier/{name}: spec.priority: {tier.priority} is already used by Tier/{same[0]}")
    for policy in policies:
        if policy.kind is not PolicyKind.K8S and policy.tier and policy.tier not in STANDARD_TIERS \
                and policy.tier not in all_tiers:
            problems.append(f"{policy_name(policy)}: spec.tier: unknown tier {policy.tier!r}; expected a "
                            f"standard tier ({', '.join(STANDARD_TIERS)}) or an applied Tier")
    gone = set(deleted)
    users = sorted((p.tier, policy_name(p)) for p in all_policies if p.tier in gone) if gone else []
    for name in sorted(gone):
        named = [user for tier, user in users if tier == name]
        if named:
            problems.append(f"Tier/{name}: cannot be deleted: used by {', '.join(named)}")
    return problems
