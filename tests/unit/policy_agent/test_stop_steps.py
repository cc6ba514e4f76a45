"""A slow stop says which of its steps took the time, and a step that hangs is left behind so the audit trail
is still closed (policy_agent.agent.StopSteps)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import policy_agent.agent as agent_mod
from policy_agent.agent import SLOW_STOP, Agent, StopSteps
from policy_agent.config import loader as config_mod
from tests.support.clock import ManualClock


def test_a_slow_stop_names_its_three_slowest_steps(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(100.0)
    steps = StopSteps(clock)
    for name, took in (("sources", 0.2), ("last loss window", 10.0), ("channel", 0.5), ("audit trail", 3.0),
                       ("switch", 0.1)):
        clock.advance(took)
        steps.done(name)
    with caplog.at_level(logging.WARNING, logger="policy_agent.agent"):
        assert steps.report() == pytest.approx(13.8)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said == ("stopping took 13.8 s; slowest steps: last loss window 10.0 s, audit trail 3.0 s, "
                    "channel 0.5 s")


def test_a_quick_stop_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(100.0)
    steps = StopSteps(clock)
    clock.advance(SLOW_STOP - 0.01)
    steps.done("everything")
    with caplog.at_level(logging.WARNING, logger="policy_agent.agent"):
        assert steps.report() == pytest.approx(SLOW_STOP - 0.01)
    assert caplog.records == []


def test_a_bounded_step_runs_its_parts_in_order_and_a_failing_part_ends_it_said(
        caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    async def part(name: str, fail: bool = False) -> None:
        ran.append(name)
        if fail:
            raise OSError("the socket went")

    async def go() -> StopSteps:
        steps = StopSteps()
        await steps.bounded("servers", lambda: part("api"), lambda: part("cni", fail=True), lambda: part("routes"))
        await steps.bounded("channel", lambda: part("channel"))
        return steps
    with caplog.at_level(logging.ERROR, logger="policy_agent.agent"):
        steps = asyncio.run(go())
    assert ran == ["api", "cni", "channel"] and [name for name, _ in steps.steps] == ["servers", "channel"]
    assert [r.getMessage() for r in caplog.records] == ["stopping: servers failed: OSError: the socket went"]


class _Hangs:
    """A source whose close does not end when cancelled: only when the test releases it, after the stop."""

    def __init__(self) -> None:
        self.released: asyncio.Event | None = None
        self.ended = False

    async def close(self) -> None:
        self.released = asyncio.Event()
        try:
            await self.released.wait()
        except asyncio.CancelledError:
            await self.released.wait()
        self.ended = True


def test_a_stop_step_that_hangs_is_left_behind_and_the_audit_trail_is_still_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config_mod.loads(f"state_dir: {tmp_path / 'state'}\naudit:\n  path: {tmp_path / 'audit' / 'a.jsonl'}\n")
    agent = Agent(cfg)
    hangs = _Hangs()
    agent.manifests = hangs  # type: ignore[assignment]
    assert agent.trail is not None
    closed: list[bool] = []
    real_close = agent.trail.close

    async def close() -> None:
        closed.append(True)
        await real_close()
    monkeypatch.setattr(agent.trail, "close", close)
    monkeypatch.setattr(agent_mod, "STEP_BOUND", 0.3)

    async def go() -> None:
        await asyncio.wait_for(agent.stop(), 30)  # the old stop waited on the source for ever
        assert closed == [True] and not hangs.ended  # the trail closed while the source still hung
        assert hangs.released is not None
        hangs.released.set()  # then let it end, so no task is left pending when the loop closes
        while not hangs.ended:
            await asyncio.sleep(0.01)
    with caplog.at_level(logging.ERROR, logger="policy_agent.agent"):
        asyncio.run(go())
    assert closed == [True]
    assert ["stopping: supervisor and sources did not end within 0.3 s; left behind, the stop goes on"] == [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == "policy_agent.agent"]
