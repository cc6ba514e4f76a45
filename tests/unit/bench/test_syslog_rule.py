"""bench/syslog_throughput.py's keeps-up rule on made-up samples: a final burst is no falling behind, a growing
backlog is, and so is a lag beyond a second of writing even at equal rates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load():  # type: ignore[no-untyped-def]
    """The bench as a module; sys.path as it was after (the bench puts bench/ in front, where its scripts
    would shadow modules of the same name for the tests after this one)."""
    before = list(sys.path)
    try:
        path = ROOT / "bench" / "syslog_throughput.py"
        spec = importlib.util.spec_from_file_location("bench_syslog_throughput", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = before


bench = _load()
RATE = 50_000  # records/s written


def samples(delivered_rate: float, lag: float = 0.0, wobble: int = 0) -> list[tuple[float, int, int, float]]:
    """8 s of samples every 0.25 s: written at RATE in batches of 8192, delivered at `delivered_rate`
    `lag` seconds behind, give or take `wobble` records."""
    out = []
    for i in range(1, 33):
        t = i * 0.25
        written = int(RATE * t) // 8192 * 8192
        delivered = max(0, int(delivered_rate * (t - lag)) + (wobble if i % 2 else -wobble))
        out.append((t, written, min(written, delivered), 0.0))
    return out


def test_a_forwarder_at_the_writers_rate_keeps_up_though_the_last_samples_fall_on_a_batch() -> None:
    rule = bench.steady(samples(RATE, lag=0.1, wobble=3000), fed_for=8.0)
    assert rule["keeps_up"] and rule["steady_delivered_vs_written"] == pytest.approx(1.0, abs=0.02)


def test_the_writers_final_flush_after_the_feed_stopped_is_not_counted_as_falling_behind() -> None:
    steady = samples(RATE, lag=0.1)
    t, written, delivered, waited = steady[-1]
    flushed = [*steady, (t + 0.1, written + 60_000, delivered, waited)]  # the queue's rest lands at once
    rule = bench.steady(flushed, fed_for=t)
    assert rule["keeps_up"] and rule["backlog_max_steady"] < 60_000
    assert not bench.steady(flushed, fed_for=t + 0.1)["keeps_up"]  # counted, the burst would fail the rule


def test_a_backlog_that_grows_does_not_keep_up() -> None:
    rule = bench.steady(samples(0.9 * RATE), fed_for=8.0)
    assert not rule["keeps_up"] and rule["steady_delivered_vs_written"] == pytest.approx(0.9, abs=0.02)


def test_a_lag_of_more_than_a_second_of_writing_does_not_keep_up_even_at_the_same_rate() -> None:
    rule = bench.steady(samples(RATE, lag=1.5), fed_for=8.0)
    assert rule["steady_delivered_vs_written"] == pytest.approx(1.0, abs=0.02)
    assert not rule["keeps_up"] and rule["backlog_max_steady_seconds_of_writing"] > 1.0


def test_too_few_samples_for_a_rate_is_an_error_not_a_result() -> None:
    with pytest.raises(SystemExit, match="too short"):
        bench.steady(samples(RATE)[:3], fed_for=0.75)
