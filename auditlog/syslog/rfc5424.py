r"""RFC 5424 messages and RFC 6587 / RFC 5425 framing for audit records: pure functions, bytes out.

One audit line becomes one message::

    <PRI>1 TIMESTAMP HOSTNAME npaudit - MSGID [npaudit@32473 seq="N" chain="HEX"] MSG

- PRI = facility * 8 + severity. Facility is configured (default local0 = 16).
  Severity and MSGID per disposition (SEVERITY / MSGID below):

  ===========  ========  ==================
  disposition  MSGID     severity
  ===========  ========  ==================
  Allow        ALLOW     6 informational
  Pass         PASS      6 informational
  Drop         DROP      4 warning
  Reject       REJECT    4 warning
  (none)       STATE     5 notice  (the writer's own records, e.g. a chain restart after a torn write)
  (none)       STATE     4 warning (a loss record: packet-ins or records the trail lacks, and a chain
                                   restart naming records a stopped writer never wrote)
  ===========  ========  ==================

  Drop and Reject are "warning", not "notice", so that a receiver filtering on
  severity <= warning keeps the denials and every record saying the trail is incomplete.
- TIMESTAMP is the record's ``@timestamp`` (RFC 3339, milliseconds, ``Z``); a value
  that is not a valid RFC 5424 TIMESTAMP becomes ``-``.
- HOSTNAME is the node name if it is 1..255 PRINTUSASCII characters (``!``..``~``),
  else ``-`` (the record carries ``observer.hostname`` anyway): a hostile name can
  never shift the header fields.
- STRUCTURED-DATA ``npaudit@32473`` (32473 is the documentation enterprise number of
  RFC 5612) carries ``seq`` and ``chain``; PARAM-VALUEs escape ``"``, ``\`` and ``]``
  with a backslash (RFC 5424 §6.3.3). A shortened message adds ``original_bytes``.
- MSG is the record line exactly as in the file, without its newline and without a
  BOM: the canonical encoder (auditlog.chain) writes pure ASCII, which is valid as
  MSG-ANY and as UTF-8, and a BOM would end up in front of the JSON that receivers
  parse (rsyslog's mmjsonparse would then refuse it).

Framing: octet counting ``LEN SP MSG`` (RFC 6587 §3.4.1, RFC 5425 §4.3) on TCP and
TLS by default, or LF framing (``MSG LF``; a record line never contains a raw LF);
UDP sends one message per datagram, no framing.

UDP datagrams are capped (default 2048 bytes, the size RFC 5424 §6.1 says receivers
SHOULD accept; at least 1024, room for a stub after any header). A longer message keeps its header and
structured data and replaces MSG by a stub that is still one JSON object::

    {"@timestamp":..,"event":{"action":..,"id":..},
     "npaudit":{"chain":..,"disposition":..,"original_bytes":N,"seq":..,"truncated":true}}

so a receiver still sees which record was shortened; the file keeps it whole.

A test message (``npaudit syslog test``) is marked three times, so no receiver
filter and no reader of a forwarded copy can take it for an audit record: MSGID
``TEST``, structured data ``[npaudit@32473 test="true" id="ID"]`` with no seq and
no chain, and a MSG object with ``"npaudit":{"test":true}`` and a ``message``
that says it is not part of the hash chain. It is never written to the audit files.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from auditlog.chain import encode
from auditlog.syslog.errors import SyslogConfigError, SyslogFormatError

__all__ = ["APP_NAME", "DEFAULT_FACILITY", "DEFAULT_UDP_MAX_BYTES", "FACILITIES", "MIN_UDP_MAX_BYTES", "MSGID",
           "SD_ID", "SEVERITY", "TEST_MSGID", "TEST_PARAM", "Encoded", "FrameEncoder", "Framing", "Header",
           "RecordFields", "decode_message", "encode_record", "encode_test_message", "facility_code", "frame",
           "header_hostname", "record_fields", "rfc3339_millis", "sd_escape", "states_loss", "valid_timestamp"]

APP_NAME = "npaudit"
SD_ID = "npaudit@32473"
DEFAULT_FACILITY = 16           # local0
DEFAULT_UDP_MAX_BYTES = 2048    # RFC 5424 §6.1: receivers SHOULD accept 2048 octets
# RFC 5424 lets a receiver refuse more than 480; we need room for the stub after a
# 255-byte HOSTNAME and the structured data, so the cap may not go below 1024.
MIN_UDP_MAX_BYTES = 1024

# RFC 5424 §6.2.1 table 1.
FACILITIES: dict[str, int] = {
    "kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5, "lpr": 6, "news": 7,
    "uucp": 8, "cron": 9, "authpriv": 10, "ftp": 11, "ntp": 12, "audit": 13, "alert": 14, "clock": 15,
    **{f"local{i}": 16 + i for i in range(8)},
}

SEVERITY: dict[str, int] = {"Allow": 6, "Pass": 6, "Drop": 4, "Reject": 4}
MSGID: dict[str, str] = {"Allow": "ALLOW", "Pass": "PASS", "Drop": "DROP", "Reject": "REJECT"}
_STATE_MSGID, _STATE_SEVERITY = "STATE", 5
_LOSS_SEVERITY = 4  # a record saying the trail lacks something: warning, as its ECS log.level says
TEST_MSGID, _TEST_SEVERITY = "TEST", 5
TEST_PARAM = "test"  # SD-PARAM that marks a test message (value "true")
TEST_TEXT = "npaudit syslog test message: not an audit record, not part of the hash chain"

# RFC 5424 §6.2.3 (RFC 3339 with at most 6 fraction digits); leap second 60 allowed.
_TIMESTAMP = re.compile(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)"
                        r"(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)")
_PRINTUSASCII = re.compile(r"[\x21-\x7e]{1,255}")
_SD_SPECIALS = re.compile(r'(["\\\]])')
_STUB_TEXT_MAX = 64  # longest event.id / event.action copied into a stub


class Framing(enum.Enum):
    """How messages are delimited on the wire."""

    OCTET_COUNTING = "octet-counting"
    LF = "lf"
    DATAGRAM = "datagram"  # UDP: one message per datagram


@dataclass(frozen=True)
class Header:
    """The per-destination part of every message: facility and the node's HOSTNAME."""

    facility: int = DEFAULT_FACILITY
    hostname: str = "-"

    @classmethod
    def for_node(cls, node_name: str, facility: int | str = DEFAULT_FACILITY) -> Header:
        """A header for `node_name` (made safe by header_hostname) and a facility name or code."""
        return cls(facility_code(facility), header_hostname(node_name))


