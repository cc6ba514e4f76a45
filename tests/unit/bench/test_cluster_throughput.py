"""bench/_cluster_throughput.py's pure parts: the order of the steps, the on/off ratios of adjacent streams,
their spread, a process's CPU from /proc, and the figures of a run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("bench__cluster_throughput", ROOT / "bench" / "_cluster_throughput.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


def test_logging_alternates_and_each_state_runs_first_as_often_as_second() -> None:
    steps = range(8)
    assert [bench.logging_at(s) for s in steps] == [False, True] * 4
    first = [(bench.logging_at(s), bench.path_order(s)[0]) for s in steps]
    # Over every four steps each (logging state, path) pair runs first exactly once.
    assert sorted(first[:4]) == sorted([(False, "cross_node"), (True, "cross_node"),
                                        (False, "same_node"), (True, "same_node")])
    assert all(set(bench.path_order(s)) == {"cross_node", "same_node"} for s in steps)


def test_adjacent_ratios_are_on_over_off_whichever_came_first() -> None:
    series = [(False, 100.0), (True, 90.0), (False, 120.0), (True, 120.0)]
    assert bench.adjacent_ratios(series) == [0.9, 0.75, 1.0]
    # Two neighbours in the same state give no ratio; an off of zero gives none either.
    assert bench.adjacent_ratios([(False, 100.0), (False, 50.0), (True, 50.0)]) == [1.0]
    assert bench.adjacent_ratios([(False, 0.0), (True, 50.0)]) == []
    assert bench.adjacent_ratios([]) == []


def test_spread() -> None:
    got = bench.spread([1.0, 0.9, 1.1, 0.8, 1.2], target=0.95)
    assert got == {"n": 5, "median": 1.0, "q1": 0.9, "q3": 1.1, "min": 0.8, "max": 1.2, "at_or_above_target": 3}
    assert bench.spread([0.97]) == {"n": 1, "median": 0.97, "q1": 0.97, "q3": 0.97, "min": 0.97, "max": 0.97}
    assert bench.spread([]) == {"n": 0, "median": None}


def test_cpu_seconds_of_a_proc_stat_line() -> None:
    # A comm with spaces and parentheses: the fields count from the last ")".
    line = "4242 (ovs-vswitchd (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 150 0 0 20 0 9 0 100 0 0\n"
    assert bench.proc_cpu_seconds(line, 100) == 4.0
    assert bench.proc_cpu_seconds(Path("/proc/self/stat").read_text(), 100) >= 0.0


def test_a_streams_figures() -> None:
    got = bench.stream_figures({"bytes": 125_000_000, "seconds": 2.0, "cpu_s": 0.5}, 0.7, 0.8)
    assert got == {"bytes": 125_000_000, "seconds": 2.0, "mbit_per_s": 500.0,
                   "cpu_s": {"sender": 0.7, "receiver": 0.5, "vswitchd": 0.8}, "mbit_per_cpu_s": 500.0}
    assert bench.stream_figures({"bytes": 0, "seconds": 0.0, "cpu_s": 0.0}, 0.0, 0.0)["mbit_per_s"] == 0.0


def _streams(rates: dict[str, list[float]], per_cpu: dict[str, float] | None = None) -> list[dict[str, Any]]:
    return [{"step": step, "path": path, "logging": "on" if bench.logging_at(step) else "off", "mbit_per_s": r,
             "mbit_per_cpu_s": (per_cpu or {}).get(path, 100.0)} for path, rs in rates.items() for step, r in enumerate(rs)]


def test_a_runs_figures() -> None:
    # Cross-node: off 400, on 380, off 400, on 400 -> adjacent on/off 0.95, 0.95, 1.0; same-node twice as fast.
    got = bench.summarize(_streams({"cross_node": [400.0, 380.0, 400.0, 400.0],
                                    "same_node": [800.0, 800.0, 1000.0, 800.0]}))
    assert got["cross_node_logging_on_vs_off_ratio"] == 0.95
    assert got["logging_on_vs_off_adjacent_pairs"]["cross_node"]["n"] == 3
    assert got["logging_on_vs_off_adjacent_pairs"]["cross_node"]["at_or_above_target"] == 3
    assert got["same_node_logging_on_vs_off_ratio"] == 0.8
    assert got["cross_node_vs_same_node_ratio"] == 0.45  # steps 0 and 2 (logging off): 0.5 and 0.4
    assert got["cross_node_vs_same_node_per_step"]["on"]["median"] == pytest.approx(0.4875, abs=0.001)
    assert got["mbit_per_s_median"] == {"cross_node_off": 400.0, "cross_node_on": 390.0,
                                        "same_node_off": 900.0, "same_node_on": 800.0}
    assert got["logging_on_vs_off_per_cpu_second_adjacent_pairs"]["cross_node"]["median"] == 1.0
    assert got["cross_node_vs_same_node_per_cpu_second_per_step"]["median"] == 1.0
    per_cpu = bench.summarize(_streams({"cross_node": [1.0] * 4, "same_node": [1.0] * 4},
                                       {"cross_node": 500.0, "same_node": 800.0}))
    assert per_cpu["cross_node_vs_same_node_per_cpu_second_per_step"]["median"] == 0.625
    assert got["target_met"] is True
    slower = bench.summarize(_streams({"cross_node": [400.0, 300.0, 400.0, 300.0], "same_node": [1.0] * 4}))
    assert (slower["cross_node_logging_on_vs_off_ratio"], slower["target_met"]) == (0.75, False)
