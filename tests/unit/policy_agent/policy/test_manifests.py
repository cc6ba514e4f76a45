"""Manifest loading: exact models per kind and API group, field-precise errors, all-or-nothing sets."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_agent.policy import manifests
from policy_agent.policy.model import (
    Action, AppliedTo, ContainerPort, Direction, IPBlock, LabelSelector, Namespace, Peer, Pod,
    Policy, PolicyKind, PortSpec, Requirement, Rule, Tier,
)

ROOT = Path(__file__).resolve().parents[4]
SAMPLES = ROOT / "config" / "samples"
V1BETA1 = "crd.antrea.io/v1beta1"
LEGACY_GROUPS = ["crd.antrea.io/v1alpha1", "security.antrea.tanzu.vmware.com/v1alpha1"]
SRC = "t.yaml"


def load(text: str) -> manifests.ObjectSet:
    return manifests.load_text(textwrap.dedent(text), SRC)


def errors_of(text: str) -> list[str]:
    with pytest.raises(manifests.ManifestError) as err:
        load(text)
    return err.value.errors


def doc(api: str, kind: str, meta: str, spec: str) -> str:
    """One YAML document; `spec` is an unindented YAML block placed under `spec:`."""
    body = textwrap.indent(textwrap.dedent(spec).strip(), "  ")
    return f"apiVersion: {api}\nkind: {kind}\nmetadata: {meta}\nspec:\n{body}\n"


def acnp(spec: str, name: str = "p", api: str = V1BETA1) -> str:
    return doc(api, "ClusterNetworkPolicy", f"{{name: {name}}}", spec)


def anp(spec: str, name: str = "p", ns: str = "x", api: str = V1BETA1) -> str:
    return doc(api, "NetworkPolicy", f"{{name: {name}, namespace: {ns}}}", spec)


def netpol(spec: str, name: str = "p", ns: str = "x") -> str:
    return doc("networking.k8s.io/v1", "NetworkPolicy", f"{{name: {name}, namespace: {ns}}}", spec)


def tier(name: str, priority: Any, api: str = V1BETA1) -> str:
    return doc(api, "Tier", f"{{name: {name}}}", f"priority: {priority}")


def sel(**labels: str) -> LabelSelector:
    return LabelSelector(match_labels=tuple(sorted(labels.items())))


# --- one valid example of each kind -----------------------------------------------------------

def test_namespace_gets_sorted_labels_annotations_and_the_name_label() -> None:
    s = load("""
        apiVersion: v1
        kind: Namespace
        metadata:
          name: z
          labels: {team: red, env: prod}
          annotations: {networkpolicy.antrea.io/enable-logging: "true"}
          uid: 1234            # server-set metadata is ignored
        status: {phase: Active}
    """)
    assert s == manifests.ObjectSet(namespaces=(Namespace(
        name="z",
        labels=(("env", "prod"), ("kubernetes.io/metadata.name", "z"), ("team", "red")),
        annotations=(("networkpolicy.antrea.io/enable-logging", "true"),)),))
    assert s.namespaces[0].logging_enabled


def test_pod_with_container_ports_and_default_namespace() -> None:
    s = load("""
        apiVersion: v1
        kind: Pod
        metadata: {name: web-1, labels: {pod: a, app: web}}
        spec:
          nodeName: n1
          containers:
          - name: c1
            image: nginx
            ports: [{name: http, containerPort: 8080}, {containerPort: 9090, protocol: UDP}]
          - name: c2
            ports: [{name: dns, containerPort: 53, protocol: SCTP}]
    """)
    assert s.pods == (Pod(namespace="default", name="web-1", labels=(("app", "web"), ("pod", "a")),
                          ports=(ContainerPort("http", 8080, "TCP"), ContainerPort("", 9090, "UDP"),
                                 ContainerPort("dns", 53, "SCTP")), node="n1"),)


def test_tier() -> None:
    s = load(tier("devops", 120) + "  description: DevOps team\n")
    assert s == manifests.ObjectSet(tiers=(Tier(name="devops", priority=120),))


K8S_NETPOL = netpol("""
    podSelector:
      matchLabels: {pod: a}
      matchExpressions:
      - {key: tier, operator: NotIn, values: [db, cache, db]}
      - {key: app, operator: Exists}
    policyTypes: [Egress, Ingress]
    ingress:
    - from:
      - podSelector: {matchLabels: {pod: b}}
      - namespaceSelector: {matchLabels: {ns: y}}
        podSelector: {}
      - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}
      ports:
      - port: 80
      - {protocol: UDP, port: dns}
    egress:
    - {}
""", name="np", ns="z")


def test_k8s_networkpolicy_exact_model() -> None:
    s = load(K8S_NETPOL)
    assert s.policies == (Policy(
        kind=PolicyKind.K8S, name="np", namespace="z",
        applied_to=(AppliedTo(pod_selector=LabelSelector(
            match_labels=(("pod", "a"),),
            match_expressions=(Requirement("app", "Exists"), Requirement("tier", "NotIn", ("cache", "db"))))),),
        rules=(
            Rule(direction=Direction.INGRESS, action=Action.ALLOW, name="ingress-0",
                 peers=(Peer(pod_selector=sel(pod="b")),
                        Peer(pod_selector=LabelSelector(), namespace_selector=sel(ns="y")),
                        Peer(ip_block=IPBlock("10.0.0.0/8", ("10.1.0.0/16",)))),
                 ports=(PortSpec("TCP", 80), PortSpec("UDP", "dns"))),
            Rule(direction=Direction.EGRESS, action=Action.ALLOW, name="egress-0"),
        ),
        isolates=(Direction.INGRESS, Direction.EGRESS)),)
    assert s.policies[0].ref == "K8sNetworkPolicy:z/np"


ACNP_SPEC = """
    tier: securityops
    priority: 10
    appliedTo:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}
    - podSelector: {matchLabels: {pod: c}}
      namespaceSelector: {}
    ingress:
    - name: drop-x-a
      action: Drop
      enableLogging: true
      logLabel: x-a.to_y
      from:
      - podSelector: {matchLabels: {pod: a}}
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
      - podSelector: {}
        namespaces: {match: Self}
      ports: [{protocol: TCP, port: 80}, {port: 8000, endPort: 8080}]
    - action: Pass
    egress:
    - action: Reject
      to: [{ipBlock: {cidr: "fd00::1/64"}}]
      ports: [{protocol: SCTP}]
