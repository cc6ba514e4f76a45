"""Loss records: audit records, chained like every other, stating what never became a record.

Frames lost on a port before ovs-vswitchd read them or dropped by its datapath
before the pipeline, packet-ins dropped by an OVS meter, by ovs-vswitchd's controller
queue or at the agent's admission, and records a full writer refused, cannot be tied to a flow;
without these records a reader of the trail alone could not tell it is
incomplete. `LossRecorder.tick` is handed cumulative counts at each window's
end and returns (and submits) one record naming what changed in the window,
or nothing when nothing did. Pure apart from the submit callable; `now` is passed in.

A loss record may also say which logged rules the losses hit (`npaudit.loss.by_rule`: each
rule's packets its OVS flows matched that no record of it holds). That is an attribution of
the same packet-ins `by_reason` counts, never added to the totals; it may come a window
after the reasons it attributes (policy_agent/limits/rule_losses.py says why), so the two
agree summed over the trail, not record by record.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Mapping, NamedTuple

from auditlog.chain import DATASET, ECS_VERSION, OBSERVER, RecordText, utc_stamp

log = logging.getLogger(__name__)

ACTION = "audit-loss"  # event.action of a loss record
# Reasons, where the loss happened.
METER = "meter"                      # an OVS meter band dropped the packet-in (source: the meter)
OVS_QUEUE = "ovs_queue_overflow"     # ovs-vswitchd dropped it before sending (source: its coverage counter)
ADMISSION = "admission"              # the agent's demux dropped it (source: rate_limit or queue_full)
WRITER_FULL = "writer_full"          # a whole record the writer's full queue refused
# Before the pipeline (category "all", unit frames): no rule has seen these, so they have no packet-in.
PORT_RX_DROPPED = "port_rx_dropped"            # the kernel dropped the frame on the port (source: the port)
PORT_SOCKET_OVERFLOW = "port_socket_overflow"  # ovs-vswitchd's packet socket on the port was full (source: the port)
DATAPATH_DROP = "datapath_drop"                # the userspace datapath dropped it before the pipeline (its counter)
# Dropped by design, before any rule: a new connection from another node whose source address is no Pod
# this node knows yet (cluster.deny_unknown_sources; source: the tunnel). Stated so the refusal is never silent.
UNKNOWN_SOURCE = "unknown_source"
# Dropped before any rule: a packet from the tunnel whose Geneve VNI is neither Pod traffic's (0) nor a trace mark
# this node knows (a node of a newer version, or something else sending Geneve here; source: the tunnel).
UNKNOWN_VNI = "unknown_vni"
PACKET_INS, RECORDS, FRAMES = "packet_ins", "records", "frames"  # units
# Where along the way a loss happens.
_PATH_ORDER = {PORT_RX_DROPPED: 0, PORT_SOCKET_OVERFLOW: 1, DATAPATH_DROP: 2, UNKNOWN_VNI: 3, UNKNOWN_SOURCE: 4,
               METER: 5, OVS_QUEUE: 6, ADMISSION: 7, WRITER_FULL: 8}


class LossKey(NamedTuple):
    """One counted kind of loss: packet-in category ("all" when OVS cannot tell), reason, source, unit."""

    category: str
    reason: str
    source: str
    unit: str = PACKET_INS


def _phrase(key: LossKey, n: int) -> str:
    what = f"{n} {key.category} {'records' if key.unit == RECORDS else 'packet-ins'}"
    return {METER: f"{what} dropped by OVS meter {key.source}",
            OVS_QUEUE: f"{n} packet-ins (any category) dropped by ovs-vswitchd ({key.source})",
            ADMISSION: f"{what} dropped at the agent's admission ({key.source})",
            WRITER_FULL: f"{what} dropped because the audit writer's queue was full",
            PORT_RX_DROPPED: f"{n} frames dropped by the kernel on port {key.source} before ovs-vswitchd read them",
            PORT_SOCKET_OVERFLOW: f"{n} frames ovs-vswitchd never read off port {key.source} (its packet socket "
                                  "was full)",
            DATAPATH_DROP: f"{n} packets ovs-vswitchd's datapath dropped before the pipeline ({key.source})",
            UNKNOWN_SOURCE: f"{n} packets from another node ({key.source}) dropped before any rule: their source "
                            "address was no Pod this node knew yet (cluster.deny_unknown_sources)",
            UNKNOWN_VNI: f"{n} packets from another node ({key.source}) dropped before any rule: their Geneve VNI "
                         "was neither Pod traffic's (0) nor a trace mark this node knows"}.get(
        key.reason, f"{what} lost ({key.reason}, {key.source})")


def _rule_phrase(item: Mapping[str, Any]) -> str:
    rule = item["rule"]
    name = " ".join(str(rule[k]) for k in ("ruleset", "name") if rule.get(k)) or f"rule id {rule.get('id')}"
    tier = f", tier {rule['category']}" if rule.get("category") else ""
    meter = f", {item['meter']} by its own meter" if "meter" in item else ""
    return f"{item['count']} of rule {name} (id {rule.get('id')}{tier}{meter})"


def loss_record(counts: Mapping[LossKey, int], start: float, end: float,
                context: Mapping[str, Any] | None = None,
                by_rule: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The record saying `counts` (by kind, each > 0) went missing between epoch times `start` and `end`;
    `by_rule`: [{"rule": {id, name, ruleset, category}, "count": n, "meter": m (of n, by the rule's own
    meter, when it has one)}] for the logged rules they hit."""
    items = sorted(counts.items(), key=lambda kv: (_PATH_ORDER.get(kv[0].reason, 9), kv[0]))
    first, last = utc_stamp(start), utc_stamp(end)
    phrases = [_phrase(key, n) for key, n in items]
    if by_rule:
        phrases.append("packets logged rules matched in OVS that no record of theirs holds: "
                       + ", ".join(_rule_phrase(item) for item in by_rule))
    record: dict[str, Any] = dict(context or {})
    record["observer"] = {**record.get("observer", {}), **OBSERVER}
    record.update({
        "@timestamp": last,
        "ecs": {"version": ECS_VERSION},
        "event": {"action": ACTION, "category": ["network"], "dataset": DATASET, "end": last,
                  "id": uuid.uuid4().hex, "kind": "metric", "start": first, "type": ["info"]},
        # ECS log.level (a keyword SIEMs filter on; event.severity is a number whose scale is the source's):
        # a window that lost packet-ins or records leaves the trail incomplete.
        "log": {"level": "warning"},
        "message": f"the audit trail is incomplete between {first} and {last}: "
                   + "; ".join(phrases),
        "npaudit": {"loss": {
            PACKET_INS: sum(n for key, n in items if key.unit == PACKET_INS),
            RECORDS: sum(n for key, n in items if key.unit == RECORDS),
            **({FRAMES: frames} if (frames := sum(n for key, n in items if key.unit == FRAMES)) else {}),
            "by_reason": [{**key._asdict(), "count": n} for key, n in items]}},
    })
    if by_rule:
        record["npaudit"]["loss"]["by_rule"] = by_rule
    return record


