"""`npaudit logs` output forms: json (the lines byte for byte), compact (one line each), table (aligned).

Names, labels and rule names are user data: in compact and table output every
control, format and line/paragraph-separator character is shown as an escape
(\\x1b, \\n, \\u202e), so no value can move the cursor, colour the terminal or
forge a line. json output is the record lines as written (they are ASCII with
every such character already escaped by the writer).
"""

from __future__ import annotations

from typing import IO, Iterable, Protocol

import orjson

from auditlog.loss_records import is_loss_record
from auditlog.query import Match, Record, get_field
from auditlog.safe_text import safe_text

__all__ = ["FORMATS", "Output", "make_output", "safe_text"]

FORMATS = ("table", "compact", "json")
_COLOURS = {"Allow": "\x1b[32m", "Drop": "\x1b[31m", "Reject": "\x1b[35m", "Pass": "\x1b[33m", "LOSS": "\x1b[1;33m"}
_RESET = "\x1b[0m"


def _endpoint(record: Record, side: str) -> str:
    """ns/pod:port when the Pod is known, else ip:port ([v6]:port)."""
    pod = get_field(record, "npaudit", side, "pod") or {}
    ip, port = get_field(record, side, "ip"), get_field(record, side, "port")
    if isinstance(pod, dict) and pod.get("name"):
        where = f"{pod['namespace']}/{pod['name']}" if pod.get("namespace") else str(pod["name"])
    elif ip is not None:
        where = f"[{ip}]" if ":" in str(ip) and port is not None else str(ip)
    else:
        where = "-"
    return safe_text(where if port is None else f"{where}:{port}")


def _loss_fields(record: Record) -> dict[str, str]:
    """A loss record (auditlog/loss_records.py) in the columns: what went missing where, in POLICY."""
    items = get_field(record, "npaudit", "loss", "by_reason")
    what = "; ".join(f"{i.get('category')} {i.get('reason')} {i.get('source')} {i.get('count')}"
                     for i in (items if isinstance(items, list) else []) if isinstance(i, dict))
    total = sum(n for unit in ("packet_ins", "records", "frames")
                if type(n := get_field(record, "npaudit", "loss", unit)) is int)
    return {"TIME": safe_text(record.get("@timestamp", "")), "SOURCE": "-", "DESTINATION": "-", "PROTO": "",
            "DISPOSITION": "LOSS", "DIRECTION": "", "TIER": "", "POLICY": safe_text(what), "RULE": "",
            "COUNT": str(total), "NODE": safe_text(get_field(record, "observer", "hostname") or "")}


def _fields(record: Record) -> dict[str, str]:
    if is_loss_record(record):
        return _loss_fields(record)
    name = get_field(record, "rule", "name") or get_field(record, "rule", "id") or ""
    packets = get_field(record, "npaudit", "aggregate", "packets")
    coarsened = get_field(record, "npaudit", "aggregate", "coarsened")
    if packets is not None and coarsened:  # overload mode: one record for many keys
        packets = f"{packets} ({get_field(record, 'npaudit', 'aggregate', 'keys')} keys, coarsened: {coarsened})"
    disposition = get_field(record, "npaudit", "disposition") or get_field(record, "event", "action")
    return {
        "TIME": safe_text(record.get("@timestamp", "")),
        "SOURCE": _endpoint(record, "source"),
        "DESTINATION": _endpoint(record, "destination"),
        "PROTO": safe_text(get_field(record, "network", "transport")
                           or get_field(record, "network", "iana_number") or ""),
        "DISPOSITION": safe_text(disposition or ""),
        "DIRECTION": safe_text(get_field(record, "network", "direction") or ""),
        "TIER": safe_text(get_field(record, "rule", "category") or ""),
        "POLICY": safe_text(get_field(record, "rule", "ruleset") or ""),
        "RULE": safe_text(name),
        "COUNT": safe_text(packets if packets is not None else ""),
        "NODE": safe_text(get_field(record, "observer", "hostname") or ""),
    }


def _record(match: Match) -> Record | None:
    raw, record = match
    if record is None:
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
    return record if isinstance(record, dict) else None


