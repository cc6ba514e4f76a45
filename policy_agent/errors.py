"""Exceptions raised by the policy agent package."""

from __future__ import annotations


class AgentError(Exception):
    """Base class for everything policy_agent raises."""


class OvsError(AgentError):
    """Starting, stopping or configuring Open vSwitch failed; the text names what and where."""
