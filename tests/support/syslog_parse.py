"""An independent, strict RFC 5424 / RFC 6587 reader for tests: frames and messages back to fields."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(rb"<(\d{1,3})>(\d{1,2}) (\S+) (\S+) (\S+) (\S+) (\S+) ")


@dataclass(frozen=True)
class Message:
    """One parsed RFC 5424 message."""

    facility: int
    severity: int
    version: int
    timestamp: str
    hostname: str
    app_name: str
    procid: str
    msgid: str
    sd: dict[str, dict[str, str]]
    msg: bytes


def split_octet_counted(stream: bytes) -> tuple[list[bytes], bytes]:
    """(messages, unconsumed rest) of an octet-counted stream ("LEN SP MSG" ...)."""
    out: list[bytes] = []
    pos = 0
    while True:
        space = stream.find(b" ", pos)
        if space < 0:
            return out, stream[pos:]
        digits = stream[pos:space]
        if not digits.isdigit() or digits.startswith(b"0"):
            raise ValueError(f"bad octet count {digits[:20]!r} at {pos}")
        end = space + 1 + int(digits)
        if end > len(stream):
            return out, stream[pos:]
        out.append(stream[space + 1:end])
        pos = end


def _parse_sd(data: bytes, pos: int) -> tuple[dict[str, dict[str, str]], int]:
    sd: dict[str, dict[str, str]] = {}
    if data[pos:pos + 1] == b"-":
        return sd, pos + 1
    while data[pos:pos + 1] == b"[":
        m = re.compile(rb"([^= \]\"]+)").match(data, pos + 1)
        if m is None:
            raise ValueError(f"bad SD-ID at {pos}")
        sd_id, pos = m[1].decode("ascii"), m.end()
        params: dict[str, str] = {}
        while data[pos:pos + 1] == b" ":
            m = re.compile(rb'([^= \]"]+)="').match(data, pos + 1)
            if m is None:
                raise ValueError(f"bad SD-PARAM at {pos}")
            name, pos = m[1].decode("ascii"), m.end()
            value = bytearray()
            while True:
                c = data[pos:pos + 1]
                if not c:
                    raise ValueError("unterminated PARAM-VALUE")
                if c == b"\\" and data[pos + 1:pos + 2] in (b'"', b"\\", b"]"):
                    value += data[pos + 1:pos + 2]
                    pos += 2
                    continue
                if c == b'"':
                    pos += 1
                    break
                if c == b"]":
                    raise ValueError("unescaped ] in PARAM-VALUE")
                value += c
                pos += 1
            params[name] = value.decode("utf-8")
        if data[pos:pos + 1] != b"]":
            raise ValueError(f"SD-ELEMENT not closed at {pos}")
        pos += 1
        sd[sd_id] = params
    return sd, pos


def parse_message(data: bytes) -> Message:
    """The fields of one RFC 5424 message; ValueError if it does not follow the grammar."""
    m = _HEADER.match(data)
    if m is None:
        raise ValueError(f"not an RFC 5424 header: {data[:80]!r}")
    pri = int(m[1])
    if pri > 191:
        raise ValueError(f"PRI {pri} out of range")
    fields = [f.decode("ascii") for f in m.groups()[2:]]
    for f in fields:
        if not all(0x21 <= ord(c) <= 0x7E for c in f):
            raise ValueError(f"header field {f!r} is not PRINTUSASCII")
    sd, pos = _parse_sd(data, m.end())
    if pos == len(data):
        msg = b""
    elif data[pos:pos + 1] == b" ":
        msg = data[pos + 1:]
    else:
        raise ValueError(f"no SP after STRUCTURED-DATA at {pos}")
    return Message(pri // 8, pri % 8, int(m[2]), fields[0], fields[1], fields[2], fields[3], fields[4], sd, msg)
