"""The incremental compiler's per-label-set memos and per-Pod isolation: after each change the switch
holds what a full compile gives, with many Pods sharing labels, remote Pods and several isolating
policies; and the check is shown to catch a memo keyed too coarsely or a wrong isolating policy."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from policy_agent.engine import PolicyEngine
from policy_agent.ovs import tables
from policy_agent.policy import incremental, isolation
from policy_agent.policy.compiler import compile_policies
from policy_agent.policy.model import (
    Action, AppliedTo, Direction, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, PortSpec, Rule,
)
from policy_agent.policy.rules import RuleRegistry
from policy_agent.policy.selection import RemotePod
from tests.support.engine_doubles import Info, MirrorChannel

NS = ("x", "y")


def app(name: str) -> LabelSelector:
    return LabelSelector((("app", name),))


def isolate(name: str, ns: str, selector: LabelSelector, peer_app: str, port: int) -> Policy:
    """Isolates `selector`'s Pods both ways; admits `peer_app` Pods of any Namespace on `port`."""
    peer = Peer(pod_selector=app(peer_app), namespace_selector=LabelSelector())
    return Policy(PolicyKind.K8S, name, ns, applied_to=(AppliedTo(pod_selector=selector),),
                  rules=(Rule(Direction.INGRESS, Action.ALLOW, (peer,), (PortSpec("TCP", port),)),),
                  isolates=(Direction.INGRESS, Direction.EGRESS))


def pod(ns: str, i: int, label: str, remote: bool = False) -> Pod:
    n = NS.index(ns) * 50 + i + 2
    return Pod(ns, f"p{i}", (("app", label),), ips=(f"10.245.{NS.index(ns)}.{i + 2}" if remote else f"10.244.0.{n}",),
               node="node-b" if remote else "node-a")


def info(ns: str, i: int) -> Info:
    n = NS.index(ns) * 50 + i + 2
    return Info(ns, f"p{i}", f"10.244.0.{n}", f"02:00:0a:f4:00:{n:02x}", n)


def check(eng: PolicyEngine, channel: MirrorChannel) -> None:
    full = compile_policies(eng.state(), eng.compiled.priorities if eng.compiled else None)
    cookie = tables.cookie(1, tables.COOKIE_KIND_POLICY)
    assert {k: f for k, f in channel.flows.items() if f.cookie == cookie} == {f.key: f for f in full.flows}


async def scenario() -> None:
    """Twelve Pods per Namespace over three label sets (half of them remote), isolating policies selecting
    the same and overlapping Pods (the first one names the drop), then ADDs, relabels and deletions."""
    channel = MirrorChannel()
    eng = PolicyEngine(channel, RuleRegistry(), round_=1, meters=lambda: True)
    await eng.apply(namespaces=[Namespace(n, (("kubernetes.io/metadata.name", n),)) for n in NS])
    await eng.apply(pods=[pod(ns, i, "abc"[i % 3], remote=i >= 6) for ns in NS for i in range(12)])
    await eng.apply(policies=[isolate("a-again", "x", app("a"), "c", 79), isolate("a-first", "x", app("a"), "b", 80),
                              isolate("b-second", "x", LabelSelector(), "c", 81),
                              isolate("c-only", "y", app("c"), "a", 82)])
    check(eng, channel)
    for ns in NS:
        for i in range(6):
            await eng.pod_added(info(ns, i))  # type: ignore[arg-type]
            check(eng, channel)
    for ns, i, label in (("x", 0, "c"), ("x", 7, "a"), ("y", 2, "a"), ("y", 8, "c"), ("x", 0, "a")):
        await eng.apply(pods=[pod(ns, i, label, remote=i >= 6)])
        check(eng, channel)
    await eng.pod_deleted(info("x", 3))  # type: ignore[arg-type]
    check(eng, channel)
    await eng.delete(policies=[isolate("a-first", "x", app("a"), "b", 80)])
    check(eng, channel)
    await eng.pod_added(info("x", 3))  # type: ignore[arg-type]
    check(eng, channel)


def test_many_pods_sharing_labels_compile_incrementally_as_in_full() -> None:
    asyncio.run(scenario())


def _coarse_features(pod: Pod) -> Any:
    return (isinstance(pod, RemotePod), pod.namespace)  # forgets the labels


def _last_isolating(lay: Any, gkeys: list) -> dict:
    first: dict = {d: {} for d in Direction}
    for i, (iso, g) in enumerate(zip(lay.isolating, gkeys)):
        first[iso.direction][g] = i  # the last one, not the first
    return first


@pytest.mark.parametrize("where,name,plant", [
    (incremental, "_features", _coarse_features),
    (isolation, "first_isolating", _last_isolating),
])
def test_the_check_catches_a_planted_mistake(monkeypatch: pytest.MonkeyPatch, where: Any, name: str,
                                             plant: Callable[..., Any]) -> None:
    monkeypatch.setattr(where, name, plant)
    with pytest.raises(AssertionError):
        asyncio.run(scenario())
