#!/usr/bin/env python3
"""Agent-side cost of a change with 10,000 remote Pods known (issue 21: CNI ADD <= 30 ms). Prints JSON.

In this process: a PolicyEngine (real compiler, a switch that confirms and keeps nothing) holding
50 Namespaces, 10,000 Pods on 8 other nodes (objects with status.podIP and spec.nodeName), 20 Pods
of this node and 1,000 NetworkPolicies (each selects one app and admits another, as in
bench/kubernetes_pods_rss.py). Then it times, each several times: a local Pod's CNI ADD (the
engine's pod_added, agent side), a remote Pod's object changing its labels (a watch event), and
one NetworkPolicy applied; the garbage collector set as the agent sets it. Run from the tree:
`.venv/bin/python bench/remote_pods_scale.py` (`--profile` prints the top of a cProfile of the CNI
ADDs, then of the policy changes, to stderr).
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packetin import messages  # noqa: E402
from packetin.gctune import settle_heap  # noqa: E402
from policy_agent.engine import PolicyEngine  # noqa: E402
from policy_agent.policy.model import (  # noqa: E402
    AppliedTo, Direction, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, PortSpec, Rule,
)
from policy_agent.policy.rules import RuleRegistry  # noqa: E402
from tests.support.engine_doubles import Info  # noqa: E402

OTHERS, PODS_PER_NODE, LOCAL_PODS, NAMESPACES, POLICIES, APPS = 8, 1250, 20, 50, 1000, 200
ROUNDS = 10
TARGET_MS = 30.0


class Switch:
    """Confirms at once, keeps nothing."""

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        pass

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        pass

    async def commit_flows(self, install: Sequence[messages.FlowSpec], delete: Sequence[messages.FlowSpec]) -> None:
        pass

    async def install_meters(self, meters: Sequence[messages.MeterSpec]) -> None:
        pass


def _labels(i: int) -> tuple[tuple[str, str], ...]:
    return (("app", f"app-{i % APPS}"), ("tier", "web"))


def policy(i: int, port: int) -> Policy:
    return Policy(PolicyKind.K8S, f"np-{i}", f"ns-{i % NAMESPACES}", isolates=(Direction.INGRESS,),
                  applied_to=(AppliedTo(pod_selector=LabelSelector((("app", f"app-{i % APPS}"),))),),
                  rules=(Rule(Direction.INGRESS, peers=(Peer(pod_selector=LabelSelector((("app", f"app-{(i + 1) % APPS}"),)),
                                                             namespace_selector=LabelSelector()),),
                              ports=(PortSpec("TCP", port),)),))


def remote_pods() -> list[Pod]:
    return [Pod(f"ns-{i % NAMESPACES}", f"app-{n}-{i}", _labels(i), ips=(f"10.{100 + n}.{i // 250}.{i % 250 + 2}",),
                node=f"node-{n}") for n in range(1, OTHERS + 1) for i in range(PODS_PER_NODE)]


def local_pod(i: int) -> Pod:
    return Pod(f"ns-{i % NAMESPACES}", f"local-{i}", _labels(i), ips=(f"10.244.0.{10 + i}",), node="node-0")


def local_info(i: int) -> Info:
    return Info(f"ns-{i % NAMESPACES}", f"local-{i}", f"10.244.0.{10 + i}", f"02:00:00:00:01:{i:02x}", 100 + i)


def ms(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median_ms": round(statistics.median(s) * 1000, 2), "max_ms": round(s[-1] * 1000, 2),
            "p90_ms": round(s[int(0.9 * (len(s) - 1))] * 1000, 2)}


async def main(profile: bool, rounds: int = ROUNDS, remote: bool = True) -> dict[str, object]:
    """`rounds` of each change; `remote=False`: the same with no remote Pod known (the baseline). The
    collector runs as in the agent (settle_heap at its start, before it learns any Pod): with CPython's
    default thresholds a third of the ADDs here paid a collection walking every Pod's objects."""
    settle_heap()
    engine = PolicyEngine(Switch(), RuleRegistry(), round_=1, meters=lambda: False)
    await engine.start()
    t0 = time.monotonic()
    await engine.apply(namespaces=[Namespace(f"ns-{i}") for i in range(NAMESPACES)])
    await engine.apply(pods=(remote_pods() if remote else []) + [local_pod(i) for i in range(LOCAL_PODS + rounds)])
    await engine.apply(policies=[policy(i, 80 + i % 50) for i in range(POLICIES)])
    for i in range(LOCAL_PODS):
        await engine.pod_added(local_info(i))
    setup = time.monotonic() - t0

    prof = cProfile.Profile() if profile else None
    adds: list[float] = []
    for i in range(LOCAL_PODS, LOCAL_PODS + rounds):
        start = time.perf_counter()
        if prof:
            prof.enable()
        await engine.pod_added(local_info(i))
        if prof:
            prof.disable()
        adds.append(time.perf_counter() - start)
    labels: list[float] = []
    for r in range(rounds if remote else 0):  # a remote Pod's labels change (its watch event), and back
        old = engine.pods[("ns-3", "app-2-3")]
        start = time.perf_counter()
        await engine.apply(pods=[Pod(old.namespace, old.name, _labels(3 + r + 1), ips=old.ips, node=old.node)])
        labels.append(time.perf_counter() - start)
    if prof:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
        prof = cProfile.Profile()
    changes: list[float] = []
    for r in range(rounds):  # one NetworkPolicy's port changes
        start = time.perf_counter()
        if prof:
            prof.enable()
        await engine.apply(policies=[policy(7, 2000 + r)])
        if prof:
            prof.disable()
        changes.append(time.perf_counter() - start)
    if prof:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    add = ms(adds)
    return {"bench": "remote_pods_scale", "remote_pods": OTHERS * PODS_PER_NODE if remote else 0,
            "local_pods": LOCAL_PODS + rounds,
            "policies": POLICIES, "rules": len(engine.registry), "setup_seconds": round(setup, 2),
            "cni_add": add, "remote_pod_labels_change": ms(labels) if labels else None, "policy_change": ms(changes),
            "cni_add_target_ms": TARGET_MS, "cni_add_target_met": add["max_ms"] <= TARGET_MS,
            "cni_add_seconds": [round(a, 5) for a in adds],
            "gc": "the agent's (packetin.gctune.settle_heap before any Pod is known)",
            "note": f"agent side only (compile + a switch that confirms at once); max of {rounds} stands in for p99"}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main("--profile" in sys.argv)), indent=2))
