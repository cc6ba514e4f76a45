"""The ECS-aligned audit record (DESIGN.md §5): build one from a packet-in, serialise it to one line."""

from __future__ import annotations

import enum
import json
import math
import time
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from auditlog.packet import PacketSummary
from packetin.model import PacketIn

__all__ = ["PodDirectory", "RecordContext", "RuleLookup", "RuleView", "build_record", "clean_text",
           "dumps_record", "format_timestamp", "ACTIONS", "DISPOSITIONS"]

# reg7[0..3] -> (npaudit.disposition, event.action, the verdict word of event.type).
# Pass hands the packet to the next policy layer: it is neither allowed nor denied
# yet, so it gets no verdict in event.type (ECS: leave what does not fit empty).
_BY_DISPOSITION: dict[int, tuple[str, str, str | None]] = {
    0: ("Allow", "allowed", "allowed"),
    1: ("Drop", "dropped", "denied"),
    2: ("Reject", "rejected", "denied"),
    3: ("Pass", "passed", None),
}
_BY_ACTION_NAME = {v[0]: k for k, v in _BY_DISPOSITION.items()}
DISPOSITIONS = tuple(v[0] for v in _BY_DISPOSITION.values())
ACTIONS = tuple(v[1] for v in _BY_DISPOSITION.values())

_OBSERVER_TYPE = "switch"
_OBSERVER_VENDOR = "Open vSwitch"


class EventIds:
    """Unique event ids, cheaply: 64 random bits drawn once per process, then a counter.

    32 hex digits like a uuid4, but one os.urandom per process instead of one per
    record (on this VM urandom costs ~20 µs, more than building the whole record).
    """

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16]
        self._next = itertools.count().__next__

    def __call__(self) -> str:
        return f"{self._prefix}{self._next():016x}"


def _event_ids() -> Callable[[], str]:
    return EventIds()


