"""bench/cluster_scale.py's pure parts: percentiles, the probers' transition lines, when a verdict was first seen
after a policy write, and the manifests it writes (valid for the loader the nodes run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from policy_agent.policy.manifests import load_documents
from tests.support.bench_modules import load_bench

ROOT = Path(__file__).resolve().parents[3]


bench = load_bench("cluster_scale")
throughput = load_bench("_cluster_throughput")


def test_nearest_rank_percentile() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert bench.percentile(samples, 50) == 50.0
    assert bench.percentile(samples, 99) == 99.0
    assert bench.percentile(samples[:40], 99) == 40.0  # p99 of 40 changes is the slowest
    assert bench.percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        bench.percentile([], 99)


def test_summary_in_milliseconds() -> None:
    assert bench.summary_ms([0.1, 0.2, 0.4]) == {"samples": 3, "p50_ms": 200.0, "p99_ms": 400.0, "max_ms": 400.0}


def test_prober_lines() -> None:
    assert bench.parse_transition("1234.500000 refused\n") == (1234.5, "refused")
    assert bench.parse_transition("Traceback (most recent call last):") is None
    assert bench.parse_transition("abc connected") is None


def test_first_verdict_after_a_write() -> None:
    seen = [(1.0, "connected"), (5.2, "refused"), (5.9, "connected"), (7.0, "refused")]
    assert bench.first_at(seen, 5.0, "refused") == 5.2
    assert bench.first_at(seen, 5.5, "connected") == 5.9
    # A transition before the write does not count as the change taking effect...
    assert bench.first_at(seen, 5.3, "refused") == 7.0
    # ...unless the state already held at the write: no transition needed, zero latency.
    assert bench.first_at(seen, 6.0, "connected") == 6.0
    assert bench.first_at(seen, 8.0, "connected") is None
    assert bench.first_at([], 1.0, "refused") is None


def test_ratio() -> None:
    assert bench.ratio(97.0, 100.0) == 0.97
    assert bench.ratio(1.0, 0.0) is None
    assert bench.ratio(None, 1.0) is None


def test_manifests_it_writesload_bench() -> None:
    docs = [d for text in (bench.namespaces("x", "y", "t"), throughput.stream_policy(True),
                           throughput.stream_policy(False),
                           bench.reject_policy(80)) for d in yaml.safe_load_all(text)]
    objs = load_documents([d for d in docs if d["metadata"]["name"] != "bench-throughput" or
                           d["spec"]["ingress"][0]["enableLogging"]], source="test")
    assert sorted(n.name for n in objs.namespaces) == ["t", "x", "y"]
    assert sorted(p.name for p in objs.policies) == ["bench-propagation", "bench-throughput"]


def test_propagation_summary_takes_the_slowest_node_of_each_change() -> None:
    changes = [{"seconds_by_node": {"n1": 0.1, "n2": 0.3}}, {"seconds_by_node": {"n1": 0.2, "n2": 0.05}},
               {"seconds_by_node": {"n1": 0.4, "n2": None}}]
    got = bench.propagation_summary(changes, 2)
    # The third change was never seen on n2: not in force on all nodes, counted as missed, target not met.
    assert got["in_force_on_all_nodes"] == {"samples": 2, "p50_ms": 200.0, "p99_ms": 300.0, "max_ms": 300.0}
    assert got["in_force_per_node"]["samples"] == 5
    assert (got["not_seen_within_10s"], got["target_met"]) == (1, False)
    assert bench.propagation_summary(changes[:2], 2)["target_met"] is True
    assert bench.propagation_summary([{"seconds_by_node": {"n1": 1.2}}], 1)["target_met"] is False


def test_the_propagation_target_is_judged_on_the_kubernetes_api_mode() -> None:
    def mode(p99: float) -> dict[str, object]:
        return bench.propagation_summary([{"seconds_by_node": {"n1": p99 / 1000}}], 1)

    got = bench.propagation_verdict({"kubernetes_api": mode(400.0), "shared_source": mode(800.0)})
    assert got["in_force_on_all_nodes_p99_ms"] == {"kubernetes_api": 400.0, "shared_source": 800.0}
    assert (got["kubernetes_api_vs_shared_source_p99_ratio"], got["target_met"]) == (0.5, True)
    # The shared source meeting it does not count for a change picked up from the API.
    assert bench.propagation_verdict({"shared_source": mode(300.0)})["target_met"] is False
    assert bench.propagation_verdict({"kubernetes_api": mode(1500.0), "shared_source": mode(300.0)})["target_met"] \
        is False


def test_run_all_takes_its_headline_figures() -> None:
    run_all = load_bench("run_all")
    result = {"throughput": {"cross_node_logging_on_vs_off_ratio": 0.97, "cross_node_vs_same_node_ratio": 0.8,
                             "logging_on_vs_off_adjacent_pairs": {"cross_node": {"n": 23, "median": 0.97, "q1": 0.9,
                                                                                 "q3": 1.1, "min": 0.6, "max": 1.5},
                                                                  "same_node": {"n": 23}},
                             "logging_on_vs_off_per_cpu_second_adjacent_pairs": {"cross_node": {"median": 0.99}},
                             "mbit_per_s_median": {"cross_node_off": 300.0}},
              "propagation": {"in_force_on_all_nodes_p99_ms": {"kubernetes_api": 400.0, "shared_source": 700.0}},
              "rss": {"rss_mb": 135.1},
              "cni_add": {"agent_side_p99_ms": {"remote_pods_10000": 12.5}},
              "targets_met": {"rss": True}}
    assert dict(run_all.headlines("cluster_scale", result)) == {
        "cross-node TCP: logging on vs off": 0.97,
        "cross-node TCP: logging on vs off, adjacent pairs q1": 0.9, "cross-node TCP: logging on vs off, adjacent pairs q3": 1.1,
        "cross-node TCP: logging on vs off, adjacent pairs min": 0.6, "cross-node TCP: logging on vs off, adjacent pairs max": 1.5,
        "cross-node TCP per CPU-second: logging on vs off": 0.99, "TCP cross-node / same-node (logging off)": 0.8,
        "TCP Mbit/s (cross_node_off)": 300.0,
        "policy change in force on all nodes p99 ms (kubernetes_api)": 400.0,
        "policy change in force on all nodes p99 ms (shared_source)": 700.0,
        "agent RSS MB, 10k Pods and 1k policies listed": 135.1, "CNI ADD agent-side p99 ms (remote_pods_10000)": 12.5,
        "target met (rss)": True}
