"""Incremental compilation: after any sequence of changes the switch holds what a full recompile gives."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packetin import messages
from policy_agent.engine import PolicyEngine, PolicyRejected
from policy_agent.ovs import tables
from policy_agent.policy import incremental
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies
from policy_agent.policy.model import (
    Action, AppliedTo, ContainerPort, Direction, IPBlock, LabelSelector, Namespace, Peer, Pod, Policy,
    PolicyKind, PortSpec, Requirement, Rule, Tier,
)
from policy_agent.policy.rules import RuleRegistry

from tests.support.flowsim import FlowTable
from tests.support.engine_doubles import Info
from tests.support.engine_doubles import MirrorChannel

NAMESPACES = ("x", "y", "z")
PODS = tuple(f"p{i}" for i in range(6))
TIERS = ("application", "securityops", "baseline", "custom-a", "custom-b")


def labels(**kv: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kv.items()))


selectors = st.one_of(
    st.none(),
    st.builds(lambda app: LabelSelector(labels(app=app)), st.sampled_from("abc")),
    st.just(LabelSelector()),
    st.builds(lambda vals: LabelSelector(match_expressions=(Requirement("app", "In", vals),)),
              st.sampled_from([("a",), ("a", "b")])),
    st.just(LabelSelector(match_expressions=(Requirement("role", "Exists"),))),
)
ns_selectors = st.one_of(
    st.none(),
    st.builds(lambda team: LabelSelector(labels(team=team)), st.sampled_from("rs")),
    st.builds(lambda n: LabelSelector(labels(**{"kubernetes.io/metadata.name": n})), st.sampled_from(NAMESPACES)),
)
peers = st.one_of(
    st.builds(Peer, pod_selector=selectors, namespace_selector=ns_selectors),
    st.builds(lambda s: Peer(pod_selector=s, namespace_self=True), selectors),
    st.builds(lambda n: Peer(ip_block=IPBlock(f"10.244.0.0/{n}", ("10.244.0.4/30",) if n < 28 else ())),
              st.sampled_from([24, 29])),
)
ports = st.one_of(
    st.builds(lambda p: PortSpec(port=p), st.sampled_from([80, 81])),
    st.just(PortSpec(port="http")),
    st.just(PortSpec("UDP", 53)),
    st.just(PortSpec(port=1000, end_port=1010)),
)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    kind = draw(st.sampled_from(list(PolicyKind)))
    ns = "" if kind == PolicyKind.ACNP else draw(st.sampled_from(NAMESPACES))
    n_rules = draw(st.integers(0 if kind == PolicyKind.K8S else 1, 3))
    rules = []
    for i in range(n_rules):
        direction = draw(st.sampled_from(list(Direction)))
        action = Action.ALLOW if kind == PolicyKind.K8S else draw(st.sampled_from(list(Action)))
        the_peers = draw(st.lists(peers, max_size=2))
        if kind == PolicyKind.K8S:
            the_peers = [p for p in the_peers if not p.namespace_self]
        rules.append(Rule(direction, action, tuple(the_peers), tuple(draw(st.lists(ports, max_size=2))),
                          name=f"r{i}" if draw(st.booleans()) else ""))
    applied = (AppliedTo(pod_selector=draw(selectors) or LabelSelector(),
                         namespace_selector=draw(ns_selectors) if kind == PolicyKind.ACNP else None),)
    return Policy(kind, draw(st.sampled_from(["pa", "pb", "pc"])), ns,
                  tier="" if kind == PolicyKind.K8S else draw(st.sampled_from(TIERS[:3])),
                  priority=0.0 if kind == PolicyKind.K8S else draw(st.sampled_from([1.0, 2.0, 5.0])),
                  applied_to=applied, rules=tuple(rules),
                  isolates=tuple(draw(st.sets(st.sampled_from(list(Direction))))) if kind == PolicyKind.K8S else ())


def pods(namespace: str, name: str) -> st.SearchStrategy[Pod]:
    """A Pod object; with an address and another node at times: until its CNI ADD here (if ever), rules
    know it as a remote Pod (cluster/pod_directory.py), a peer by address that no rule applies to."""
    n = NAMESPACES.index(namespace) * len(PODS) + PODS.index(name) + 2
    return st.builds(lambda app, role, named, remote: Pod(
        namespace, name, labels(app=app, **({"role": "x"} if role else {})),
        (ContainerPort("http", 8080 if named else 9090),),
        **({"ips": (f"10.245.0.{n}",), "node": "node-b"} if remote else {})),
        st.sampled_from("abc"), st.booleans(), st.booleans(), st.booleans())


changes = st.one_of(
    st.tuples(st.just("apply-policy"), policies()),
    st.tuples(st.just("delete-policy"), policies()),
    st.tuples(st.just("pod"), st.sampled_from(NAMESPACES), st.sampled_from(PODS), st.data()),
    st.tuples(st.just("cni-add"), st.sampled_from(NAMESPACES), st.sampled_from(PODS)),
    st.tuples(st.just("cni-del"), st.sampled_from(NAMESPACES), st.sampled_from(PODS)),
    st.tuples(st.just("namespace"), st.sampled_from(NAMESPACES), st.sampled_from(["r", "s", ""]),
              st.booleans()),
    st.tuples(st.just("tier"), st.sampled_from(TIERS[3:]), st.sampled_from([20, 120, 251])),
    st.tuples(st.just("tier-policy"), policies(), st.sampled_from(TIERS[3:])),
)


def info(ns: str, name: str) -> Info:
    n = NAMESPACES.index(ns) * len(PODS) + PODS.index(name) + 2
    return Info(ns, name, f"10.244.0.{n}", f"02:00:0a:f4:00:{n:02x}", n)


def policy_flows(flows: dict[Any, messages.FlowSpec]) -> dict[Any, messages.FlowSpec]:
    return {k: f for k, f in flows.items() if f.cookie == tables.cookie(1, tables.COOKIE_KIND_POLICY)}


async def play(steps: list[tuple[Any, ...]]) -> None:
    channel = MirrorChannel()
    eng = PolicyEngine(channel, RuleRegistry(), round_=1, meters=lambda: True)
    await eng.apply(namespaces=[Namespace(n, labels(**{"kubernetes.io/metadata.name": n})) for n in NAMESPACES])
    running: set[tuple[str, str]] = set()
    # Two Pods running in each Namespace from the start: relabelling a Namespace moves Pods.
    for n, ns in enumerate(NAMESPACES):
        await eng.apply(pods=[Pod(ns, name, labels(app="abc"[(n + i) % 3]), (ContainerPort("http", 8080),))
                              for i, name in enumerate(PODS[:2])])
        for name in PODS[:2]:
            running.add((ns, name))
            await eng.pod_added(info(ns, name))  # type: ignore[arg-type]
    for step in steps:
        try:
            await one_change(eng, running, step)
        except PolicyRejected:
            pass  # e.g. a Tier in use: refused, nothing changed
        state = eng.state()
        full = compile_policies(state, eng._compiled.priorities if eng._compiled else None)
        assert policy_flows(channel.flows) == {f.key: f for f in full.flows}, step[0]
        assert {r.rule_id: r for r in eng.registry.all()} == full.rules
    verdicts_agree(state, list(channel.flows.values()))


async def one_change(eng: PolicyEngine, running: set[tuple[str, str]], step: tuple[Any, ...]) -> None:
    kind = step[0]
    if kind == "apply-policy":
        await eng.apply(policies=[step[1]])
    elif kind == "delete-policy":
        await eng.delete(policies=[step[1]])
    elif kind == "pod":
        await eng.apply(pods=[step[3].draw(pods(step[1], step[2]))])
    elif kind == "cni-add" and (step[1], step[2]) not in running:
        running.add((step[1], step[2]))
        await eng.pod_added(info(step[1], step[2]))  # type: ignore[arg-type]
    elif kind == "cni-del" and (step[1], step[2]) in running:
        running.discard((step[1], step[2]))
        await eng.pod_deleted(info(step[1], step[2]))  # type: ignore[arg-type]
    elif kind == "namespace":
        extra = {"team": step[2]} if step[2] else {}
        annotations = (("networkpolicy.antrea.io/enable-logging", "true"),) if step[3] else ()
        await eng.apply(namespaces=[Namespace(step[1], labels(**{"kubernetes.io/metadata.name": step[1]}, **extra),
                                              annotations)])
    elif kind == "tier":
        await eng.apply(tiers=[Tier(step[1], step[2])])
    elif kind == "tier-policy":
        policy = step[1]
        if policy.kind != PolicyKind.K8S:
            await eng.apply(tiers=[Tier(step[2], 120 if step[2] == "custom-a" else 20)],
                            policies=[Policy(policy.kind, policy.name, policy.namespace, step[2], policy.priority,
                                             policy.applied_to, policy.rules)])


def verdicts_agree(state: ClusterState, installed: list[messages.FlowSpec]) -> None:
    """The flows the switch holds judge every Pod pair as the full recompile's flows do."""
    reference = FlowTable(tables.fixed_flows(1) + compile_policies(state).flows + pod_flows(state.endpoints))
    mirror = FlowTable(tables.fixed_flows(1) + installed)
    for src, dst in itertools.permutations(state.endpoints, 2):
        if not src.ofport:
            continue  # a remote Pod sends from its own node
        for port in (80, 8080):
            pkt = {"in_port": src.ofport, "eth_type": 0x0800, "ipv4_src": src.ip, "ipv4_dst": dst.ip,
                   "ip_proto": 6, "tcp_dst": port}
            want, got = reference.run(pkt), mirror.run(pkt)
            assert (want.output, want.regs) == (got.output, got.regs), (src.pod.key, dst.pod.key, port)


