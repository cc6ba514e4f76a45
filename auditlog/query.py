"""`npaudit logs` filters: parsing filter and time arguments, and matching audit record lines.

Semantics (those of `hubble observe`):
- Values of one kind are ORed: `--pod a --pod b` shows records of either Pod.
- Kinds are ANDed: `--pod a --disposition drop` shows a's dropped records.
- `--not` negates the filter after it. The negated filters form a second group
  with the same rules, and a record is hidden when it matches that whole group:
  `--not -n kube-system --not --disposition allow` hides the allowed records of
  kube-system, not every kube-system record and every allowed one.

Matching is two-step for speed: a cheap substring test for the text every matching
record must contain (found with bytes.find in a whole block of lines when it is
rare, so most lines are never looked at one by one), then the exact test on the
parsed record. A value whose JSON form is not its plain text
(quotes, backslashes, non-ASCII, controls) gets no substring test, since a copy
re-encoded by another tool may escape it differently.
"""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import orjson
from dateutil.parser import isoparse

from auditlog.errors import AuditLogError
from auditlog.packet import transport_name

__all__ = ["FILTER_KINDS", "Filter", "Match", "Query", "QueryError", "format_timestamp", "get_field", "parse_time",
           "record_time"]

Record = dict[str, Any]
Match = tuple[bytes, "Record | None"]  # (the raw line without its b"\n", the record if it was parsed)


class QueryError(AuditLogError):
    """A filter or time argument that cannot be used; the text is the one line to print."""


@dataclass(frozen=True)
class Filter:
    """One filter from the command line: its kind (the option name without dashes), value, and --not."""

    kind: str
    value: str
    negated: bool = False


def get_field(record: Record, *keys: str) -> Any:
    """record[k1][k2]...; None where a member is missing or not an object."""
    value: Any = record
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _pod(record: Record, side: str) -> tuple[Any, Any] | None:
    pod = get_field(record, "npaudit", side, "pod")
    return (pod.get("namespace"), pod.get("name")) if isinstance(pod, dict) else None


@functools.lru_cache(maxsize=65536)  # a node sees few distinct addresses; parsing one costs µs
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _plain(text: str) -> bytes | None:
    """`text` as it must appear in any JSON encoding of it, or None if encoders may differ."""
    if text and text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text.encode("ascii")
    return None


RecordTest = Callable[[Record], bool]


@dataclass(frozen=True)
class _Parsed:
    test: RecordTest
    needle: bytes | None  # text any matching line contains, if there is a safe one


def _pod_filter(value: str, sides: Sequence[str]) -> _Parsed:
    namespace, slash, prefix = value.rpartition("/")
    if not value or (slash and not namespace) or "/" in namespace:
        raise QueryError(f"'{value}': not a Pod ([namespace/]name-prefix)")
    ns = namespace if slash else None

    def test(record: Record) -> bool:
        for side in sides:
            pod = _pod(record, side)
            if pod is not None and (ns is None or pod[0] == ns) and isinstance(pod[1], str) \
                    and pod[1].startswith(prefix):
                return True
        return False
    return _Parsed(test, _plain(prefix) or _plain(namespace))


def _namespace_filter(value: str, sides: Sequence[str] = ("source", "destination")) -> _Parsed:
    if not value or "/" in value:
        raise QueryError(f"'{value}': not a namespace name")
    return _Parsed(lambda r: any((_pod(r, s) or (None,))[0] == value for s in sides), _plain(value))


def _ip_filter(value: str, sides: Sequence[str]) -> _Parsed:
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        raise QueryError(f"'{value}': not an IP address or CIDR") from exc
    single = network.num_addresses == 1

    def test(record: Record) -> bool:
        for side in sides:
            text = get_field(record, side, "ip")
            addr = _address(text) if isinstance(text, str) else None
            if addr is not None and addr in network:
                return True
        return False
    return _Parsed(test, _plain(str(network.network_address)) if single else None)


def _port_filter(value: str, sides: Sequence[str] = ("source", "destination")) -> _Parsed:
    if not value.isdigit() or int(value) > 65535:
        raise QueryError(f"'{value}': not a port (0-65535)")
    port = int(value)
    return _Parsed(lambda r: any(get_field(r, side, "port") == port for side in sides), str(port).encode())


_TRANSPORTS = {name for name in map(transport_name, range(256)) if name}
_TRANSPORT_ALIASES = {"icmpv6": "ipv6-icmp", "icmp6": "ipv6-icmp"}


def _protocol_filter(value: str) -> _Parsed:
    if value.isdigit() and int(value) <= 255:
        number = value.lstrip("0") or "0"
        return _Parsed(lambda r: str(get_field(r, "network", "iana_number")) == number, number.encode())
    name = _TRANSPORT_ALIASES.get(value.lower(), value.lower())
    if name not in _TRANSPORTS:
        raise QueryError(f"'{value}': not a protocol ({', '.join(sorted(_TRANSPORTS))} or a number 0-255)")
    return _Parsed(lambda r: get_field(r, "network", "transport") == name, f'"{name}"'.encode())


