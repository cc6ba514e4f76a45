"""Test doubles around the PolicyEngine: Pod info, channels that record or mirror what the engine
sends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from packetin import messages
from policy_agent.policy.model import (
    Action,
    AppliedTo,
    Direction,
    LabelSelector,
    Policy,
    PolicyKind,
    Rule,
)


class RecordingChannel:
    """A FlowProgrammer that confirms everything at once and records each call in order."""

    def __init__(self) -> None:
        # ("install" | "delete", flows), or ("commit", installed + deleted) for one atomic bundle
        self.calls: list[tuple[str, list[messages.FlowSpec]]] = []
        self.commits: list[tuple[list[messages.FlowSpec], list[messages.FlowSpec]]] = []

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        self.calls.append(("install", list(flows)))

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        self.calls.append(("delete", list(flows)))

    async def commit_flows(self, install: Sequence[messages.FlowSpec], delete: Sequence[messages.FlowSpec]) -> None:
        self.calls.append(("commit", [*install, *delete]))
        self.commits.append((list(install), list(delete)))

    async def install_meters(self, meters: Sequence[messages.MeterSpec]) -> None:
        self.calls.append(("meters", []))


@dataclass
class Info:
    namespace: str
    name: str
    ip: str
    mac: str
    ofport: int


def drop_web(name: str = "drop-web", label: str = "web") -> Policy:
    return Policy(PolicyKind.ACNP, name, tier="application", priority=1,
                  applied_to=(AppliedTo(pod_selector=LabelSelector((("app", label),))),),
                  rules=(Rule(Direction.INGRESS, Action.DROP),))


class MirrorChannel:
    """A FlowProgrammer that keeps the flow table a switch would hold after each call."""

    def __init__(self) -> None:
        self.flows: dict[Any, messages.FlowSpec] = {}

    async def install_flows(self, flows: Any) -> None:
        self.flows.update((f.key, f) for f in flows)

    async def delete_flows(self, flows: Any) -> None:
        for f in flows:
            self.flows.pop(f.key, None)

    async def commit_flows(self, install: Any, delete: Any) -> None:
        await self.install_flows(install)
        await self.delete_flows(delete)

    async def install_meters(self, meters: Any) -> None:
        pass