@dataclass(frozen=True)
class Encoded:
    """One message ready to frame: its bytes, the record's seq, and whether MSG was replaced by a stub."""

    message: bytes
    seq: int
    truncated: bool = False


def facility_code(value: int | str) -> int:
    """The facility number of a name ("local0") or number (0..23); SyslogConfigError otherwise."""
    if isinstance(value, bool):
        raise SyslogConfigError(f"syslog facility: {value!r} is not a facility name or 0..23")
    if isinstance(value, int):
        if 0 <= value <= 23:
            return value
    elif isinstance(value, str) and value.lower() in FACILITIES:
        return FACILITIES[value.lower()]
    raise SyslogConfigError(f"syslog facility: {value!r} is not one of {', '.join(FACILITIES)} or 0..23")


def header_hostname(name: str) -> str:
    """`name` if it is a valid RFC 5424 HOSTNAME (1..255 PRINTUSASCII), else the NILVALUE "-"."""
    return name if _PRINTUSASCII.fullmatch(name) else "-"


def sd_escape(value: str) -> str:
    """An SD PARAM-VALUE: `"`, `\\` and `]` escaped with a backslash (RFC 5424 §6.3.3)."""
    return _SD_SPECIALS.sub(r"\\\1", value)


def _structured_data(seq: int, chain: str | None, original_bytes: int | None) -> str:
    params = [f'seq="{seq}"']
    if chain is not None:
        params.append(f'chain="{sd_escape(chain)}"')
    if original_bytes is not None:
        params.append(f'original_bytes="{original_bytes}"')
    return f"[{SD_ID} {' '.join(params)}]"


class RecordFields(NamedTuple):
    """What a message's header takes from a sealed record (a tuple: the tailer makes one per record)."""

    seq: int
    chain: str | None        # None when npaudit.chain is not a string
    disposition: str | None  # None when npaudit.disposition is absent or not a string
    timestamp: str           # @timestamp if it is a valid RFC 5424 TIMESTAMP, else "-"
    # The record states a loss: npaudit.loss is an object (auditlog.loss_records) or npaudit.chain_restart
    # one whose records_lost is a positive integer (a stopped writer's loss note, auditlog.chain).
    loss: bool = False


def states_loss(meta: Mapping[str, Any]) -> bool:
    """Whether the npaudit object `meta` of a record states a loss (RecordFields.loss)."""
    restart = meta.get("chain_restart")
    lost = restart.get("records_lost") if isinstance(restart, Mapping) else None
    return isinstance(meta.get("loss"), Mapping) or (type(lost) is int and lost > 0)


def valid_timestamp(stamp: object) -> str:
    """`stamp` if it is a string that is a valid RFC 5424 TIMESTAMP, else the NILVALUE "-"."""
    return stamp if isinstance(stamp, str) and _TIMESTAMP.fullmatch(stamp) else "-"