def _choice_filter(value: str, choices: dict[str, str], keys: Sequence[str]) -> _Parsed:
    wanted = choices.get(value.lower())
    if wanted is None:
        raise QueryError(f"'{value}': not one of {', '.join(choices)}")
    return _Parsed(lambda r: get_field(r, *keys) == wanted, f'"{wanted}"'.encode())


_DISPOSITIONS = {"allow": "Allow", "drop": "Drop", "reject": "Reject", "pass": "Pass"}
# hubble observe --verdict: what Cilium calls FORWARDED and DROPPED (a Reject drops the packet too); our
# dispositions are accepted as well.
_VERDICTS = {"forwarded": ("Allow",), "dropped": ("Drop", "Reject"),
             **{name: (disposition,) for name, disposition in _DISPOSITIONS.items()}}


def _verdict_filter(value: str) -> _Parsed:
    wanted = _VERDICTS.get(value.lower())
    if wanted is None:
        raise QueryError(f"'{value}': not a verdict (FORWARDED, DROPPED, or allow, drop, reject, pass)")
    return _Parsed(lambda r: get_field(r, "npaudit", "disposition") in wanted,
                   f'"{wanted[0]}"'.encode() if len(wanted) == 1 else None)
_DIRECTIONS = {"ingress": "ingress", "egress": "egress"}


def _text_filter(value: str, keys: Sequence[str]) -> _Parsed:
    if not value:
        raise QueryError("an empty value")
    return _Parsed(lambda r: get_field(r, *keys) == value, _plain(value))


def _policy_filter(value: str) -> _Parsed:
    """rule.ruleset is Kind:[namespace/]name; match it whole, without the kind, or by name alone."""
    if not value:
        raise QueryError("an empty value")

    def test(record: Record) -> bool:
        ruleset = get_field(record, "rule", "ruleset")
        if not isinstance(ruleset, str):
            return False
        where = ruleset.partition(":")[2]
        return value in (ruleset, where, where.rpartition("/")[2])
    return _Parsed(test, _plain(value))


def _rule_filter(value: str) -> _Parsed:
    if not value:
        raise QueryError("an empty value")
    return _Parsed(lambda r: value in (get_field(r, "rule", "name"), get_field(r, "rule", "id")), _plain(value))


def _tier_filter(value: str) -> _Parsed:
    if not value:
        raise QueryError("an empty value")
    low = value.lower()
    return _Parsed(lambda r: str(get_field(r, "rule", "category")).lower() == low, None)


_PARSERS: dict[str, Callable[[str], _Parsed]] = {
    "pod": lambda v: _pod_filter(v, ("source", "destination")),
    "from-pod": lambda v: _pod_filter(v, ("source",)),
    "to-pod": lambda v: _pod_filter(v, ("destination",)),
    "namespace": _namespace_filter,
    "from-namespace": lambda v: _namespace_filter(v, ("source",)),
    "to-namespace": lambda v: _namespace_filter(v, ("destination",)),
    "policy": _policy_filter,
    "rule": _rule_filter,
    "tier": _tier_filter,
    "disposition": lambda v: _choice_filter(v, _DISPOSITIONS, ("npaudit", "disposition")),
    "direction": lambda v: _choice_filter(v, _DIRECTIONS, ("network", "direction")),
    "ip": lambda v: _ip_filter(v, ("source", "destination")),
    "from-ip": lambda v: _ip_filter(v, ("source",)),
    "to-ip": lambda v: _ip_filter(v, ("destination",)),
    "port": _port_filter,
    "from-port": lambda v: _port_filter(v, ("source",)),
    "to-port": lambda v: _port_filter(v, ("destination",)),
    "verdict": _verdict_filter,
    "protocol": _protocol_filter,
    "label": lambda v: _text_filter(v, ("labels", "log_label")),
    "node": lambda v: _text_filter(v, ("observer", "hostname")),
}
FILTER_KINDS = tuple(_PARSERS)


class _Group:
    """Filters ANDed across kinds, ORed within a kind."""

    def __init__(self, parsed: dict[str, list[_Parsed]]) -> None:
        self.kinds = [[p.test for p in values] for values in parsed.values()]
        # One needle tuple per kind whose every value has one: a line must contain one of each.
        self.needles = [tuple(p.needle for p in values if p.needle is not None) for values in parsed.values()
                        if all(p.needle is not None for p in values)]

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def may_contain(self, data: bytes) -> bool:
        return all(any(n in data for n in needles) for needles in self.needles)

    def matches(self, record: Record) -> bool:
        return all(any(test(record) for test in tests) for tests in self.kinds)


