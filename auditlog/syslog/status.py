"""What `npaudit syslog status` reports: each forwarder's stats beside the writer's newest seq, and its JSON form."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Mapping

from auditlog.syslog.errors import SyslogError
from auditlog.syslog.stats import ForwarderStats

_FIELDS = {f.name: str(f.type) for f in fields(ForwarderStats)}  # strings: postponed annotations
_DEFAULTS = {f.name for f in fields(ForwarderStats) if f.default is not MISSING}  # newer: an older agent omits


class SyslogStatusError(SyslogError):
    """A status reply that is not one this version wrote (e.g. from an older or newer agent)."""


@dataclass(frozen=True)
class SyslogStatus:
    """A snapshot: `writer_seq` is the newest sealed seq (None when the agent writes no audit log)."""

    writer_seq: int | None
    destinations: tuple[ForwarderStats, ...] = ()

    def backlog_records(self, stats: ForwarderStats) -> int | None:
        """Records written but not yet delivered to that destination; None when unknown.

        Unknown before the first delivery since start-up without a checkpoint, and
        when the log was started anew (the writer's seq went below the one sent).
        """
        if self.writer_seq is None or stats.last_seq_sent is None or stats.last_seq_sent > self.writer_seq:
            return None
        return self.writer_seq - stats.last_seq_sent

    def to_json(self) -> dict[str, Any]:
        """The reply of the local API's syslog-status op (and `npaudit syslog status -o json`)."""
        return {"writer_seq": self.writer_seq,
                "destinations": [{**asdict(st), "backlog_records": self.backlog_records(st)}
                                 for st in self.destinations]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SyslogStatus:
        """The status `to_json` wrote; SyslogStatusError naming the field that is missing or of the wrong type."""
        writer_seq = data.get("writer_seq")
        if writer_seq is not None and type(writer_seq) is not int:
            raise SyslogStatusError(f"syslog status: writer_seq must be an integer or null, got {writer_seq!r}")
        items = data.get("destinations")
        if not isinstance(items, list):
            raise SyslogStatusError("syslog status: destinations must be a list")
        return cls(writer_seq, tuple(stats_from_json(item, f"destinations[{i}]") for i, item in enumerate(items)))


def stats_from_json(item: object, where: str = "stats") -> ForwarderStats:
    """The ForwarderStats `asdict` gave as JSON, each field type-checked; SyslogStatusError naming `where` and the
    field otherwise."""
    if not isinstance(item, Mapping):
        raise SyslogStatusError(f"syslog status: {where} must be an object")
    values: dict[str, Any] = {}  # each checked by _is against its field
    for name, kind in _FIELDS.items():
        if name in _DEFAULTS and name not in item:
            continue
        value = item.get(name)
        if not _is(kind, value):
            raise SyslogStatusError(f"syslog status: {where}.{name} must be {kind}, got {value!r}")
        values[name] = value
    return ForwarderStats(**values)


def _is(kind: str, value: object) -> bool:
    """Whether `value` fits a ForwarderStats annotation (they are strings: `from __future__ import annotations`)."""
    optional = kind.endswith(" | None")
    if value is None:
        return optional
    base = kind.removesuffix(" | None")
    return {"int": type(value) is int, "str": isinstance(value, str), "bool": type(value) is bool,
            "float": type(value) in (int, float)}.get(base, False)
