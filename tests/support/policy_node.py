"""The agent's policy side (channel, engine, local API, applied store) on a fake switch, for tests
of applies and Pod hooks."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest

from policy_agent.engine import PolicyEngine
from policy_agent.policy.rules import RuleRegistry
from policy_agent.sources.applied_store import AppliedStore
from policy_agent.sources.local_api import LocalApi
from tests.support.channel_rig import rig


@pytest.fixture
def state_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npa-txn-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@dataclass
class Node:
    """The agent's policy side on a fake switch: channel, engine, local API, applied store."""

    r: Any
    engine: PolicyEngine
    api: LocalApi
    store_path: Path

    async def request(self, op: str, text: str) -> dict[str, Any]:
        return await self.api.handle({"op": op, "manifests": textwrap.dedent(text), "source": "test"})

    def switch_table(self) -> set[Any]:
        return set(self.r.fake.flows)

    def blocks_81(self) -> bool:
        return any(("tcp_dst", 81) in f.match.items() for f in self.r.fake.flows.values())


@contextlib.asynccontextmanager
async def node(path: str, state: Path) -> AsyncIterator[Node]:
    async with rig(path, request_timeout=10.0) as r:
        engine = PolicyEngine(r.chan, RuleRegistry(), round_=1, meters=lambda: True)
        await engine.start()
        store_path = state / "applied.yaml"
        yield Node(r, engine, LocalApi(state / "api.sock", engine, AppliedStore(store_path)), store_path)
