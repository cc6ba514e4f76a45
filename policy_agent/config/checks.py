"""Checks for configuration fields: bounded numbers, absolute paths, interface and namespace names, record names."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable

U32_MAX = (1 << 32) - 1   # OVS meter rates and bursts are 32-bit
QUEUE_MAX = 10_000_000    # records or packet-ins held in memory: far above any useful backlog


def bounded(low: float, high: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if low <= v <= high else f"must be between {low} and {high}, got {v}"
    return check


def ovs_queue_size(v: int) -> str | None:
    return None if 1 <= v <= 512 else f"must be between 1 and 512 (OVS limit), got {v}"


_OR_NONE = ' (or "" for none)'


def absolute_path(v: str, *, optional: bool = False) -> str | None:
    # The agent runs from / under systemd: a relative path would land somewhere nobody looks.
    if optional and v == "":
        return None
    if not v.startswith("/"):
        return f"must be an absolute path{_OR_NONE if optional else ''}, got {v!r}"
    # No file system takes a NUL; a line break would forge lines of the logs that name the path.
    if any(unicodedata.category(c) == "Cc" for c in v):
        return f"must not contain NUL, control characters or line breaks, got {v!r}"
    return None


def file_path(v: str, *, optional: bool = False) -> str | None:
    """An absolute path naming a file: not "/" nor a directory spelled with a trailing "/", "." or ".."."""
    problem = absolute_path(v, optional=optional)
    if problem or v == "":
        return problem
    if v.endswith("/") or v.rsplit("/", 1)[1] in (".", ".."):
        return f"must name a file (not a directory), got {v!r}"
    return None


def optional_path(v: str) -> str | None:
    return absolute_path(v, optional=True)


def optional_file(v: str) -> str | None:
    return file_path(v, optional=True)


# Linux IFNAMSIZ is 16 including the NUL; OVS makes an interface of the bridge's name.
_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
# A network namespace is a file in /var/run/netns: one path component.
_NETNS = re.compile(r"[A-Za-z0-9_.-]{1,255}")


def interface_name(v: str) -> str | None:
    if _IFNAME.fullmatch(v):
        return None
    return f"must be an interface name: 1-15 of A-Z a-z 0-9 _ . - (not first: _ . -), got {v!r}"


def netns_name(v: str) -> str | None:
    if v == "" or (_NETNS.fullmatch(v) and v not in (".", "..")):
        return None
    return f"must be a network namespace name: 1-255 of A-Z a-z 0-9 _ . - (not . or ..), or \"\", got {v!r}"


def record_name(v: str) -> str | None:
    # Written into every record and log line: a line break or escape sequence would forge lines.
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in v):
        return f"must not contain control characters or line breaks, got {v!r}"
    return None if len(v) <= 253 else f"must be at most 253 characters, got {len(v)}"


def fraction(v: Any) -> str | None:
    return None if 0 < v <= 1 else f"must be > 0 and <= 1, got {v}"


def listen_address(v: str) -> str | None:
    if v == "":
        return None
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"must be HOST:PORT (or \"\" to disable), got {v!r}"
    return None


def checked(fn: Callable[[Any], str | None]) -> dict[str, Any]:
    """Field metadata: the check the loader applies to the field's value."""
    return {"check": fn}


def positive(v: Any) -> str | None:
    return None if v > 0 else f"must be > 0, got {v}"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}; got {v!r}"
    return check
