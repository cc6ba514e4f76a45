"""Counts over audit records (`npaudit stats`): records and packets by disposition, policy, rule and Pod,
and the losses that loss records state.

Loss records state losses twice over, in two ways that are never added together: by reason
(`losses`: where along the way packet-ins went missing, the totals) and by rule (`rule_losses`:
which logged rule's packets they were, from its OVS flow counts). For one rule (`--rule`),
packets that hit it = packets in its records + its stated loss."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass
class Tally:
    """Records and packets of one group."""

    records: int = 0
    packets: int = 0


@dataclass
class RecordCounts:
    """What `npaudit stats` counts in the audit files."""

    records: int = 0
    packets: int = 0
    offloaded_packets: int = 0
    unreadable: int = 0  # lines that are no JSON object
    # What loss records in the files state went missing: "category reason source" -> count (unit in the key).
    losses: dict[str, int] = field(default_factory=dict)
    # What loss records state each logged rule lost (by_rule): rule key (as by_rule's) -> packets.
    rule_losses: dict[str, int] = field(default_factory=dict)
    rule: str | None = None  # only the records and losses of the rule(s) this names (rule_matches)
    first: str | None = None
    last: str | None = None
    by: dict[str, dict[str, Tally]] = field(default_factory=lambda: {k: {} for k in GROUPS})

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "packets": self.packets, "offloaded_packets": self.offloaded_packets,
                "unreadable_lines": self.unreadable, "first": self.first, "last": self.last,
                "losses_stated": dict(sorted(self.losses.items())),
                "rule_losses_stated": dict(sorted(self.rule_losses.items())),
                **({"rule": self.rule_account()} if self.rule is not None else {}),
                **{f"by_{kind}": {key: {"records": t.records, "packets": t.packets}
                                  for key, t in _ranked(groups)} for kind, groups in self.by.items()}}


    def rule_account(self) -> dict[str, Any]:
        """For `--rule`: packets that hit it = in its records + stated lost."""
        lost = sum(self.rule_losses.values())
        return {"selector": self.rule, "records": self.records, "packets_in_records": self.packets,
                "offloaded_packets": self.offloaded_packets, "stated_loss": lost, "packets_hit": self.packets + lost,
                "rules": sorted(set(self.by["rule"]) | set(self.rule_losses))}


GROUPS: tuple[str, ...] = ("disposition", "policy", "rule", "pod")


def rule_matches(selector: str, rule: Any) -> bool:
    """True when `selector` names the record's (or loss item's) rule object: its id, its name, or
    "ruleset name" as the rule table of `npaudit stats` shows it."""
    if not isinstance(rule, dict):
        return False
    names = {str(rule.get("id") or ""), str(rule.get("name") or ""),
             f"{rule.get('ruleset') or '-'} {rule.get('name') or rule.get('id') or '-'}"}
    return selector in names


def _rule_key(rule: dict[str, Any]) -> str:
    return f"{rule.get('ruleset') or '-'} {rule.get('name') or rule.get('id') or '-'}"


def _ranked(groups: dict[str, Tally]) -> list[tuple[str, Tally]]:
    return sorted(groups.items(), key=lambda item: (-item[1].records, -item[1].packets, item[0]))


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def _group_keys(record: dict[str, Any]) -> dict[str, list[str]]:
    from auditlog.query import get_field

    ruleset = get_field(record, "rule", "ruleset")
    rule = get_field(record, "rule", "name") or get_field(record, "rule", "id")
    pods = []
    for side in ("source", "destination"):
        pod = get_field(record, "npaudit", side, "pod")
        if isinstance(pod, dict) and pod.get("name"):
            pods.append(f"{pod.get('namespace') or ''}/{pod['name']}".lstrip("/"))
    return {"disposition": [str(get_field(record, "npaudit", "disposition") or "-")],
            "policy": [str(ruleset or "-")],
            "rule": [f"{ruleset or '-'} {rule or '-'}"],
            "pod": sorted(set(pods))}


def count_records(matches: Iterable[tuple[bytes, dict[str, Any] | None]], rule: str | None = None) -> RecordCounts:
    """Counts of the matching lines (raw, record if parsed) of `LogReader.select`; `rule`: only the
    records of the rule(s) it names (rule_matches), and what loss records state those rules lost."""
    import orjson

    from auditlog.loss_records import is_loss_record
    from auditlog.query import get_field, record_time

    counts = RecordCounts(rule=rule)
    for raw, record in matches:
        if record is None:
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = None
        if not isinstance(record, dict):
            counts.unreadable += 1
            continue
        if is_loss_record(record):  # not a record of traffic: what the trail says it is missing
            _count_losses(counts, record)
            continue
        if rule is not None and not rule_matches(rule, record.get("rule")):
            continue
        packets = _int(get_field(record, "npaudit", "aggregate", "packets"))
        counts.records += 1
        counts.packets += packets
        counts.offloaded_packets += _int(get_field(record, "npaudit", "aggregate", "offloaded_packets"))
        stamp = record_time(raw, record)
        if stamp is not None:
            counts.first = stamp if counts.first is None or stamp < counts.first else counts.first
            counts.last = stamp if counts.last is None or stamp > counts.last else counts.last
        for kind, keys in _group_keys(record).items():
            for key in keys:
                tally = counts.by[kind].setdefault(key, Tally())
                tally.records += 1
                tally.packets += packets
    return counts


def _count_losses(counts: RecordCounts, record: dict[str, Any]) -> None:
    from auditlog.query import get_field

    for item in get_field(record, "npaudit", "loss", "by_rule") or ():
        if isinstance(item, dict) and isinstance(item.get("rule"), dict):
            if counts.rule is None or rule_matches(counts.rule, item["rule"]):
                key = _rule_key(item["rule"])
                counts.rule_losses[key] = counts.rule_losses.get(key, 0) + _int(item.get("count"))
    if counts.rule is not None:  # the totals by reason are of every rule
        return
    losses = counts.losses
    items = get_field(record, "npaudit", "loss", "by_reason")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            key = " ".join(str(item.get(k, "-")) for k in ("category", "reason", "source", "unit"))
            losses[key] = losses.get(key, 0) + _int(item.get("count"))
