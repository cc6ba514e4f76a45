"""`npaudit demo --nodes N`'s plan: Pods spread so most connections cross nodes, the shared manifests load as
one set, and the connection meant to be recorded at both ends meets a logged egress rule on its source's
node and a logged ingress rule on its destination's."""

from __future__ import annotations

import pytest

from policy_agent.cluster.local_demo import PODS, PROBES, placement, shared_manifests
from policy_agent.policy.manifests import load_text


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_pods_are_spread_over_every_node_and_most_probes_cross_nodes(nodes: int) -> None:
    where = placement(nodes)
    assert list(where) == list(PODS)
    assert set(where.values()) == {f"n{i}" for i in range(1, min(nodes, len(PODS)) + 1)}
    crossing = [p for p in PROBES if where[p.source] != where[p.destination]]
    assert len(crossing) > len(PROBES) / 2


def test_the_shared_manifests_load_as_one_set_without_pod_objects() -> None:
    objs = load_text(shared_manifests(), "demo")
    assert {n.name for n in objs.namespaces} == {"x", "y", "z"}
    assert objs.pods == ()  # `cluster pod add` publishes each Pod with its node and address
    names = {p.key[2] for p in objs.policies}
    assert {"drop-x-a-to-y-http", "allow-x-to-a", "x-a-egress-81", "y-ingress-81"} <= names


def test_one_connection_is_logged_by_an_egress_rule_and_an_ingress_rule() -> None:
    objs = load_text(shared_manifests(), "demo")
    both = next(p for p in PROBES if p.port == 81)
    assert placement(2)[both.source] != placement(2)[both.destination]
    logged = {(p.key[2], rule.direction) for p in objs.policies for rule in p.rules if rule.enable_logging
              and any(port.port == 81 for port in rule.ports)}
    assert logged == {("x-a-egress-81", "egress"), ("y-ingress-81", "ingress")}
