"""A real engine with the sample manifests applied and one Pod running, asked `get` requests over the local API
(tests of `npaudit get` and of the API's answer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from policy_agent.engine import PolicyEngine
from policy_agent.policy.manifests import load_path
from policy_agent.policy.rules import RuleRegistry
from policy_agent.sources.local_api import LocalApi
from tests.support.engine_doubles import Info, MirrorChannel

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"


def ask(*requests: dict[str, Any]) -> tuple[list[dict[str, Any]], MirrorChannel]:
    """Apply the samples to a real engine, start y/a (port 7), and ask the local API each request."""
    channel = MirrorChannel()

    async def main() -> list[dict[str, Any]]:
        engine = PolicyEngine(channel, RuleRegistry(), round_=1, meters=lambda: True)
        objs = load_path(SAMPLES)
        await engine.apply(objs.namespaces, objs.pods, objs.tiers, objs.policies)
        await engine.pod_added(Info("y", "a", "10.244.0.7", "02:00:0a:f4:00:07", 7))  # type: ignore[arg-type]
        api = LocalApi(Path("/nonexistent/api.sock"), engine)
        return [await api.handle({"op": "get", **r}) for r in requests]
    return asyncio.run(main()), channel
