"""The exception hierarchy of the rate-limiting package (meters)."""

from __future__ import annotations


class MeterError(Exception):
    """Base of every error raised by meters/."""


class InvalidOffloadEntry(MeterError, ValueError):
    """An XDP offload key or rule whose fields do not fit the map layout."""


class OffloadUnavailable(MeterError):
    """The eBPF tier cannot run here (no bcc, no kernel headers, no CAP_BPF, program rejected)."""


class OffloadError(MeterError):
    """An operation on a loaded XDP offload failed (attach, detach, map update)."""
