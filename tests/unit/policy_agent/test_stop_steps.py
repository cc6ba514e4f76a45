"""A slow stop says which of its steps took the time (policy_agent.agent.StopSteps)."""

from __future__ import annotations

import logging

import pytest

from policy_agent.agent import SLOW_STOP, StopSteps
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