def is_loss_record(record: Mapping[str, Any]) -> bool:
    event = record.get("event")
    return isinstance(event, dict) and event.get("action") == ACTION


class LossRecorder:
    """Turns cumulative loss counters into one loss record per window in which one of them grew.

    A record the writer refuses (its queue full) is not lost: the counts stay
    pending and the next window's record covers both windows.
    """

    def __init__(self, submit: Callable[[RecordText], bool], *, now: float,
                 context: Mapping[str, Any] | None = None,
                 describe: Callable[[int], Mapping[str, str]] = lambda rule_id: {"id": str(rule_id)}) -> None:
        self._submit = submit
        self._context = dict(context or {})
        self._describe = describe  # rule id -> the record's rule object (id, name, ruleset, category)
        self._start = now
        self._last: dict[LossKey, int] = {}
        self._rules_pending: dict[int, list[int | None]] = {}  # rule id -> [count, meter] not yet written
        self.written = 0
        self.refused = 0

    def tick(self, counts: Mapping[LossKey, int], now: float,
             rules: Mapping[int, tuple[int, int | None]] | None = None) -> dict[str, Any] | None:
        """End the window at `now` with these cumulative counts and the loss newly stated per rule id
        (count, the part its own meter dropped or None); the record submitted, or None."""
        pending = self._rules_pending
        for rule_id, (n, meter) in (rules or {}).items():
            if n > 0:
                held = pending.setdefault(rule_id, [0, None])
                held[0] = (held[0] or 0) + n
                if meter is not None:
                    held[1] = (held[1] or 0) + meter
        delta = {}
        for key, n in counts.items():
            before = self._last.get(key, 0)
            grew = n - before if n >= before else n  # a counter that started again counts from zero
            if grew > 0:
                delta[key] = grew
        if not delta and not pending:
            self._last.update(counts)
            self._start = now
            return None
        by_rule = [{"rule": dict(self._describe(rule_id)), "count": n, **({"meter": m} if m is not None else {})}
                   for rule_id, (n, m) in sorted(pending.items())]
        record = loss_record(delta, self._start, now, self._context, by_rule)
        if not self._submit(RecordText.of(record)):
            self.refused += 1
            return None
        self.written += 1
        pending.clear()
        self._last.update(counts)
        self._start = now
        return record