def record_fields(record: Mapping[str, Any]) -> RecordFields:
    """The RecordFields of a parsed record; SyslogFormatError if it has no integer npaudit.seq."""
    meta = record.get("npaudit")
    if not isinstance(meta, Mapping) or type(meta.get("seq")) is not int:
        raise SyslogFormatError("record without an integer npaudit.seq")
    chain = meta.get("chain")
    disposition = meta.get("disposition")
    return RecordFields(meta["seq"], chain if isinstance(chain, str) else None,
                        disposition if isinstance(disposition, str) else None,
                        valid_timestamp(record.get("@timestamp")), states_loss(meta))


def _stub(record: Mapping[str, Any], fields: RecordFields, original_bytes: int, with_event: bool) -> bytes:
    stub_meta: dict[str, Any] = {"seq": fields.seq, "truncated": True, "original_bytes": original_bytes}
    for key in ("chain", "disposition"):
        value = getattr(fields, key)
        if value is not None and len(value) <= _STUB_TEXT_MAX:
            stub_meta[key] = value
    stub: dict[str, Any] = {"npaudit": stub_meta}
    if fields.timestamp != "-":
        stub["@timestamp"] = fields.timestamp
    event = record.get("event")
    if with_event and isinstance(event, Mapping):
        kept = {k: event[k] for k in ("id", "action")
                if isinstance(event.get(k), str) and len(event[k]) <= _STUB_TEXT_MAX}
        if kept:
            stub["event"] = kept
    return encode(stub).encode("ascii")


def _parsed(msg: bytes) -> Mapping[str, Any]:
    try:
        value = json.loads(msg)
    except ValueError:  # UnicodeDecodeError is one: a stub without event then
        return {}
    return value if isinstance(value, dict) else {}


def encode_record(record: Mapping[str, Any] | RecordFields, line: bytes, header: Header,
                  max_bytes: int | None = None) -> Encoded:
    """The RFC 5424 message for one sealed record (`line` is its file line, with or without "\\n").

    `record` is the parsed record or, as the tailer gives it without parsing the
    line, its RecordFields. With `max_bytes` (UDP) a longer message gets the stub
    MSG described above; SyslogFormatError if even that does not fit or the
    record is not sealed.
    """
    fields = record if isinstance(record, RecordFields) else record_fields(record)
    seq, chain, disposition, stamp, loss = fields
    msg = line[:-1] if line.endswith(b"\n") else line
    if disposition in MSGID:
        msgid, severity = MSGID[disposition], SEVERITY[disposition]
    else:
        msgid, severity = _STATE_MSGID, _LOSS_SEVERITY if loss else _STATE_SEVERITY
    prefix = f"<{header.facility * 8 + severity}>1 {stamp} {header.hostname} {APP_NAME} - {msgid} "
    message = f"{prefix}{_structured_data(seq, chain, None)} ".encode("ascii") + msg
    if max_bytes is None or len(message) <= max_bytes:
        return Encoded(message, seq)
    parsed = _parsed(msg) if isinstance(record, RecordFields) else record  # the stub takes event.id/action
    head = f"{prefix}{_structured_data(seq, chain, len(msg))} ".encode("ascii")
    for with_event in (True, False):
        shortened = head + _stub(parsed, fields, len(msg), with_event)
        if len(shortened) <= max_bytes:
            return Encoded(shortened, seq, truncated=True)
    raise SyslogFormatError(f"seq {seq}: even a shortened message is longer than {max_bytes} bytes")