# The writer's timestamp: UTC, milliseconds, fixed width, so strings compare as times.
_TS_PREFIX = b'{"@timestamp":"'
_TS_END = len(_TS_PREFIX) + 24
_TS_FORM = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def format_timestamp(when: dt.datetime) -> str:
    """`when` as the record writes @timestamp (UTC, milliseconds, truncated)."""
    utc = when.astimezone(dt.timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


_RELATIVE = re.compile(r"(?:\d+[smhd])+")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(option: str, text: str, now: dt.datetime) -> dt.datetime:
    """A --since/--until value: a duration before `now` (30s, 10m, 2h, 7d, 1h30m) or an RFC 3339 /
    ISO 8601 time (a time without an offset is UTC, as every record is)."""
    value = text.strip()
    if _RELATIVE.fullmatch(value):
        seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"(\d+)([smhd])", value))
        try:
            return now - dt.timedelta(seconds=seconds)
        except OverflowError as exc:  # before year 1: no record is that old
            raise QueryError(f"{option} '{text}': reaches back before the year 1") from exc
    try:
        when = isoparse(value)
    except (ValueError, OverflowError) as exc:
        raise QueryError(f"{option} '{text}': not a duration (30s, 10m, 2h, 7d) "
                         "or an RFC 3339 time (2024-05-01T02:14:03Z)") from exc
    return when.replace(tzinfo=dt.timezone.utc) if when.tzinfo is None else when


def record_time(raw: bytes, record: Record | None = None) -> str | None:
    """@timestamp of a line in the writer's form, or None if it has none."""
    if raw.startswith(_TS_PREFIX) and raw[_TS_END:_TS_END + 1] == b'"':
        return raw[len(_TS_PREFIX):_TS_END].decode("ascii", "replace")
    if record is None:
        record = _parse(raw)
    stamp = record.get("@timestamp") if record is not None else None
    if not isinstance(stamp, str):
        return None
    if _TS_FORM.fullmatch(stamp):
        return stamp
    try:  # another tool's form of the same time
        when = isoparse(stamp)
    except (ValueError, OverflowError):
        return None
    return format_timestamp(when.replace(tzinfo=dt.timezone.utc) if when.tzinfo is None else when)


def _parse(raw: bytes) -> Record | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class Query:
    """The filters and time window of one `npaudit logs` run."""

    def __init__(self, filters: Iterable[Filter] = (), *, since: dt.datetime | None = None,
                 until: dt.datetime | None = None) -> None:
        groups: tuple[dict[str, list[_Parsed]], dict[str, list[_Parsed]]] = ({}, {})
        for f in filters:
            parser = _PARSERS.get(f.kind)
            if parser is None:
                raise QueryError(f"unknown filter --{f.kind}")
            try:
                parsed = parser(f.value)
            except QueryError as exc:
                raise QueryError(f"--{f.kind} {exc}") from exc
            groups[f.negated].setdefault(f.kind, []).append(parsed)
        if since is not None and until is not None and since > until:
            raise QueryError(f"--since {format_timestamp(since)} is after --until {format_timestamp(until)}")
        self._allow, self._deny = _Group(groups[0]), _Group(groups[1])
        self._since = format_timestamp(since) if since is not None else None
        self._until = format_timestamp(until) if until is not None else None

    def match(self, raw: bytes) -> tuple[bool, Record | None]:
        """Whether the line `raw` is shown, and its record if matching parsed it.

        Lines that are not a JSON object are never shown when a filter needs the record;
        without one, every complete line is (as cat would: `npaudit verify` judges them).
        """
        record = None
        if self._allow:
            if not self._allow.may_contain(raw):
                return False, None
            record = _parse(raw)
            if record is None or not self._allow.matches(record):
                return False, record
        if self._deny and self._deny.may_contain(raw):  # without its texts a line cannot be hidden
            if record is None:
                record = _parse(raw)
            if record is None or self._deny.matches(record):
                return False, record
        if self._since is not None or self._until is not None:
            stamp = record_time(raw, record)
            if stamp is None or (self._since is not None and stamp < self._since) \
                    or (self._until is not None and stamp > self._until):
                return False, record
        return True, record

    def select(self, blocks: Iterable[bytes]) -> Iterator[Match]:
        """The matching lines of `blocks` (each a run of complete lines, ending in b"\\n"), in order."""
        match, needles = self.match, self._allow.needles
        for block in blocks:
            lines = _rare_lines(block, needles) if needles else None
            for line in block.split(b"\n")[:-1] if lines is None else lines:
                shown, record = match(line)
                if shown:
                    yield line, record


def _rare_lines(block: bytes, needles: list[tuple[bytes, ...]]) -> list[bytes] | None:
    """The lines of `block` holding a needle of the kind whose needles occur least, found with
    bytes.find (a selective filter skips most lines without a Python step per line);
    None when that kind is common enough that splitting every line is cheaper."""
    kind = needles[0] if len(needles) == 1 else min(needles, key=lambda k: sum(block.count(n) for n in k))
    most = len(block) >> 12  # more than a hit per 4 KiB (about 6 lines): split instead
    ends: dict[int, int] = {}
    for needle in kind:
        pos = block.find(needle)
        while pos >= 0:
            if len(ends) > most:
                return None
            start = block.rfind(b"\n", 0, pos) + 1
            end = block.find(b"\n", pos)
            ends[start] = end
            pos = block.find(needle, end)
    return [block[start:ends[start]] for start in sorted(ends)]