"""

ACNP_MODEL = Policy(
    kind=PolicyKind.ACNP, name="acnp-drop", namespace="", tier="securityops", priority=10.0,
    applied_to=(AppliedTo(namespace_selector=sel(**{"kubernetes.io/metadata.name": "y"})),
                AppliedTo(pod_selector=sel(pod="c"), namespace_selector=LabelSelector())),
    rules=(
        Rule(direction=Direction.INGRESS, action=Action.DROP, name="drop-x-a", enable_logging=True,
             log_label="x-a.to_y",
             peers=(Peer(pod_selector=sel(pod="a"), namespace_selector=sel(**{"kubernetes.io/metadata.name": "x"})),
                    Peer(pod_selector=LabelSelector(), namespace_self=True)),
             ports=(PortSpec("TCP", 80), PortSpec("TCP", 8000, 8080))),
        Rule(direction=Direction.INGRESS, action=Action.PASS, name="ingress-1"),
        Rule(direction=Direction.EGRESS, action=Action.REJECT, name="egress-0",
             peers=(Peer(ip_block=IPBlock("fd00::/64")),), ports=(PortSpec("SCTP"),)),
    ))


def test_antrea_cluster_network_policy_exact_model() -> None:
    s = load(acnp(ACNP_SPEC, name="acnp-drop"))
    assert s.policies == (ACNP_MODEL,)
    assert s.policies[0].ref == "AntreaClusterNetworkPolicy:acnp-drop"


ANP_SPEC = """
    priority: 3.5
    appliedTo: [{podSelector: {matchLabels: {pod: a}}}]
    ingress:
    - action: Allow
      from: [{namespaceSelector: {matchExpressions: [{key: ns, operator: In, values: [y, x]}]}}]
