"""Policy, Pod and cluster builders and a compiled flow table to send packets through, for
compiler-level tests."""

from __future__ import annotations

import itertools

from policy_agent.ovs import tables
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies
from policy_agent.policy.model import (
    ENABLE_LOGGING_KEY,
    AppliedTo,
    ContainerPort,
    Direction,
    LabelSelector,
    Namespace,
    Pod,
    Policy,
    PolicyKind,
    Rule,
)
from tests.support.flowsim import FlowTable, Verdict

NS = ("x", "y", "z")
PODS = ("a", "b", "c")


def sel(**labels: str) -> LabelSelector:
    return LabelSelector(tuple(sorted(labels.items())))


def ns_sel(name: str) -> LabelSelector:
    return sel(**{"kubernetes.io/metadata.name": name})


def cluster(*policies: Policy, logging_ns: tuple[str, ...] = ()) -> ClusterState:
    namespaces = {n: Namespace(n, (("kubernetes.io/metadata.name", n),),
                               ((ENABLE_LOGGING_KEY, "true"),) if n in logging_ns else ()) for n in NS}
    eps = []
    for i, (n, pn) in enumerate(itertools.product(NS, PODS)):
        pod = Pod(n, pn, (("pod", pn),), (ContainerPort("http", 8080),))
        eps.append(Endpoint(pod, f"10.244.0.{i + 2}", f"02:00:0a:f4:00:{i + 2:02x}", i + 2))
    return ClusterState(namespaces, tuple(eps), tuple(policies))


def ep(state: ClusterState, name: str) -> Endpoint:
    n, pn = name.split("/")
    return next(e for e in state.endpoints if e.pod.key == (n, pn))


def table(state: ClusterState) -> FlowTable:
    flows = tables.fixed_flows(1) + compile_policies(state).flows
    for e in state.endpoints:
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    return FlowTable(flows)


def send(state: ClusterState, src: str, dst: str, port: int = 80, proto: str = "tcp",
         ft: FlowTable | None = None) -> Verdict:
    s, d = ep(state, src), ep(state, dst)
    num = {"tcp": 6, "udp": 17}[proto]
    pkt = {"in_port": s.ofport, "eth_type": 0x0800, "ipv4_src": s.ip, "ipv4_dst": d.ip, "ip_proto": num,
           f"{proto}_dst": port}
    v = (ft or table(state)).run(pkt)
    if v.forwarded:
        assert v.output == d.ofport
    return v


def acnp(name: str, rules: tuple[Rule, ...], tier: str = "application", priority: float = 5,
         applied: LabelSelector | None = None, applied_ns: LabelSelector | None = None) -> Policy:
    return Policy(PolicyKind.ACNP, name, tier=tier, priority=priority,
                  applied_to=(AppliedTo(pod_selector=applied, namespace_selector=applied_ns),), rules=rules)


def rule_of(state: ClusterState, policy: str, rule: str):  # type: ignore[no-untyped-def]
    return next(r for r in compile_policies(state).rules.values()
                if r.policy_name == policy and r.rule_name == rule)


def k8s(name: str, ns: str, rules: tuple[Rule, ...], isolates: tuple[Direction, ...],
        pods: LabelSelector | None = None) -> Policy:
    return Policy(PolicyKind.K8S, name, namespace=ns, applied_to=(AppliedTo(pod_selector=pods or LabelSelector()),),
                  rules=rules, isolates=isolates)
