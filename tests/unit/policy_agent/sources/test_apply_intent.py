"""An apply interrupted by the agent's end settles to what the switch enforces: the intent is on disk
before the switch can hold the change, the switch's generation marker changes in the same atomic
bundle as the policy flows, and the next start rolls the store forward or back from that marker."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any, AsyncIterator, Coroutine, Iterator

import pytest

from packetin.channel import ChannelSettings, OpenFlowChannel
from policy_agent.cni.state import PodInterfaceInfo
from policy_agent.engine import PolicyEngine
from policy_agent.errors import AgentError
from policy_agent.ovs import tables
from policy_agent.policy.manifests import load_text
from policy_agent.policy.rules import RuleRegistry
from policy_agent.sources import apply_intent
from policy_agent.sources.applied_store import AppliedStore
from policy_agent.sources.apply_intent import (
    INTENT_NAME, NOTHING, ROLLED_BACK, ROLLED_FORWARD, StoreGeneration, StoreIntent, decide, settle_at_start,
)
from tests.support.fake_switch import FakeSwitch

NS = ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n"
      "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: x, labels: {app: web}}\n")
POD_A = PodInterfaceInfo(namespace="x", name="a", container_id="c-a", netns="/run/netns/none", ifname="eth0",
                         ip="10.0.0.2", prefix_len=24, mac="02:00:0a:00:00:02", gateway=None, host_ifname="ha",
                         ofport=5)
DROP_81 = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: drop-81}
    spec:
      priority: 1
      appliedTo: [{podSelector: {matchLabels: {app: web}}}]
      ingress: [{action: Drop, ports: [{protocol: TCP, port: 81}]}]
""")