"""

ANP_MODEL = Policy(
    kind=PolicyKind.ANP, name="anp-1", namespace="x", tier="application", priority=3.5,
    applied_to=(AppliedTo(pod_selector=sel(pod="a")),),
    rules=(Rule(direction=Direction.INGRESS, action=Action.ALLOW, name="ingress-0",
                peers=(Peer(namespace_selector=LabelSelector(
                    match_expressions=(Requirement("ns", "In", ("x", "y")),))),)),))


def test_antrea_network_policy_exact_model_defaults_to_application_tier() -> None:
    s = load(anp(ANP_SPEC, name="anp-1"))
    assert s.policies == (ANP_MODEL,)
    assert s.policies[0].ref == "AntreaNetworkPolicy:x/anp-1"


@pytest.mark.parametrize("api", LEGACY_GROUPS)
def test_legacy_api_groups_build_identical_objects(api: str) -> None:
    legacy = load("---\n".join([acnp(ACNP_SPEC, name="acnp-drop", api=api), anp(ANP_SPEC, name="anp-1", api=api),
                                tier("devops", 120, api=api)]))
    assert legacy == manifests.ObjectSet(tiers=(Tier("devops", 120),), policies=(ACNP_MODEL, ANP_MODEL))


def test_legacy_camelcase_standard_tier_names_are_normalised() -> None:
    s = load(acnp("tier: SecurityOps\npriority: 1\nappliedTo: [{podSelector: {}}]"))
    assert s.policies[0].tier == "securityops"


def test_antrea_and_k8s_networkpolicy_of_the_same_name_are_distinct_objects() -> None:
    s = load(anp(ANP_SPEC, name="same") + "---\n" + netpol("podSelector: {}", name="same"))
    assert [p.kind for p in s.policies] == [PolicyKind.ANP, PolicyKind.K8S]


def test_list_items_are_loaded_and_located() -> None:
    text = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "x"}},
    ]}
    s = manifests.load_text(yaml.safe_dump(text), SRC)
    assert [n.name for n in s.namespaces] == ["x"] and s.pods == (Pod("x", "a"),)
    text["items"].append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "B"}})
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text(yaml.safe_dump(text), SRC)
    assert err.value.errors == [
        "Pod/default/B (t.yaml#1.items[2]): metadata.name: must be a DNS-1123 subdomain (at most 253 "
        "characters: lowercase letters, digits, '-' and '.', starting and ending alphanumeric); got 'B'"]


# --- Kubernetes semantics -------------------------------------------------------------------

@pytest.mark.parametrize("spec, isolates, rule_names", [
    ("podSelector: {}\ningress: [{}]", (Direction.INGRESS,), ["ingress-0"]),
    ("podSelector: {}", (Direction.INGRESS,), []),
    ("podSelector: {}\negress: [{}]", (Direction.INGRESS, Direction.EGRESS), ["egress-0"]),
    # Kubernetes adds Egress only for a non-empty egress list.
    ("podSelector: {}\negress: []", (Direction.INGRESS,), []),
    ("podSelector: {}\npolicyTypes: []\negress: [{}]", (Direction.INGRESS, Direction.EGRESS), ["egress-0"]),
    ("podSelector: {}\npolicyTypes: [Egress]", (Direction.EGRESS,), []),
    # Rules of a direction the policy does not isolate have no effect, so none are built.
    ("podSelector: {}\npolicyTypes: [Egress]\ningress: [{}]\negress: [{}]", (Direction.EGRESS,), ["egress-0"]),
])
def test_k8s_policy_types_default_like_kubernetes(spec: str, isolates: tuple[Direction, ...],
                                                  rule_names: list[str]) -> None:
    p = load(netpol(spec)).policies[0]
    assert p.isolates == isolates
    assert [r.name for r in p.rules] == rule_names
    assert all(r.action is Action.ALLOW and not r.enable_logging for r in p.rules)


def test_longest_valid_names_and_label_parts_load() -> None:
    name = "a." * 126 + "b"  # 253 characters
    value = "v" * 63
    p = load(netpol(f"podSelector: {{matchLabels: {{example.com/{'k' * 63}: {value}, e: ''}}}}", name=name)).policies[0]
    assert p.name == name
    assert p.applied_to[0].pod_selector == LabelSelector((("e", ""), (f"example.com/{'k' * 63}", value)))


def test_k8s_namespace_defaults_to_default() -> None:
    text = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}}\n"
    assert load(text).policies[0].namespace == "default"


def test_ports_named_ranges_and_protocol_default() -> None:
    p = load(netpol("""
        podSelector: {}
        ingress:
        - ports: [{port: http}, {port: 1000, endPort: 2000, protocol: UDP}, {port: 5, endPort: 5}, {protocol: SCTP}, {}]
    """)).policies[0]
    assert p.rules[0].ports == (PortSpec("TCP", "http"), PortSpec("UDP", 1000, 2000), PortSpec("TCP", 5, 5),
                                PortSpec("SCTP"), PortSpec("TCP"))


def test_ipblock_is_normalised_and_excepts_sorted() -> None:
    p = load(netpol("""
        podSelector: {}
        egress:
        - to: [{ipBlock: {cidr: 10.1.2.3/8, except: [10.200.0.0/16, 10.3.0.0/16, 10.3.0.0/16]}}]
    """)).policies[0]
    assert p.rules[0].peers == (Peer(ip_block=IPBlock("10.0.0.0/8", ("10.3.0.0/16", "10.200.0.0/16"))),)


def test_rule_names_default_per_direction_and_explicit_names_are_kept() -> None:
    p = load(acnp("""
        priority: 1
        appliedTo: [{podSelector: {}}]
        ingress: [{action: Allow}, {action: Drop, name: web}, {action: Drop, name: ""}]
        egress: [{action: Allow}]
    """)).policies[0]
    assert [r.name for r in p.rules] == ["ingress-0", "web", "ingress-2", "egress-0"]


def test_rule_level_applied_to_on_every_rule() -> None:
    p = load(anp("""
        priority: 1
        ingress: [{action: Allow, appliedTo: [{podSelector: {matchLabels: {pod: a}}}]}]
        egress: [{action: Drop, appliedTo: [{podSelector: {}}]}]
    """)).policies[0]
    assert p.applied_to == ()
    assert [r.applied_to for r in p.rules] == [(AppliedTo(pod_selector=sel(pod="a")),),
                                              (AppliedTo(pod_selector=LabelSelector()),)]


def test_custom_tier_can_be_referenced_in_the_same_set() -> None:
    s = load(tier("devops", 120) + "---\n" + acnp("tier: devops\npriority: 1\nappliedTo: [{podSelector: {}}]"))
    assert s.policies[0].tier == "devops"


# --- validation: every rule has a failing example --------------------------------------------

APPLY_ALL = "appliedTo: [{podSelector: {}}]"
AC = "ClusterNetworkPolicy/p (t.yaml#1)"
AN = "AntreaNetworkPolicy/x/p (t.yaml#1)"
NP = "NetworkPolicy/x/p (t.yaml#1)"
LABEL_VALUE_RULE = "must be at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric"
LABEL_NAME_RULE = "the name must be 1-63 characters of [A-Za-z0-9._-], starting and ending alphanumeric"
PORT_NAME_RULE = "must be at most 15 characters of [a-z0-9-] with at least one letter and no leading, trailing or double '-'"

INVALID = [
    # actions, priorities, tiers
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Deny}}]"),
     f"{AC}: spec.ingress[0].action: must be one of Allow, Drop, Reject, Pass; got 'Deny'"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{from: [{{podSelector: {{}}}}]}}]"),
     f"{AC}: spec.ingress[0].action: required"),
    (acnp(APPLY_ALL), f"{AC}: spec.priority: required"),
    (acnp(f"priority: 0.5\n{APPLY_ALL}"), f"{AC}: spec.priority: must be 1.0..10000.0; got 0.5"),
    (acnp(f"priority: 10001\n{APPLY_ALL}"), f"{AC}: spec.priority: must be 1.0..10000.0; got 10001"),
    (acnp(f"priority: high\n{APPLY_ALL}"), f"{AC}: spec.priority: must be a number, got string"),
    (acnp(f"priority: true\n{APPLY_ALL}"), f"{AC}: spec.priority: must be a number, got boolean"),
    (acnp(f"priority: .nan\n{APPLY_ALL}"), f"{AC}: spec.priority: must be 1.0..10000.0; got nan"),
    (acnp(f"priority: 1\ntier: [a]\n{APPLY_ALL}"), f"{AC}: spec.tier: must be a string, got list"),
    (acnp(f"priority: 1\ntier: nosuch\n{APPLY_ALL}"),
     f"{AC}: spec.tier: unknown tier 'nosuch'; expected a standard tier (emergency, securityops, networkops, "
     "platform, application, baseline), a Tier in this set or one applied earlier"),
    (acnp(f"priority: 1\ntier: baseline\n{APPLY_ALL}\negress: [{{action: Pass}}]"),
     f"{AC}: spec.egress[0].action: Pass is not allowed in the baseline tier"),
    # rule fields
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, enableLogging: 'yes'}}]"),
     f"{AC}: spec.ingress[0].enableLogging: must be a boolean, got string"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, logLabel: 'a b'}}]"),
     f"{AC}: spec.ingress[0].logLabel: must be at most 63 characters of [A-Za-z0-9._-]; got 'a b'"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, logLabel: {'l' * 64}}}]"),
     f"{AC}: spec.ingress[0].logLabel: must be at most 63 characters of [A-Za-z0-9._-]; got '{'l' * 64}'"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, logLabel: 7}}]"),
     f"{AC}: spec.ingress[0].logLabel: must be a string, got integer"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, name: 3}}]"),
     f"{AC}: spec.ingress[0].name: must be a string, got integer"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop}}, {{action: Drop, name: ingress-0}}]"),
     f"{AC}: spec.ingress[1].name: duplicate rule name 'ingress-0'; rule names must be unique"),
    (acnp(f"priority: 1\n{APPLY_ALL}\negress: [{{action: Drop, from: []}}]"),
     f"{AC}: spec.egress[0].from: unknown field; expected one of action, appliedTo, enableLogging, logLabel, "
     "name, ports, protocols, to"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, toServices: []}}]"),
     f"{AC}: spec.ingress[0].toServices: unknown field; expected one of action, appliedTo, enableLogging, "
     "from, logLabel, name, ports, protocols"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: {{action: Drop}}"),
     f"{AC}: spec.ingress: must be a list, got mapping"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [Drop]"),
     f"{AC}: spec.ingress[0]: must be a mapping, got string"),
    (acnp(f"priority: 1\n{APPLY_ALL}\npolicyTypes: [Ingress]"),
     f"{AC}: spec.policyTypes: unknown field; expected one of appliedTo, egress, "
     "ingress, priority, tier"),
    # appliedTo placement and content
    (acnp("priority: 1"), f"{AC}: spec.appliedTo: required (or set appliedTo on every rule)"),
    (acnp("priority: 1\nappliedTo: []\ningress: [{action: Drop}]"),
     f"{AC}: spec.appliedTo: required (or set appliedTo on every rule)"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, {APPLY_ALL}}}]"),
     f"{AC}: spec.appliedTo: must not be set when rules set appliedTo (spec.ingress[0].appliedTo)"),
    (acnp(f"priority: 1\ningress: [{{action: Drop, {APPLY_ALL}}}, {{action: Drop}}]"),
     f"{AC}: spec.ingress[1].appliedTo: required: other rules set appliedTo, so every rule must"),
    (acnp("priority: 1\nappliedTo: [{}]"), f"{AC}: spec.appliedTo[0]: must set podSelector or namespaceSelector"),
    (acnp("priority: 1\nappliedTo: [{podSelectr: {}}]"),
     f"{AC}: spec.appliedTo[0].podSelectr: unknown field (did you mean 'podSelector'?); expected one of "
     "namespaceSelector, podSelector"),
    (anp("priority: 1\nappliedTo: [{namespaceSelector: {}}]"),
     f"{AN}: spec.appliedTo[0].namespaceSelector: not allowed in an Antrea NetworkPolicy, which applies only in "
     "its own Namespace"),
    (anp("priority: 1\ningress: [{action: Drop, appliedTo: [{namespaceSelector: {}}]}]"),
     f"{AN}: spec.ingress[0].appliedTo[0].namespaceSelector: not allowed in an Antrea NetworkPolicy, which "
     "applies only in its own Namespace"),
    # peers: a typo must never widen a policy
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, from: [{{podSelectr: {{matchLabels: {{a: b}}}}}}]}}]"),
     f"{AC}: spec.ingress[0].from[0].podSelectr: unknown field (did you mean 'podSelector'?); expected one of "
     "ipBlock, namespaceSelector, namespaces, podSelector"),
    (netpol("podSelector: {}\ningress: [{from: [{podSelectr: {}}]}]"),
     f"{NP}: spec.ingress[0].from[0].podSelectr: unknown field (did you mean 'podSelector'?); expected one of "
     "ipBlock, namespaceSelector, podSelector"),
    (netpol("podSelector: {}\ningress: [{from: [{namespaces: {match: Self}}]}]"),
     f"{NP}: spec.ingress[0].from[0].namespaces: unknown field (did you mean 'namespaceSelector'?); expected "
     "one of ipBlock, namespaceSelector, podSelector"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, from: [{{}}]}}]"),
     f"{AC}: spec.ingress[0].from[0]: must set one of ipBlock, namespaceSelector, namespaces, podSelector"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, from: [{{podSelector: {{}}, ipBlock: {{cidr: 1.0.0.0/8}}}}]}}]"),
     f"{AC}: spec.ingress[0].from[0]: ipBlock cannot be combined with podSelector"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, from: [{{namespaceSelector: {{}}, namespaces: {{match: Self}}}}]}}]"),
     f"{AC}: spec.ingress[0].from[0]: namespaces and namespaceSelector cannot both be set"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, from: [{{namespaces: {{match: Other}}}}]}}]"),
     f"{AC}: spec.ingress[0].from[0].namespaces.match: must be Self; got 'Other'"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, from: [{{namespaces: {{match: Self, sameLabels: [a]}}}}]}}]"),
     f"{AC}: spec.ingress[0].from[0].namespaces.sameLabels: unknown field; expected one of match"),
    # selectors and labels
    (netpol("podSelector: {matchLabels: {pod: 1}}"),
     f"{NP}: spec.podSelector.matchLabels.pod: label value must be a string, got integer"),
    (netpol("podSelector: {matchLabels: {pod: -a}}"),
     f"{NP}: spec.podSelector.matchLabels.pod: invalid label value '-a': {LABEL_VALUE_RULE}"),
    (netpol(f"podSelector: {{matchLabels: {{pod: {'v' * 64}}}}}"),
     f"{NP}: spec.podSelector.matchLabels.pod: invalid label value '{'v' * 64}': {LABEL_VALUE_RULE}"),
    (netpol("podSelector: {matchLabels: {'a b': x}}"),
     f"{NP}: spec.podSelector.matchLabels.a b: invalid label key 'a b': {LABEL_NAME_RULE}"),
    (netpol(f"podSelector: {{matchLabels: {{{'k' * 64}: x}}}}"),
     f"{NP}: spec.podSelector.matchLabels.{'k' * 64}: invalid label key '{'k' * 64}': {LABEL_NAME_RULE}"),
    (netpol("podSelector: {matchLabels: {'Example.com/app': x}}"),
     f"{NP}: spec.podSelector.matchLabels.Example.com/app: invalid label key 'Example.com/app': the prefix "
     "must be a DNS-1123 subdomain"),
    (netpol("podSelector: {matchLabels: {'example.com/': x}}"),
     f"{NP}: spec.podSelector.matchLabels.example.com/: invalid label key 'example.com/': {LABEL_NAME_RULE}"),
    (netpol("podSelector: {matchLabel: {pod: a}}"),
     f"{NP}: spec.podSelector.matchLabel: unknown field (did you mean 'matchLabels'?); expected one of "
     "matchExpressions, matchLabels"),
    (netpol("podSelector: {matchExpressions: [{key: a, operator: In}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].values: must be non-empty for operator In"),
    (netpol("podSelector: {matchExpressions: [{key: a, operator: NotIn, values: []}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].values: must be non-empty for operator NotIn"),
    (netpol("podSelector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].values: must be empty for operator Exists"),
    (netpol("podSelector: {matchExpressions: [{key: a, operator: DoesNotExist, values: [b]}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].values: must be empty for operator DoesNotExist"),
    (netpol("podSelector: {matchExpressions: [{key: a, operator: Gt, values: ['1']}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].operator: must be one of In, NotIn, Exists, DoesNotExist; "
     "got 'Gt'"),
    (netpol("podSelector: {matchExpressions: [{key: a, operator: In, values: [1]}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].values[0]: label value must be a string, got integer"),
    (netpol("podSelector: {matchExpressions: [{operator: Exists}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].key: required"),
    (netpol("podSelector: {matchExpressions: [{key: 'a/b/c', operator: Exists}]}"),
     f"{NP}: spec.podSelector.matchExpressions[0].key: invalid label key 'a/b/c': the prefix must be a "
     "DNS-1123 subdomain"),
    (netpol("podSelector: []"), f"{NP}: spec.podSelector: must be a mapping, got list"),
    (netpol("ingress: [{}]"), f"{NP}: spec.podSelector: required"),
    (netpol("podSelector: {}\npolicyTypes: [Ingress, Both]"),
     f"{NP}: spec.policyTypes[1]: must be one of Ingress, Egress; got 'Both'"),
    (netpol("podSelector: {}\ningress: [{action: Drop}]"),
     f"{NP}: spec.ingress[0].action: unknown field; expected one of from, ports"),
    # ipBlock
    (netpol("podSelector: {}\negress: [{to: [{ipBlock: {cidr: 10.0.0.300/8}}]}]"),
     f"{NP}: spec.egress[0].to[0].ipBlock.cidr: must be a CIDR like 10.0.0.0/24 or fd00::/64; got '10.0.0.300/8'"),
    (netpol("podSelector: {}\negress: [{to: [{ipBlock: {cidr: 10.0.0.1}}]}]"),
     f"{NP}: spec.egress[0].to[0].ipBlock.cidr: must be a CIDR like 10.0.0.0/24 or fd00::/64; got '10.0.0.1'"),
    (netpol("podSelector: {}\negress: [{to: [{ipBlock: {except: [10.0.0.0/8]}}]}]"),
     f"{NP}: spec.egress[0].to[0].ipBlock.cidr: required"),
    (netpol("podSelector: {}\negress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]"),
     f"{NP}: spec.egress[0].to[0].ipBlock.except[0]: 11.0.0.0/16 is not a strict subset of cidr 10.0.0.0/8"),
    (netpol("podSelector: {}\negress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.0.0.0/8]}}]}]"),
     f"{NP}: spec.egress[0].to[0].ipBlock.except[0]: 10.0.0.0/8 is not a strict subset of cidr 10.0.0.0/8"),
    (netpol("podSelector: {}\negress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: ['fd00::/64']}}]}]"),
     f"{NP}: spec.egress[0].to[0].ipBlock.except[0]: fd00::/64 is not of the same address family as cidr "
     "10.0.0.0/8"),
    (netpol("podSelector: {}\negress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, exept: [10.1.0.0/16]}}]}]"),
     f"{NP}: spec.egress[0].to[0].ipBlock.exept: unknown field (did you mean 'except'?); expected one of cidr, "
     "except"),
    # ports
    (netpol("podSelector: {}\ningress: [{ports: [{port: 0}]}]"),
     f"{NP}: spec.ingress[0].ports[0].port: must be 1..65535; got 0"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: 65536}]}]"),
     f"{NP}: spec.ingress[0].ports[0].port: must be 1..65535; got 65536"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: 80.5}]}]"),
     f"{NP}: spec.ingress[0].ports[0].port: must be an integer, got number"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: '80'}]}]"),
     f"{NP}: spec.ingress[0].ports[0].port: named port '80' {PORT_NAME_RULE}"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: Http}]}]"),
     f"{NP}: spec.ingress[0].ports[0].port: named port 'Http' {PORT_NAME_RULE}"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: a-very-long-port-name}]}]"),
     f"{NP}: spec.ingress[0].ports[0].port: named port 'a-very-long-port-name' {PORT_NAME_RULE}"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: 80, protocol: tcp}]}]"),
     f"{NP}: spec.ingress[0].ports[0].protocol: must be one of TCP, UDP, SCTP; got 'tcp'"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: 80, protocol: ICMP}]}]"),
     f"{NP}: spec.ingress[0].ports[0].protocol: must be one of TCP, UDP, SCTP; got 'ICMP'"),
    (netpol("podSelector: {}\ningress: [{ports: [{endPort: 90}]}]"),
     f"{NP}: spec.ingress[0].ports[0].endPort: requires port"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: http, endPort: 90}]}]"),
     f"{NP}: spec.ingress[0].ports[0].endPort: requires a numeric port, not the named port 'http'"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: 100, endPort: 90}]}]"),
     f"{NP}: spec.ingress[0].ports[0].endPort: must be >= port 100; got 90"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: 100, endPort: 70000}]}]"),
     f"{NP}: spec.ingress[0].ports[0].endPort: must be 1..65535; got 70000"),
    (netpol("podSelector: {}\ningress: [{ports: [{port: 100, sourcePort: 9}]}]"),
     f"{NP}: spec.ingress[0].ports[0].sourcePort: unknown field; expected one of endPort, port, protocol"),
    (netpol("podSelector: {}\ningress: [{ports: 80}]"), f"{NP}: spec.ingress[0].ports: must be a list, got integer"),
    (acnp(f"priority: 1\n{APPLY_ALL}\ningress: [{{action: Drop, from: [null]}}]"),
     f"{AC}: spec.ingress[0].from[0]: must be a mapping, got null"),
    # metadata and names
    (netpol("podSelector: {}", name="Web_1"),
     "NetworkPolicy/x/Web_1 (t.yaml#1): metadata.name: must be a DNS-1123 subdomain (at most 253 characters: "
     "lowercase letters, digits, '-' and '.', starting and ending alphanumeric); got 'Web_1'"),
    (netpol("podSelector: {}", name="a" * 254),
     f"NetworkPolicy/x/{'a' * 254} (t.yaml#1): metadata.name: must be a DNS-1123 subdomain (at most 253 "
     f"characters: lowercase letters, digits, '-' and '.', starting and ending alphanumeric); got '{'a' * 76}..."),
    (netpol("podSelector: {}", ns="a.b"),
     "NetworkPolicy/a.b/p (t.yaml#1): metadata.namespace: must be a DNS-1123 label (at most 63 characters: "
     "lowercase letters, digits and '-', starting and ending alphanumeric); got 'a.b'"),
    (doc("networking.k8s.io/v1", "NetworkPolicy", "{namespace: x}", "podSelector: {}"),
     "NetworkPolicy/x/<unnamed> (t.yaml#1): metadata.name: required"),
    (doc(V1BETA1, "ClusterNetworkPolicy", "{name: p, namespace: x}", f"priority: 1\n{APPLY_ALL}"),
     f"{AC}: metadata.namespace: must not be set: ClusterNetworkPolicy is cluster scoped"),
    (f"apiVersion: {V1BETA1}\nkind: ClusterNetworkPolicy\nspec: {{priority: 1, {APPLY_ALL}}}\n",
     "ClusterNetworkPolicy/<unnamed> (t.yaml#1): metadata: required"),
    (f"apiVersion: {V1BETA1}\nkind: ClusterNetworkPolicy\nmetadata: {{name: p}}\n", f"{AC}: spec: required"),
    (acnp(f"priority: 1\n{APPLY_ALL}") + "sepc: {}\n",
     f"{AC}: sepc: unknown field (did you mean 'spec'?); expected one of apiVersion, kind, metadata, spec, status"),
    (doc("networking.k8s.io/v1", "NetworkPolicy", "{name: p, namespace: x, labels: {a: [1]}}", "podSelector: {}"),
     f"{NP}: metadata.labels.a: label value must be a string, got list"),
    # kinds and API groups
    (doc("v1", "Service", "{name: s}", "{}"),
     "Service/s (t.yaml#1): kind: unknown kind 'Service'; expected one of "
     "ClusterNetworkPolicy, List, Namespace, NetworkPolicy, Pod, Tier"),
    (doc("networking.k8s.io/v1beta1", "NetworkPolicy", "{name: p, namespace: x}", "podSelector: {}"),
     "NetworkPolicy/x/p (t.yaml#1): apiVersion: 'networking.k8s.io/v1beta1' does not serve kind NetworkPolicy; "
     "expected one of networking.k8s.io/v1, crd.antrea.io/v1beta1, crd.antrea.io/v1alpha1, "
     "security.antrea.tanzu.vmware.com/v1alpha1"),
    (doc("networking.k8s.io/v1", "ClusterNetworkPolicy", "{name: p}", "priority: 1"),
     "ClusterNetworkPolicy/p (t.yaml#1): apiVersion: 'networking.k8s.io/v1' does not serve kind "
     "ClusterNetworkPolicy; expected one of crd.antrea.io/v1beta1, crd.antrea.io/v1alpha1, "
     "security.antrea.tanzu.vmware.com/v1alpha1"),
    ("apiVersion: v1\nmetadata: {name: p}\n", "<no kind>/p (t.yaml#1): kind: required"),
    ("- a\n- b\n", "Document (t.yaml#1): must be a mapping with apiVersion and kind, got list"),
    ("apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: List, items: []}]\n",
     "List/<unnamed> (t.yaml#1.items[0]): kind: a List cannot contain another List"),
    ("apiVersion: v1\nkind: List\nitems: {a: b}\n", "List (t.yaml#1): items: must be a list, got mapping"),
    # Pods and Namespaces
    (doc("v1", "Pod", "{name: a}", "containers: [{ports: [{name: http, containerPort: 80}, {name: http, containerPort: 81}]}]"),
     "Pod/default/a (t.yaml#1): spec.containers[0].ports[1].name: duplicate port name 'http'"),
    (doc("v1", "Pod", "{name: a}", "containers: [{ports: [{name: http}]}]"),
     "Pod/default/a (t.yaml#1): spec.containers[0].ports[0].containerPort: required"),
    (doc("v1", "Pod", "{name: a}", "containers: [{ports: [{containerPort: 70000}]}]"),
     "Pod/default/a (t.yaml#1): spec.containers[0].ports[0].containerPort: must be 1..65535; got 70000"),
    (doc("v1", "Pod", "{name: a}", "containers: [{ports: [{containerPort: 80, protocol: HTTP}]}]"),
     "Pod/default/a (t.yaml#1): spec.containers[0].ports[0].protocol: must be one of TCP, UDP, SCTP; got 'HTTP'"),
    (doc("v1", "Pod", "{name: a}", "containers: [{ports: [{name: HTTP, containerPort: 80}]}]"),
     f"Pod/default/a (t.yaml#1): spec.containers[0].ports[0].name: named port 'HTTP' {PORT_NAME_RULE}"),
    (doc("v1", "Pod", "{name: a}", "containers: {c: 1}"),
     "Pod/default/a (t.yaml#1): spec.containers: must be a list, got mapping"),
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: {kubernetes.io/metadata.name: y}}\n",
     "Namespace/x (t.yaml#1): metadata.labels.kubernetes.io/metadata.name: must equal the Namespace name 'x'; "
     "got 'y'"),
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x, annotations: {a: 1}}\n",
     "Namespace/x (t.yaml#1): metadata.annotations.a: must be a string, got integer"),
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x.y}\n",
     "Namespace/x.y (t.yaml#1): metadata.name: must be a DNS-1123 label (at most 63 characters: lowercase "
     "letters, digits and '-', starting and ending alphanumeric); got 'x.y'"),
    # Tiers
    (tier("application", 7), "Tier/application (t.yaml#1): metadata.name: 'application' is reserved for a standard tier"),
    (tier("t", 100), "Tier/t (t.yaml#1): spec.priority: 100 is reserved by the standard tier securityops"),
    (tier("t", 253), "Tier/t (t.yaml#1): spec.priority: 253 is reserved by the standard tier baseline"),
    (tier("t", 251), "Tier/t (t.yaml#1): spec.priority: 251 is reserved by Antrea (251, 252, 254, 255)"),
    (tier("t", 0), "Tier/t (t.yaml#1): spec.priority: must be 1..255; got 0"),
    (tier("t", 256), "Tier/t (t.yaml#1): spec.priority: must be 1..255; got 256"),
    (tier("t", 1.5), "Tier/t (t.yaml#1): spec.priority: must be an integer, got number"),
    (doc(V1BETA1, "Tier", "{name: t}", "priority: 3\norder: 3"),
     "Tier/t (t.yaml#1): spec.order: unknown field; expected one of description, priority"),
    (tier("t", 10) + "---\n" + tier("u", 10),
     "Tier/u (t.yaml#2): spec.priority: 10 is already used by Tier/t (t.yaml#1)"),
    # duplicates
    (netpol("podSelector: {}") + "---\n" + netpol("podSelector: {}"),
     f"NetworkPolicy/x/p (t.yaml#2): metadata.name: duplicate of {NP}"),
]


@pytest.mark.parametrize("text, expected", INVALID, ids=[e.split(": ", 1)[1][:60] for _, e in INVALID])
def test_each_invalid_field_is_reported_precisely(text: str, expected: str) -> None:
    assert errors_of(text) == [expected]


def test_wrong_types_everywhere_are_errors_never_exceptions() -> None:
    errors = errors_of(acnp("""
        priority: 1
        appliedTo: {podSelector: {}}
        ingress:
        - action: [Drop]
          from: {podSelector: {}}
          ports: [80, {port: [80]}]
        egress: 5
    """))
    assert errors == [
        f"{AC}: spec.appliedTo: must be a list, got mapping",
        f"{AC}: spec.ingress[0].action: must be one of Allow, Drop, Reject, Pass; got ['Drop']",
        f"{AC}: spec.ingress[0].from: must be a list, got mapping",
        f"{AC}: spec.ingress[0].ports[0]: must be a mapping, got integer",
        f"{AC}: spec.ingress[0].ports[1].port: must be an integer, got list",
        f"{AC}: spec.egress: must be a list, got integer",
        f"{AC}: spec.appliedTo: required (or set appliedTo on every rule)",
    ]


def test_yaml_syntax_errors_name_the_source() -> None:
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text("apiVersion: v1\nkind: [Namespace\n", "bad.yaml")
    [line] = err.value.errors
    assert line.startswith("bad.yaml: invalid YAML at line 3, column 1: ")


@pytest.mark.parametrize("text", ["a: 2001-02-30\n", f"a: {'9' * 5000}\n", "!!python/object:os.system {}\n"])
def test_yaml_that_pyyaml_cannot_construct_is_a_manifest_error(text: str) -> None:
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text(text, "odd.yaml")
    assert err.value.errors[0].startswith("odd.yaml: invalid YAML")


def test_empty_documents_are_skipped_but_counted() -> None:
    s = manifests.load_text("# comment only\n---\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n", SRC)
    assert [n.name for n in s.namespaces] == ["x"]
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text("---\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: X}\n", SRC)
    assert err.value.errors[0].startswith("Namespace/X (t.yaml#2): metadata.name:")


# --- all or nothing ---------------------------------------------------------------------------

FIVE_OBJECTS = """\
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {pod: a}}
---
apiVersion: crd.antrea.io/v1beta1
kind: Tier
metadata: {name: devops}
spec: {priority: 120}
---
apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: acnp-drop}
spec:
  priority: 5
  appliedTo: [{podSelector: {}}]
  ingress:
  - action: %s
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec: {podSelector: {}}
"""


def test_one_bad_object_rejects_the_whole_set_and_is_named_precisely() -> None:
    good = manifests.load_text(FIVE_OBJECTS % "Drop", "policies.yaml")
    assert (len(good.namespaces), len(good.pods), len(good.tiers), len(good.policies)) == (1, 1, 1, 2)
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text(FIVE_OBJECTS % "Deny", "policies.yaml")
    assert err.value.errors == [
        "ClusterNetworkPolicy/acnp-drop (policies.yaml#4): spec.ingress[0].action: must be one of Allow, Drop, "
        "Reject, Pass; got 'Deny'"]
    assert str(err.value) == err.value.errors[0]


def test_every_problem_of_every_object_is_listed() -> None:
    text = (FIVE_OBJECTS % "Deny").replace("{priority: 120}", "{priority: 100}").replace("name: np,", "name: NP,")
    errors = [e.split(":")[0] for e in errors_of(text)]
    assert errors == ["Tier/devops (t.yaml#3)", "ClusterNetworkPolicy/acnp-drop (t.yaml#4)",
                      "NetworkPolicy/x/NP (t.yaml#5)"]


def test_load_documents_takes_parsed_objects() -> None:
    docs = list(yaml.safe_load_all(FIVE_OBJECTS % "Drop"))
    assert manifests.load_documents(docs, "api") == manifests.load_text(FIVE_OBJECTS % "Drop", "api")
    assert manifests.load_documents([], "api") == manifests.ObjectSet()


# --- directories ------------------------------------------------------------------------------

def test_directory_loads_yaml_yml_json_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.yml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n")
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n")
    (tmp_path / "c.json").write_text(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "c"}}))
    (tmp_path / "README.md").write_text("not a manifest: [")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: d}\n")
    assert [n.name for n in manifests.load_path(tmp_path).namespaces] == ["a", "b", "c"]
    assert [n.name for n in manifests.load_path(tmp_path / "b.yml").namespaces] == ["b"]


def test_directory_is_one_all_or_nothing_set(tmp_path: Path) -> None:
    (tmp_path / "01.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    (tmp_path / "02.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    (tmp_path / "03.json").write_text("{\"apiVersion\": \"v1\",")
    (tmp_path / "04.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: A}\n")
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_path(tmp_path)
    errors = err.value.errors
    assert errors[0].startswith("03.json: invalid JSON at line 1, column ")
    assert errors[1].startswith("Pod/default/A (04.yaml#1): metadata.name: must be a DNS-1123 subdomain")
    assert errors[2] == "Namespace/x (02.yaml#1): metadata.name: duplicate of Namespace/x (01.yaml#1)"
    assert len(errors) == 3


def test_missing_path_is_a_manifest_error(tmp_path: Path) -> None:
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_path(tmp_path / "nope")
    assert err.value.errors == [f"{tmp_path / 'nope'}: no such file or directory"]


def test_shipped_samples_load() -> None:
    s = manifests.load_path(SAMPLES)
    assert [n.name for n in s.namespaces] == ["x", "y", "z"]
    assert [n.name for n in s.namespaces if n.logging_enabled] == ["z"]
    assert sorted(p.key for p in s.pods) == [(ns, p) for ns in "xyz" for p in "abc"]
    assert all(dict(p.labels) == {"pod": p.name} for p in s.pods)
    assert s.tiers == (Tier("devops", 120),)
    acnp_, k8s = s.policies
    assert (acnp_.kind, acnp_.tier) == (PolicyKind.ACNP, "securityops")
    [rule] = acnp_.rules
    assert rule.action is Action.DROP and rule.enable_logging and rule.log_label
    assert rule.ports == (PortSpec("TCP", 80),)
    assert (k8s.kind, k8s.namespace, k8s.isolates) == (PolicyKind.K8S, "z", (Direction.INGRESS,))


# --- nothing but ManifestError, whatever the input --------------------------------------------

SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12) \
    | st.sampled_from(["Allow", "Drop", "Pass", "TCP", "http", "10.0.0.0/8", "Self", "In", "Exists", "a"])
KEYS = st.sampled_from(["podSelector", "namespaceSelector", "ipBlock", "cidr", "except", "matchLabels",
                        "matchExpressions", "key", "operator", "values", "action", "from", "to", "ports",
                        "port", "endPort", "protocol", "appliedTo", "namespaces", "match", "name",
                        "logLabel", "enableLogging"]) | st.text(max_size=8) | st.integers()
YAMLISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(KEYS, inner, max_size=4), max_leaves=25)

BASES: dict[str, dict[str, Any]] = {
    "acnp": yaml.safe_load(acnp(ACNP_SPEC)),
    "anp": yaml.safe_load(anp(ANP_SPEC)),
    "netpol": yaml.safe_load(K8S_NETPOL),
    "tier": yaml.safe_load(tier("t", 7)),
    "pod": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"},
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 80}]}]}},
}
PATHS = [("acnp", ["spec"]), ("acnp", ["spec", "appliedTo"]), ("acnp", ["spec", "ingress"]),
         ("acnp", ["spec", "ingress", 0]), ("acnp", ["spec", "ingress", 0, "from", 0]),
         ("acnp", ["spec", "ingress", 0, "from", 0, "podSelector"]), ("acnp", ["spec", "ingress", 0, "ports", 0]),
         ("acnp", ["spec", "egress", 0, "to", 0, "ipBlock"]), ("acnp", ["spec", "tier"]),
         ("acnp", ["spec", "priority"]), ("anp", ["spec", "appliedTo", 0]), ("netpol", ["spec", "podSelector"]),
         ("netpol", ["spec", "policyTypes"]), ("netpol", ["spec", "ingress", 0, "from", 2, "ipBlock", "except"]),
         ("netpol", ["spec", "podSelector", "matchExpressions", 0]), ("netpol", ["metadata"]),
         ("netpol", ["metadata", "namespace"]), ("tier", ["spec"]), ("pod", ["spec", "containers", 0, "ports"]),
         ("pod", ["metadata", "labels"]), ("acnp", ["kind"]), ("acnp", ["apiVersion"])]


def _replace(data: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    copy = list(data) if isinstance(data, list) else dict(data)
    copy[path[0]] = _replace(copy[path[0]] if isinstance(copy, list) else copy.get(path[0], {}), path[1:], value)
    return copy


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(PATHS), value=YAMLISH)
def test_arbitrary_data_in_any_field_raises_only_manifest_error(where: tuple[str, list[Any]], value: Any) -> None:
    base, path = where
    document = _replace(BASES[base], path, value)
    for load_one in (lambda: manifests.load_documents([document], "h.yaml"),
                     lambda: manifests.load_text(yaml.safe_dump(document), "h.yaml")):
        try:
            load_one()
        except manifests.ManifestError as err:
            assert err.errors and all(isinstance(e, str) and e for e in err.errors)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_raises_only_manifest_error(text: str) -> None:
    try:
        manifests.load_text(text, "h.yaml")
    except manifests.ManifestError:
        pass
