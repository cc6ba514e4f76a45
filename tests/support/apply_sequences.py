"""Sequences of `npaudit apply|delete` requests and agent restarts, for the property that the switch
holds exactly compile(store) and the store holds exactly what the operator was told succeeded.

The vocabulary mixes requests that succeed, requests validation rejects (a typo, a lone
surrogate, a valid policy bundled with an invalid one), requests the engine rejects (a Tier
priority taken, a Tier still in use, a policy naming an unknown Tier) and requests whose
outcome depends on what came before. Shared by the fake-switch (unit) and real-OVS
(integration) versions of the property.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from hypothesis import strategies as st

from packetin import messages
from policy_agent.ovs import tables
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies
from policy_agent.policy.manifests import ObjectSet, load_text
from policy_agent.policy.model import STANDARD_TIERS, Pod

RESTART = "restart"


def _ns(name: str, logging: bool = False) -> str:
    ann = "\n  annotations: {networkpolicy.antrea.io/enable-logging: \"true\"}" if logging else ""
    return (f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"
            f"  labels: {{kubernetes.io/metadata.name: {name}}}{ann}\n")


def _pod(ns: str, name: str, app: str) -> str:
    return f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}}}}}\n"


def _acnp(name: str, spec: str) -> str:
    return f"apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {{name: {name}}}\nspec:\n{spec}"


def _tier(name: str, priority: int) -> str:
    return (f"apiVersion: crd.antrea.io/v1beta1\nkind: Tier\nmetadata: {{name: {name}}}\n"
            f"spec: {{priority: {priority}}}\n")


DROP_81 = _acnp("drop-81", "  priority: 1\n  appliedTo: [{podSelector: {matchLabels: {app: web}}}]\n"
                           "  ingress: [{action: Drop, ports: [{protocol: TCP, port: 81}]}]\n")
FREEZE = _acnp("freeze", "  priority: 1\n  tier: ops\n  appliedTo: [{podSelector: {}}]\n"
                         "  ingress: [{action: Drop, ports: [{protocol: TCP, port: 80}]}]\n")
BASELINE_EGRESS = _acnp("no-egress-to-y", "  priority: 3\n  tier: baseline\n"
                                          "  appliedTo: [{podSelector: {matchLabels: {app: db}}}]\n"
                                          "  egress: [{action: Drop, to: [{namespaceSelector: {matchLabels: "
                                          "{kubernetes.io/metadata.name: y}}}]}]\n")
NP_X = ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-y, namespace: x}\n"
        "spec:\n  podSelector: {}\n  ingress: [{from: [{namespaceSelector: {matchLabels: "
        "{kubernetes.io/metadata.name: y}}}], ports: [{protocol: TCP, port: 80}]}]\n")
TYPO = _acnp("typo", "  priority: 1\n  appliedTo: [{podSelector: {}}]\n  ingress: [{action: Deny}]\n")


def _json_rule_named(escaped: str) -> str:
    """An ACNP as JSON whose rule name is written with the given \\u escapes."""
    return json.dumps({"apiVersion": "crd.antrea.io/v1beta1", "kind": "ClusterNetworkPolicy",
                       "metadata": {"name": "fire"},
                       "spec": {"priority": 1, "appliedTo": [{"podSelector": {}}],
                                "ingress": [{"name": "@NAME@", "action": "Drop", "ports": [{"port": 9}]}]}}
                      ).replace("@NAME@", escaped)

# name -> (op, manifests)
REQUESTS: dict[str, tuple[str, str]] = {
    "base": ("apply", "---\n".join([_ns("x"), _ns("y"), _pod("x", "a", "web"), _pod("x", "b", "db"),
                                    _pod("y", "a", "web")])),
    "relabel-xb": ("apply", _pod("x", "b", "web")),
    "delete-pod-xb": ("delete", _pod("x", "b", "db")),
    "logging-x": ("apply", _ns("x", logging=True)),
    "delete-ns-y": ("delete", _ns("y")),
    "drop-81": ("apply", DROP_81),
    "tier-ops": ("apply", _tier("ops", 10)),
    "tier-sec-takes-10": ("apply", _tier("sec", 10)),
    "delete-tier-ops": ("delete", _tier("ops", 10)),
    "freeze-in-ops": ("apply", FREEZE),
    "delete-freeze": ("delete", FREEZE),
    "tier-and-freeze": ("apply", _tier("ops", 10) + "---\n" + FREEZE),
    "baseline-egress": ("apply", BASELINE_EGRESS),
    "np-x": ("apply", NP_X),
    "np-x-with-typo": ("apply", NP_X + "---\n" + TYPO),
    "emoji-name": ("apply", _json_rule_named("fire-\\ud83d\\udd25")),  # a surrogate pair, as in the report
    "lone-surrogate-name": ("apply", _json_rule_named("fire-\\ud800")),
}

# Most sequences start from the Namespaces and Pods, which most policies need to select anything.
steps = st.tuples(st.booleans(), st.lists(st.sampled_from(sorted(REQUESTS) + [RESTART, RESTART]),
                                          min_size=2, max_size=12)).map(lambda t: ["base"] * t[0] + t[1])


@dataclass(frozen=True)
class RunningPod:
    """A Pod whose CNI ADD completed: what the agent re-realises after a restart."""

    namespace: str
    name: str
    ip: str
    mac: str
    ofport: int


RUNNING = (RunningPod("x", "a", "10.244.0.2", "02:00:0a:f4:00:02", 2),
           RunningPod("x", "b", "10.244.0.3", "02:00:0a:f4:00:03", 3),
           RunningPod("y", "a", "10.244.0.4", "02:00:0a:f4:00:04", 4))


ObjectKey = tuple[str, ...]


def keyed(objs: ObjectSet) -> dict[ObjectKey, Any]:
    out: dict[ObjectKey, Any] = {}
    out.update((("Namespace", ns.name), ns) for ns in objs.namespaces)
    out.update((("Pod", *pod.key), pod) for pod in objs.pods)
    out.update((("Tier", t.name), t) for t in objs.tiers)
    out.update((("Policy", *p.key), p) for p in objs.policies)
    return out


class Told:
    """What the operator was told: the objects of every request answered ok, in order."""

    def __init__(self) -> None:
        self.objects: dict[ObjectKey, Any] = {}

    def succeeded(self, op: str, text: str) -> None:
        tiers = [k[1] for k in self.objects if k[0] == "Tier"]
        for key, obj in keyed(load_text(text, "told", known_tiers=tiers)).items():
            if op == "apply":
                self.objects[key] = obj
            else:
                self.objects.pop(key, None)


def expected_flows(store: ObjectSet, running: Iterable[RunningPod], round_: int) -> list[messages.FlowSpec]:
    """compile(store): the fixed pipeline, every policy flow and each running Pod's own flows."""
    pods = {pod.key: pod for pod in store.pods}
    endpoints = tuple(Endpoint(pods.get((r.namespace, r.name)) or Pod(r.namespace, r.name), r.ip, r.mac, r.ofport)
                      for r in running)
    state = ClusterState(namespaces={ns.name: ns for ns in store.namespaces}, endpoints=endpoints,
                         policies=tuple(store.policies),
                         tiers={**STANDARD_TIERS, **{t.name: t.priority for t in store.tiers}},
                         meters=True, round_=round_)
    return (tables.fixed_flows(round_) + compile_policies(state).flows
            + [f for r in running for f in tables.pod_flows(round_, ip=r.ip, mac=r.mac, ofport=r.ofport)])


def ranked(flows: Iterable[tuple[int, int, Any]]) -> list[tuple[int, int, Any]]:
    """(table, priority, rest) with each priority replaced by its dense rank within its table:
    an incremental compile keeps old priorities, a fresh one spreads them anew; the order of
    rules is what decides, and the rank keeps exactly that."""
    flows = list(flows)
    by_table: dict[int, list[int]] = {}
    for table, priority, _ in flows:
        by_table.setdefault(table, []).append(priority)
    rank = {t: {p: i for i, p in enumerate(sorted(set(ps)))} for t, ps in by_table.items()}
    return sorted(((t, rank[t][p], rest) for t, p, rest in flows), key=repr)