def run(coro: Coroutine[Any, Any, Any], timeout: float = 20.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.mark.parametrize(("intent", "switch", "store", "outcome"), [
    (None, None, 0, NOTHING),                 # no apply was interrupted
    (None, 4, 4, NOTHING),
    (5, 5, 4, ROLLED_FORWARD),                # the switch took the change: it stays
    (5, 4, 4, ROLLED_BACK),                   # it still holds the store's generation: the change never went in
    (5, None, 4, ROLLED_BACK),                # no marker at all (an OVS restarted empty)
    (5, 6, 4, ROLLED_BACK),
    (5, 5, 5, NOTHING),                       # the store took it already: nothing to settle
    (3, 3, 5, NOTHING),                       # a leftover older than the store
    ((1 << 24) + 3, 3, (1 << 24) + 2, ROLLED_FORWARD),  # the marker keeps 24 bits
])
def test_the_settlement_follows_the_switch(intent: int | None, switch: int | None, store: int, outcome: str) -> None:
    assert decide(intent, switch, store)[0] == outcome


def test_the_marker_carries_the_generation_and_the_round() -> None:
    marker = tables.generation_marker(7, 123)
    assert marker.table == tables.T_GENERATION and marker.cookie >> tables.COOKIE_ROUND_SHIFT == 7
    assert tables.marker_generation(marker.cookie) == 123
    assert tables.generation_marker(7, 124).key == marker.key  # same flow, replaced in place
    assert tables.marker_generation(tables.cookie(7, tables.COOKIE_KIND_POLICY)) is None


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npa-int-", dir="/tmp"))  # AF_UNIX paths are limited to 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Killed(StoreIntent):
    """The agent ends at a step: what the process would have done after it never happens."""

    def __init__(self, store: AppliedStore, op: str, text: str, at: str) -> None:
        super().__init__(store, op, text, lambda: ())
        self.at = at

    def commit(self) -> None:
        if self.at != "before-store":
            super().commit()

    def abandon(self) -> None:
        return None


def switch_generation(fake: FakeSwitch) -> int | None:
    found = [tables.marker_generation(f.cookie) for f in fake.flows.values() if f.table == tables.T_GENERATION]
    assert len(found) <= 1, found
    return found[0] if found else None


def blocks_81(fake: FakeSwitch) -> bool:
    return any(("tcp_dst", 81) in f.match.items() for f in fake.flows.values())


async def apply(engine: PolicyEngine, text: str, persist: Any) -> None:
    objs = load_text(text, "test")
    await engine.apply(objs.namespaces, objs.pods, objs.tiers, objs.policies, persist=persist)


@contextlib.asynccontextmanager
async def agent(sock: str, state: Path, fake: FakeSwitch, round_: int = 1
                ) -> AsyncIterator[tuple[PolicyEngine, AppliedStore, apply_intent.Settlement]]:
    """The agent's policy side on the fake switch, brought up in Agent._start_policy's order."""
    async def read_switch() -> int | None:
        return switch_generation(fake)

    settlement = await settle_at_start(state, read_switch)
    store = AppliedStore(state / "applied.yaml")
    channel = OpenFlowChannel(ChannelSettings(target=sock, request_timeout=10.0, reconnect_max=0.2),
                              lambda batch, now: None)
    channel.start()
    try:
        await channel.wait_ready(5.0)
        engine = PolicyEngine(channel, RuleRegistry(), round_=round_, meters=lambda: True)
        await engine.start()
        await apply(engine, store.text(), StoreGeneration(store))
        if "name: a" in store.text():
            await engine.pod_added(POD_A)
        if round_ > 1:
            await channel.delete_flows_by_cookie((round_ - 1) << tables.COOKIE_ROUND_SHIFT, tables.ROUND_MASK)
        yield engine, store, settlement
    finally:
        await channel.close()


def watch(fake: FakeSwitch) -> list[tuple[bool, int | None]]:
    """(TCP 81 dropped, marker generation) as the switch's table stood after each message it handled."""
    seen: list[tuple[bool, int | None]] = []
    handle = fake._handle

    def watching(conn: Any, raw: bytes) -> None:
        handle(conn, raw)
        seen.append((blocks_81(fake), switch_generation(fake)))
    fake._handle = watching  # type: ignore[method-assign]
    return seen


def test_the_marker_changes_in_the_same_bundle_as_the_policy_flows(tmp: Path) -> None:
    async def main() -> None:
        fake = FakeSwitch(str(tmp / "br.mgmt"))
        await fake.start()
        try:
            async with agent(str(tmp / "br.mgmt"), tmp / "state", fake) as (engine, store, _):
                await apply(engine, NS, StoreIntent(store, "apply", NS, lambda: ()))
                await engine.pod_added(POD_A)
                assert switch_generation(fake) == store.generation == 1
                seen, commits = watch(fake), fake.commits
                await apply(engine, DROP_81, StoreIntent(store, "apply", DROP_81, lambda: ()))
                assert fake.commits == commits + 1  # one bundle
                # Never the new policy under the old generation, nor the new generation over the old policy.
                assert set(seen) == {(False, 1), (True, 2)} and seen.index((True, 2)) > 0
                assert switch_generation(fake) == store.generation == 2
        finally:
            await fake.stop()
    run(main())


@pytest.mark.parametrize("step", ["before-commit", "before-store"])
def test_an_apply_killed_mid_way_settles_to_what_the_switch_enforces(tmp: Path, step: str) -> None:
    """Killed after the intent is written: the switch took the change (before-store) or never saw its
    commit (before-commit); the next start keeps exactly what the switch enforced meanwhile."""
    async def main() -> None:
        sock, state = str(tmp / "br.mgmt"), tmp / "state"
        fake = FakeSwitch(sock)
        await fake.start()
        try:
            async with agent(sock, state, fake) as (engine, store, _):
                await apply(engine, NS, StoreIntent(store, "apply", NS, lambda: ()))
                await engine.pod_added(POD_A)
                if step == "before-commit":
                    fake.drop_on_commit = "before"  # the commit never reaches the switch
                with contextlib.suppress(Exception):
                    await apply(engine, DROP_81, Killed(store, "apply", DROP_81, step))
                enforced = blocks_81(fake)
                assert enforced == (step == "before-store")
                assert (state / INTENT_NAME).exists() and "drop-81" not in (state / "applied.yaml").read_text()
            async with agent(sock, state, fake, round_=2) as (engine, store, settlement):
                assert settlement.outcome == (ROLLED_FORWARD if enforced else ROLLED_BACK), settlement
                assert settlement.intent == 2 and settlement.store == store.generation
                assert blocks_81(fake) == enforced  # the restarted agent keeps what was enforced
                assert ("drop-81" in (state / "applied.yaml").read_text()) == enforced
                assert not (state / INTENT_NAME).exists()
                assert switch_generation(fake) == store.generation == (2 if enforced else 1)
                assert {f.cookie >> tables.COOKIE_ROUND_SHIFT for f in fake.flows.values()} == {2}
        finally:
            await fake.stop()
    run(main())


def test_a_store_write_that_fails_puts_the_marker_back_with_the_flows(tmp: Path) -> None:
    async def main() -> None:
        sock, state = str(tmp / "br.mgmt"), tmp / "state"
        fake = FakeSwitch(sock)
        await fake.start()
        try:
            async with agent(sock, state, fake) as (engine, store, _):
                await apply(engine, NS, StoreIntent(store, "apply", NS, lambda: ()))
                await engine.pod_added(POD_A)
                before = {k: f.cookie for k, f in fake.flows.items()}
                stored = store.path.read_text()
                store.path.unlink()
                store.path.mkdir()  # the rename onto it fails
                with pytest.raises(AgentError, match="could not save the change"):
                    await apply(engine, DROP_81, StoreIntent(store, "apply", DROP_81, lambda: ()))
                assert {k: f.cookie for k, f in fake.flows.items()} == before and switch_generation(fake) == 1
                assert not (state / INTENT_NAME).exists()
                store.path.rmdir()
                store.path.write_text(stored)
                await apply(engine, DROP_81, StoreIntent(store, "apply", DROP_81, lambda: ()))
                assert blocks_81(fake) and switch_generation(fake) == store.generation  # generation 2 was never kept
        finally:
            await fake.stop()
    run(main())


def test_a_start_that_cannot_ask_the_switch_refuses_to_guess(tmp: Path) -> None:
    state = tmp / "state"
    state.mkdir()
    (state / INTENT_NAME).write_text("# npaudit applied store, generation 3\n" + NS)

    async def unreachable() -> int | None:
        raise OSError("connection refused")

    with pytest.raises(AgentError, match="cannot be asked"):
        run(settle_at_start(state, unreachable))
    assert (state / INTENT_NAME).exists()  # the next start settles it
