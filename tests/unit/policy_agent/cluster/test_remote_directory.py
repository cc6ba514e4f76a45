"""The Pod directory kept change by change: after any sequence of Pod objects and interfaces
coming, changing and going (addresses shared, reused, held by a local interface), it is the one
built from scratch, and the engine's compiled flows are those of a full compile of the remote Pods
rebuilt from scratch; a change leaves every other remote Pod's endpoint the same object."""

from __future__ import annotations

import asyncio
import random

from policy_agent.cluster.pod_directory import RemoteDirectory, with_remote
from policy_agent.engine import PolicyEngine
from policy_agent.policy.compiler import compile_policies
from policy_agent.policy.model import (
    AppliedTo, Direction, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, PortSpec, Rule,
)
from policy_agent.policy.rules import RuleRegistry
from policy_agent.policy.selection import Endpoint
from tests.support.engine_doubles import Info, RecordingChannel

NAMES = [("a", f"p{i}") for i in range(6)] + [("b", f"p{i}") for i in range(6)]
ADDRESSES = [f"10.245.0.{i}" for i in range(1, 6)]


def _pod(rng: random.Random, key: tuple[str, str]) -> Pod:
    ips = tuple(rng.sample(ADDRESSES, rng.choice((0, 1, 1, 2))))
    return Pod(key[0], key[1], (("app", rng.choice("xy")),), ips=ips, node=rng.choice(("", "node-b")))


def _summary(d: RemoteDirectory) -> tuple[object, ...]:
    return d.by_ip, {k: (ep.ip, ep.pod) for k, ep in d.remote.items()}, sorted(d.with_remote(), key=repr)


def test_the_directory_kept_change_by_change_is_the_one_built_from_scratch() -> None:
    for seed in range(40):
        rng = random.Random(seed)
        pods: dict[tuple[str, str], Pod] = {}
        endpoints: dict[tuple[str, str], Endpoint] = {}
        d = RemoteDirectory()
        for _ in range(60):
            touched = set(rng.sample(NAMES, rng.randint(1, 3)))
            pods, endpoints = dict(pods), dict(endpoints)
            for key in touched:
                what = rng.random()
                if what < 0.5:
                    pods[key] = _pod(rng, key)
                elif what < 0.65:
                    pods.pop(key, None)
                elif what < 0.85:  # IPAM gives an address no other interface here holds
                    free = sorted(set(ADDRESSES) - {ep.ip for k, ep in endpoints.items() if k != key})
                    if free:
                        endpoints[key] = Endpoint(pods.get(key) or Pod(*key), rng.choice(free), "02:00:00:00:00:01",
                                                  5)
                else:
                    endpoints.pop(key, None)
            before = d
            d = d.update(endpoints, pods, touched)
            assert _summary(d) == _summary(RemoteDirectory.build(endpoints, pods)), seed
            # An unchanged Pod keeps its endpoint object: the compiler sees at once that it did not move.
            for key, ep in d.remote.items():
                if key not in touched and before.remote.get(key) is not None and before.remote[key].ip == ep.ip:
                    assert before.remote[key] is ep


def test_the_old_state_is_never_changed_by_the_next() -> None:
    old = RemoteDirectory.build({}, {("y", "c1"): Pod("y", "c1", ips=("10.245.0.7",))})
    new = old.update({}, {("y", "c2"): Pod("y", "c2", ips=("10.245.0.7",))}, [("y", "c1"), ("y", "c2")])
    assert old.by_ip == {"10.245.0.7": ("y", "c1")} and new.by_ip == {"10.245.0.7": ("y", "c2")}
    assert [ep.pod.name for ep in old.with_remote()] == ["c1"]


def _policy(i: int) -> Policy:
    return Policy(PolicyKind.K8S, f"np-{i}", "a", isolates=(Direction.INGRESS,),
                  applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "xy"[i % 2]),))),),
                  rules=(Rule(Direction.INGRESS, peers=(Peer(pod_selector=LabelSelector((("app", "yx"[i % 2]),)),
                                                             namespace_selector=LabelSelector()),),
                              ports=(PortSpec("TCP", 80 + i),)),))


def test_the_engine_compiles_as_a_full_rebuild_of_the_remote_pods_would() -> None:
    async def main() -> None:
        rng = random.Random(7)
        eng = PolicyEngine(RecordingChannel(), RuleRegistry(), round_=1, meters=lambda: True)
        await eng.apply(namespaces=[Namespace("a"), Namespace("b")], policies=[_policy(0), _policy(1)])
        running: dict[tuple[str, str], str] = {}
        for step in range(80):
            key = rng.choice(NAMES)
            what = rng.random()
            if what < 0.45:
                await eng.apply(pods=[_pod(rng, key)])
            elif what < 0.6 and key in eng.pods:
                await eng.delete(pods=[eng.pods[key]])
            elif what < 0.8 and key not in running and len(running) < len(ADDRESSES):
                running[key] = rng.choice(sorted(set(ADDRESSES) - set(running.values())))
                await eng.pod_added(Info(*key, running[key], "02:00:00:00:00:01", 10 + NAMES.index(key)))
            elif key in running:
                await eng.pod_deleted(Info(*key, running.pop(key), "02:00:00:00:00:01", 10 + NAMES.index(key)))
            state = eng.state()
            rebuilt = with_remote(eng.endpoints.values(), eng.pods.values())
            assert sorted(state.endpoints, key=repr) == sorted(rebuilt, key=repr), step
            assert eng._compiled is not None
            full = compile_policies(state.__class__(**{**state.__dict__, "endpoints": rebuilt}),
                                    eng._compiled.priorities)
            assert {f.key: f for f in eng._compiled.flows()} == {f.key: f for f in full.flows}, step
            directory = RemoteDirectory.build(eng.endpoints, eng.pods).by_ip
            assert [eng.by_ip(ip) for ip in ADDRESSES] == [directory.get(ip) for ip in ADDRESSES], step

    asyncio.run(main())