def pod_flows(endpoints: tuple[Endpoint, ...]) -> list[messages.FlowSpec]:
    return [f for e in endpoints if e.ofport for f in tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(changes, min_size=1, max_size=14))
def test_any_change_sequence_leaves_the_switch_as_a_full_recompile_would(steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(play(steps))


def test_a_pod_joining_conjunctive_rules_makes_only_its_own_flows() -> None:
    ns = {"x": Namespace("x", labels(**{"kubernetes.io/metadata.name": "x"}))}
    rules = tuple(Rule(Direction.INGRESS, Action.ALLOW, (Peer(namespace_selector=LabelSelector()),),
                       (PortSpec(port=1000 + i),), name=f"r{i}") for i in range(50))
    policy = Policy(PolicyKind.ACNP, "many", tier="application", priority=1,
                    applied_to=(AppliedTo(pod_selector=LabelSelector(labels(app="web"))),), rules=rules)

    def ep(i: int, app: str = "web") -> Endpoint:
        return Endpoint(Pod("x", f"p{i}", labels(app=app)), f"10.0.0.{i + 2}", "02:00:00:00:00:01", i + 2)

    base = [ep(i) for i in range(4)] + [ep(9, "db")]
    snap, _ = incremental.update(None, ClusterState(ns, tuple(base), (policy,)))
    grown = ClusterState(ns, tuple(base + [ep(5)]), (policy,))
    snap2, delta = incremental.update(snap, grown)
    # Applied to, and a peer of, each of the 50 rules, in the class of the other web Pods: the
    # rules match that class already, so only the two flows loading its class are new.
    assert not delta.removed and sorted(f.describe() for f in delta.added) == [
        "table=25 priority=100 match=in_port=7", "table=26 priority=100 match=eth_type=2048,ipv4_dst=10.0.0.7"]
    assert sorted(f.key for f in snap2.flows()) == sorted(f.key for f in compile_policies(grown).flows)
    # A Pod only a peer selects joins the class of the other such Pod: its own two flows again.
    _, delta = incremental.update(snap2, ClusterState(ns, tuple(base + [ep(5), ep(6, "db")]), (policy,)))
    assert len(delta.added) == 2 and not delta.removed
    assert all(("in_port", 8) in f.match or ("ipv4_dst", "10.0.0.8") in f.match for f in delta.added)