class RuleView(Protocol):
    """What the record needs to know about a rule (policy_agent.rules.RuleInfo fits)."""

    @property
    def ruleset(self) -> str: ...
    @property
    def policy_kind(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def policy_name(self) -> str: ...
    @property
    def rule_name(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def priority(self) -> float | None: ...
    @property
    def action(self) -> Any: ...  # "Allow"... or an enum whose .value is
    @property
    def direction(self) -> Any: ...  # "ingress"/"egress" or an enum whose .value is
    @property
    def log_label(self) -> str: ...


class RuleLookup(Protocol):
    def get(self, rule_id: int) -> RuleView | None: ...


class PodDirectory(Protocol):
    def by_ip(self, ip: str) -> tuple[str, str] | None:
        """(namespace, name) of the Pod that has this address, if any."""
        ...


@dataclass(frozen=True, kw_only=True)
class RecordContext:
    """What every record of this node shares; `cluster` "" means no cluster name is set.

    `new_event_id` makes event.id: 32 hex digits, random per process plus a counter
    (EventIds), because nothing known when a record is built is unique (seq is
    assigned later, when the writer seals the chain; two one-packet records of a
    key can share a millisecond).
    Tests inject a deterministic one. A re-sent line keeps its id, so SIEMs can still
    deduplicate at-least-once deliveries.
    """

    node: str
    rules: RuleLookup
    pods: PodDirectory
    cluster: str = ""
    new_event_id: Callable[[], str] = field(default_factory=_event_ids)


def _enum_value(value: Any) -> str:
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def _epoch_ms(t: float) -> int:
    # Nearest millisecond: epoch floats carry binary noise (….512 may be ….51199999),
    # which truncation would turn into the previous millisecond.
    return round(t * 1000)


def _format_ms(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + ".%03dZ" % millis


def format_timestamp(t: float) -> str:
    """Epoch seconds -> '2026-11-30T02:14:03.512Z' (UTC, nearest millisecond)."""
    return _format_ms(_epoch_ms(t))


def _pod(pods: PodDirectory, ip: str | None) -> dict[str, str] | None:
    if ip is None:
        return None
    found = pods.by_ip(ip)
    if not found:
        return None
    namespace, name = found
    pod = {k: _text(v) for k, v in (("name", name), ("namespace", namespace)) if v}
    return pod or None


def _text(value: Any) -> str:
    """A user-controlled string as valid Unicode (names and labels are data, never trusted)."""
    return clean_text(value if isinstance(value, str) else str(value))


def _endpoint(ip: str | None, port: int | None) -> dict[str, Any] | None:
    ep: dict[str, Any] = {}
    if ip is not None:
        ep["ip"] = ip
    if port is not None:
        ep["port"] = port
    return ep or None


def build_record(ctx: RecordContext, pin: PacketIn, summary: PacketSummary, *, packets: int, bytes_: int,
                 first: float, last: float, offloaded_packets: int = 0, seq: int,
                 chain: str | None = None) -> dict[str, Any]:
    """The record for `packets` packets of one key, sampled by `pin` / `summary`.

    Fields that are not known are absent, never null. Raises ValueError only when
    neither reg7 nor the rule registry gives a disposition (no flow of ours does that).
    """
    rule = ctx.rules.get(pin.rule_id) if pin.rule_id else None
    disposition = pin.disposition
    if disposition not in _BY_DISPOSITION and rule is not None:
        # reg7 is the datapath's verdict and wins; the rule's action is only a fallback.
        disposition = _BY_ACTION_NAME.get(_enum_value(rule.action), disposition)
    verdict = _BY_DISPOSITION.get(disposition)
    if verdict is None:
        raise ValueError(f"packet-in of rule id {pin.rule_id} (table {pin.table_id}) has reg7={pin.reg7:#x}, "
                         "which is no disposition, and the rule is unknown")
    disposition_name, action, verdict_type = verdict
    first_str = format_timestamp(first)

    direction = _enum_value(rule.direction).lower() if rule is not None else ""
    src_pod = _pod(ctx.pods, summary.src_ip)
    dst_pod = _pod(ctx.pods, summary.dst_ip)
    # The applied-to Pod is the one the rule protects: the destination of ingress
    # traffic, the source of egress traffic.
    applied = dst_pod if direction == "ingress" else src_pod if direction == "egress" else None
    applied_ns = (applied or {}).get("namespace") or (rule.namespace if rule is not None else "")

    record: dict[str, Any] = {"@timestamp": first_str}
    record["event"] = {
        "id": ctx.new_event_id(),
        "kind": "event",
        "category": ["network"],
        "type": ["connection", verdict_type] if verdict_type else ["connection"],
        "action": action,
        # ECS: the outcome of the event itself: the policy decision was carried out.
        "outcome": "success",
    }

    rule_fields: dict[str, Any] = {}
    if rule is not None:
        if rule.rule_name:
            rule_fields["name"] = _text(rule.rule_name)
        if rule.ruleset:
            rule_fields["ruleset"] = _text(rule.ruleset)
        if rule.tier:
            rule_fields["category"] = _text(rule.tier)
    if pin.rule_id:  # reg6 is known from the packet even when the registry has no such rule
        rule_fields["id"] = str(pin.rule_id)
    if rule_fields:
        record["rule"] = rule_fields

    source = _endpoint(summary.src_ip, summary.src_port)
    if source:
        record["source"] = source
    destination = _endpoint(summary.dst_ip, summary.dst_port)
    if destination:
        record["destination"] = destination

    network: dict[str, Any] = {}
    if summary.transport is not None:
        network["transport"] = summary.transport
    if summary.protocol is not None:
        network["iana_number"] = str(summary.protocol)  # ECS keyword
    if summary.ip_version is not None:
        network["type"] = f"ipv{summary.ip_version}"
    if direction in ("ingress", "egress"):
        network["direction"] = direction
    if summary.vlan is not None:
        network["vlan"] = {"id": str(summary.vlan)}  # ECS keyword
    if network:
        record["network"] = network

    if summary.icmp_type is not None:
        icmp = {"type": summary.icmp_type}
        if summary.icmp_code is not None:
            icmp["code"] = summary.icmp_code
        record["icmp"] = icmp

    observer: dict[str, Any] = {"hostname": _text(ctx.node)} if ctx.node else {}
    observer["type"] = _OBSERVER_TYPE
    observer["vendor"] = _OBSERVER_VENDOR
    record["observer"] = observer

    orchestrator: dict[str, Any] = {"type": "kubernetes"}
    if ctx.cluster:
        orchestrator["cluster"] = {"name": _text(ctx.cluster)}
    if applied_ns:
        orchestrator["namespace"] = _text(applied_ns)
    record["orchestrator"] = orchestrator

    if rule is not None and rule.log_label:
        record["labels"] = {"log_label": _text(rule.log_label)}

    vendor: dict[str, Any] = {}
    if src_pod:
        vendor["source"] = {"pod": src_pod}
    if dst_pod:
        vendor["destination"] = {"pod": dst_pod}
    vendor["disposition"] = disposition_name
    if rule is None:
        vendor["rule_unknown"] = True
    elif rule.tier:
        # Only tiered (Antrea) rules have a priority; a K8s NetworkPolicy has none
        # (the registry fills 0.0 there), and a non-finite number is not JSON.
        # Always a float, so a SIEM's dynamic mapping does not make it an integer
        # field from the first record and then truncate 5.5 to 5.
        if isinstance(rule.priority, (int, float)) and math.isfinite(rule.priority):
            vendor["priority"] = float(rule.priority)
        vendor["tier"] = _text(rule.tier)
    vendor["aggregate"] = {
        "packets": packets,
        "bytes": bytes_,
        "first": first_str,
        "last": format_timestamp(last),
        "offloaded_packets": offloaded_packets,
    }
    if summary.fragment:
        vendor["fragment"] = True
    if summary.truncated:
        vendor["truncated"] = True
    vendor["seq"] = seq
    if chain is not None:
        vendor["chain"] = chain
    ovs: dict[str, Any] = {"table": pin.table_id, "cookie": "0x%016x" % (pin.cookie & 0xFFFF_FFFF_FFFF_FFFF)}
    if pin.in_port is not None:
        ovs["in_port"] = pin.in_port
    vendor["ovs"] = ovs
    record["npaudit"] = vendor
    return record


# ---- serialisation -----------------------------------------------------------------------

# ASCII, like the hash chain's canonical form (auditlog/chain.py), whose verifier
# reads lines as ASCII: every non-ASCII character is a \uXXXX escape, so no Pod
# name or label (newline, U+2028, NUL, ...) can break a line or a syslog frame,
# and the line survives any downstream charset. Insertion order, @timestamp first.
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False,
                            default=lambda o: _enum_value(o) if isinstance(o, enum.Enum) else str(o))
_MAX_DEPTH = 32


def clean_text(value: str) -> str:
    """`value` as valid Unicode: each lone surrogate becomes U+FFFD, and two surrogate
    code points that form a pair become the character they encode."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def dumps_record(record: dict[str, Any]) -> str:
    """One line of compact ASCII JSON (no newline at the end). Never raises.

    Strings are written as clean_text() gives them (lone surrogates as U+FFFD).
    What JSON cannot express is dropped (NaN, infinities, cycles, nesting deeper
    than 32, integers too long to print) or stringified (non-string keys, other
    objects); a record that defeats even that is written as {}.
    """
    try:
        line = _ENCODER.encode(record)
    except Exception:  # NaN, a cycle, an odd key or object: keep what JSON can say
        return _dumps_sanitized(record)
    # A surrogate escape is either half of a non-BMP character (fine) or a lone
    # surrogate (not Unicode); only then pay for the walk that tells them apart.
    if "\\ud" in line:
        return _dumps_sanitized(record)
    return line


def _dumps_sanitized(record: Any) -> str:
    try:
        return _ENCODER.encode(_sanitize(record, 0, set()))
    except Exception:  # a container whose iteration itself fails
        return "{}"


def _sanitize(value: Any, depth: int, seen: set[int]) -> Any:
    """A JSON-safe copy: clean text, keys as str, no NaN/inf, no cycles, bounded depth; else `_DROP`."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else _DROP
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            int.__repr__(value)  # ints past sys.get_int_max_str_digits() cannot be written
        except ValueError:
            return _DROP
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):
        return _sanitize(value.value, depth, seen)
    if isinstance(value, (dict, list, tuple)):
        if depth >= _MAX_DEPTH or id(value) in seen:
            return _DROP
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                out_d = {}
                for k, v in value.items():
                    v2 = _sanitize(v, depth + 1, seen)
                    if v2 is not _DROP:
                        out_d[clean_text(k) if isinstance(k, str) else _safe_str(k)] = v2
                return out_d
            out_l = [_sanitize(v, depth + 1, seen) for v in value]
            return [v for v in out_l if v is not _DROP]
        finally:
            seen.discard(id(value))
    return _safe_str(value)


def _safe_str(value: Any) -> str:
    try:
        return clean_text(str(value))
    except Exception:  # a hostile __str__ must not cost the record
        return "<unprintable>"


_DROP = object()
