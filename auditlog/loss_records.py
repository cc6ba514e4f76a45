"""Loss records: audit records, chained like every other, stating what never became a record.

Packet-ins dropped by an OVS meter, by ovs-vswitchd's controller queue or at the
agent's admission, and records a full writer refused, cannot be tied to a flow;
without these records a reader of the trail alone could not tell it is
incomplete. `LossRecorder.tick` is handed cumulative counts at each window's
end and returns (and submits) one record naming what changed in the window,
or nothing when nothing did. Pure apart from the submit callable; `now` is passed in.
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
PACKET_INS, RECORDS = "packet_ins", "records"  # units
_PATH_ORDER = {METER: 0, OVS_QUEUE: 1, ADMISSION: 2, WRITER_FULL: 3}  # where along the way a loss happens


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
            WRITER_FULL: f"{what} dropped because the audit writer's queue was full"}.get(
        key.reason, f"{what} lost ({key.reason}, {key.source})")


def loss_record(counts: Mapping[LossKey, int], start: float, end: float,
                context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record saying `counts` (by kind, each > 0) went missing between epoch times `start` and `end`."""
    items = sorted(counts.items(), key=lambda kv: (_PATH_ORDER.get(kv[0].reason, 9), kv[0]))
    first, last = utc_stamp(start), utc_stamp(end)
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
                   + "; ".join(_phrase(key, n) for key, n in items),
        "npaudit": {"loss": {
            PACKET_INS: sum(n for key, n in items if key.unit == PACKET_INS),
            RECORDS: sum(n for key, n in items if key.unit == RECORDS),
            "by_reason": [{**key._asdict(), "count": n} for key, n in items]}},
    })
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
                 context: Mapping[str, Any] | None = None) -> None:
        self._submit = submit
        self._context = dict(context or {})
        self._start = now
        self._last: dict[LossKey, int] = {}
        self.written = 0
        self.refused = 0

    def tick(self, counts: Mapping[LossKey, int], now: float) -> dict[str, Any] | None:
        """End the window at `now` with these cumulative counts; the record submitted, or None."""
        delta = {}
        for key, n in counts.items():
            before = self._last.get(key, 0)
            grew = n - before if n >= before else n  # a counter that started again counts from zero
            if grew > 0:
                delta[key] = grew
        if not delta:
            self._last.update(counts)
            self._start = now
            return None
        record = loss_record(delta, self._start, now, self._context)
        if not self._submit(RecordText.of(record)):
            self.refused += 1
            return None
        self.written += 1
        self._last.update(counts)
        self._start = now
        return record