class FrameEncoder:
    """`frame(encode_record(...).message, framing)` for one destination, its header parts made once.

    The forwarder's hot path: for a stream destination and a record whose chain
    needs no SD escaping (the tailer's always: 64 hex digits) a frame is two
    string formats (auditlog.syslog.framer makes the same bytes in C); anything
    else goes the general way, with the same bytes.
    """

    def __init__(self, header: Header, framing: Framing, max_bytes: int | None = None) -> None:
        self.header, self.framing, self.max_bytes = header, framing, max_bytes
        self._fast = max_bytes is None and framing is not Framing.DATAGRAM
        self._after_stamp = {
            disposition: f" {header.hostname} {APP_NAME} - {msgid} [{SD_ID} seq=\""
            for disposition, msgid in (*MSGID.items(), (None, _STATE_MSGID))}
        self._pri = {disposition: f"<{header.facility * 8 + severity}>1 "
                     for disposition, severity in (*SEVERITY.items(), (None, _STATE_SEVERITY))}
        # (PRI part, the part after TIMESTAMP) per disposition in MSGID; anything else is a STATE message.
        self._parts: dict[str | None, tuple[str, str]] = {d: (self._pri[d], self._after_stamp[d]) for d in MSGID}
        self._state_parts = (self._pri[None], self._after_stamp[None])
        self._lf = framing is Framing.LF

    @property
    def fast(self) -> bool:
        """Whether records are framed the fast way (a stream, no datagram cap): auditlog.syslog.framer's too."""
        return self._fast

    def head_parts(self, disposition: str | None) -> tuple[str, str]:
        """(the PRI part, the part after TIMESTAMP up to the seq's value) of a fast frame of a record with
        `disposition` that states no loss."""
        return self._parts.get(disposition, self._state_parts)

    def encode(self, fields: RecordFields, line: bytes) -> tuple[bytes, bool]:
        """(the framed message, whether MSG was replaced by a stub); SyslogFormatError as encode_record."""
        seq, chain, disposition, stamp, loss = fields
        if (not self._fast or chain is None or not chain.isascii() or '"' in chain or "\\" in chain or "]" in chain
                or "\n" in chain or line.endswith(b"\n") or loss):  # SD escaping, not ASCII, a LF: the general way
            encoded = encode_record(fields, line, self.header, self.max_bytes)
            return frame(encoded.message, self.framing), encoded.truncated
        pri, after_stamp = self._parts.get(disposition, self._state_parts)
        head = f'{pri}{stamp}{after_stamp}{seq}" chain="{chain}"] '.encode("ascii")
        if self._lf:
            return b"%b%b\n" % (head, line), False  # neither part holds a LF: the tailer split lines on it
        return b"%d %b%b" % (len(head) + len(line), head, line), False


def frame(message: bytes, framing: Framing) -> bytes:
    """`message` delimited for the wire: "LEN SP MSG", "MSG LF", or as is for a datagram."""
    if framing is Framing.OCTET_COUNTING:
        return b"%d %s" % (len(message), message)
    if framing is Framing.LF:
        if b"\n" in message:
            raise SyslogFormatError("a message with a line feed cannot be LF-framed")
        return message + b"\n"
    return message



def rfc3339_millis(now: float) -> str:
    """`now` (seconds since the epoch) as an RFC 5424 TIMESTAMP in UTC with milliseconds."""
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_test_message(header: Header, *, timestamp: str, test_id: str) -> bytes:
    """The marked test message described above (MSGID TEST, no seq, no chain); `test_id` finds it at the receiver."""
    stamp = timestamp if _TIMESTAMP.fullmatch(timestamp) else "-"
    body = {"@timestamp": stamp, "event": {"action": "syslog-test", "dataset": "npaudit.test", "id": test_id,
                                           "kind": "event"},
            "message": TEST_TEXT, "npaudit": {"test": True}}
    if stamp == "-":
        del body["@timestamp"]
    msg = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)  # ASCII: no BOM question
    sd = f'[{SD_ID} {TEST_PARAM}="true" id="{sd_escape(test_id)}"]'
    pri = header.facility * 8 + _TEST_SEVERITY
    return f"<{pri}>1 {stamp} {header.hostname} {APP_NAME} - {TEST_MSGID} {sd} {msg}".encode("ascii")


# --- reading a forwarded message back ---

_SYSLOG_HEADER = re.compile(rb"<[0-9]{1,3}>[1-9][0-9]{0,2}(?: [!-~]+){5} ")
_SD_ELEMENT = re.compile(rb'\[([^ =\]"]+)((?: [^ =\]"]+="(?:[^"\\]|\\.)*")*)\]')
_SD_PARAM = re.compile(rb' ([^ =\]"]+)="((?:[^"\\]|\\.)*)"')
_SD_ID = SD_ID.encode("ascii")
_BOM = b"\xef\xbb\xbf"


def decode_message(line: bytes) -> tuple[bytes, dict[str, str]]:
    """(MSG without a BOM, the params of npaudit@32473) of one RFC 5424 message; ValueError if it is none.

    The reader `npaudit verify` uses on a SIEM copy: lenient about the header, exact about our SD element."""
    head = _SYSLOG_HEADER.match(line)
    if head is None:
        raise ValueError("no RFC 5424 header (<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID)")
    pos, params = head.end(), {}
    if line.startswith(b"-", pos):
        pos += 1
    else:
        while (element := _SD_ELEMENT.match(line, pos)) is not None:
            if element[1] == _SD_ID:
                params = {name.decode("ascii", "replace"): re.sub(rb'\\([\\"\]])', rb"\1", value).decode(
                    "utf-8", "replace") for name, value in _SD_PARAM.findall(element[2])}
            pos = element.end()
        if pos == head.end():
            raise ValueError("no STRUCTURED-DATA after MSGID")
    if pos < len(line) and line[pos:pos + 1] != b" ":
        raise ValueError("STRUCTURED-DATA is not followed by a space")
    msg = line[pos + 1:]
    return (msg[3:] if msg.startswith(_BOM) else msg), params
