"""Exceptions raised by the policy agent package."""

from __future__ import annotations

import re


class AgentError(Exception):
    """Base class for everything policy_agent raises."""


class OvsError(AgentError):
    """Starting, stopping or configuring Open vSwitch failed; the text names what and where."""


class PolicyRejected(AgentError):
    """A policy change contradicts the engine's state or cannot be compiled; nothing was applied.
    `errors` has one line per problem, naming the object and field."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class ApplyFailed(AgentError):
    """The switch or the store did not take a policy change; nothing was applied."""


# C0/C1 controls, DEL, line/paragraph separators, bidi overrides and lone surrogates: what could
# move a terminal's cursor, forge a log line, reorder text, or fail to encode as UTF-8.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with what _UNPRINTABLE matches written as Python escapes (\\x1b, \\n, \\ud800): safe to print or log."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(exc: BaseException) -> str:
    """An exception as one printable line: its type and text."""
    return printable(f"{type(exc).__name__}: {exc}")