class Output(Protocol):
    def write(self, matches: Iterable[Match]) -> int:
        """Write `matches`; returns how many."""
        ...

    def flush(self) -> None:
        """Put out everything written so far (the table aligns what it holds, then prints it)."""
        ...


class _Json:
    def __init__(self, out: IO[bytes]) -> None:
        self._out = out

    def write(self, matches: Iterable[Match]) -> int:
        n = 0
        write = self._out.write
        for raw, _ in matches:
            write(raw + b"\n")
            n += 1
        return n

    def flush(self) -> None:
        self._out.flush()


class _Compact:
    def __init__(self, out: IO[bytes], colour: bool) -> None:
        self._out, self._colour = out, colour

    def write(self, matches: Iterable[Match]) -> int:
        n = 0
        for match in matches:
            record = _record(match)
            if record is None:
                continue
            f = _fields(record)
            disposition = _paint(f["DISPOSITION"], self._colour)
            if f["DISPOSITION"] == "LOSS":  # the record's message says it best
                line = f"{f['TIME']} {f['NODE'] or '-'}: {disposition} {safe_text(record.get('message', ''))}"
                self._out.write(line.encode("utf-8", "replace") + b"\n")
                n += 1
                continue
            rule = f["RULE"] and f"rule={f['RULE']}"
            where = " ".join(x for x in (f["DIRECTION"], f["TIER"], f["POLICY"], rule) if x)
            line = (f"{f['TIME']} {f['NODE'] or '-'}: {f['SOURCE']} -> {f['DESTINATION']} {f['PROTO'] or '-'} "
                    f"{disposition} x{f['COUNT'] or 1} ({where})")
            self._out.write(line.encode("utf-8", "replace") + b"\n")
            n += 1
        return n

    def flush(self) -> None:
        self._out.flush()


def _paint(text: str, colour: bool, width: int = 0) -> str:
    padded = text.ljust(width)
    code = _COLOURS.get(text) if colour else None
    return f"{code}{text}{_RESET}{padded[len(text):]}" if code else padded


class _Table:
    """Columns as wide as the widest value seen so far: rows are held until flush (or a full
    batch), so a batch is aligned as a whole and widths only grow from one batch to the next."""

    COLUMNS = ("TIME", "SOURCE", "DESTINATION", "PROTO", "DISPOSITION", "TIER", "POLICY", "RULE", "COUNT")
    BATCH = 512

    def __init__(self, out: IO[bytes], colour: bool) -> None:
        self._out, self._colour = out, colour
        self._rows: list[dict[str, str]] = []
        self._widths = {c: len(c) for c in self.COLUMNS}
        self._header = False

    def write(self, matches: Iterable[Match]) -> int:
        n = 0
        for match in matches:
            record = _record(match)
            if record is not None:
                self._rows.append(_fields(record))
                n += 1
                if len(self._rows) >= self.BATCH:
                    self.flush()
        return n

    def flush(self) -> None:
        if not self._rows:
            self._out.flush()
            return
        widths = self._widths
        for row in self._rows:
            for c in self.COLUMNS:
                widths[c] = max(widths[c], len(row[c]))
        lines = []
        if not self._header:
            lines.append("  ".join(c.ljust(widths[c]) for c in self.COLUMNS).rstrip())
            self._header = True
        for row in self._rows:
            cells = [_paint(row[c], self._colour, widths[c]) if c == "DISPOSITION" else
                     row[c].rjust(widths[c]) if c == "COUNT" else row[c].ljust(widths[c]) for c in self.COLUMNS]
            lines.append("  ".join(cells).rstrip())
        self._rows = []
        self._out.write(("\n".join(lines) + "\n").encode("utf-8", "replace"))
        self._out.flush()


def make_output(form: str, out: IO[bytes], *, colour: bool = False) -> Output:
    """The writer of output form `form` (one of FORMATS) to the binary stream `out`."""
    if form == "json":
        return _Json(out)
    if form == "compact":
        return _Compact(out, colour)
    if form == "table":
        return _Table(out, colour)
    raise ValueError(f"unknown output form {form!r}")
