"""`get` over the local API: the policies, rules (with the ids records carry) and Pods (classes, flows) in force,
read from a real engine that applied the sample manifests."""

from __future__ import annotations

from tests.support.inventory_engine import ask

def test_policies_are_listed_in_evaluation_order_with_their_tiers() -> None:
    (reply,), _ = ask({"kind": "policies"})
    assert reply["ok"], reply
    names = [(p["kind"], p["namespace"], p["name"], p["tier"]) for p in reply["items"]]
    assert names[0] == ("ClusterNetworkPolicy", "", "drop-x-a-to-y-http", "securityops")
    assert ("NetworkPolicy", "z", "allow-x-to-a", "") in names
    assert reply["items"][0]["rules"] == 1 and reply["items"][0]["logged"] == 1


def test_rules_carry_the_id_their_records_carry() -> None:
    (reply,), _ = ask({"kind": "rules", "name": "drop-x-a-http"})
    (rule,) = reply["items"]
    assert rule["tier"] == "securityops" and rule["action"] == "Drop" and rule["direction"] == "ingress"
    assert rule["policy"] == "AntreaClusterNetworkPolicy:drop-x-a-to-y-http" and rule["log_label"] == "x-a-to-y-http"
    assert isinstance(rule["id"], int) and rule["id"] > 0
    (by_policy,), _ = ask({"kind": "rules", "name": "drop-x-a-to-y-http"})
    assert [r["id"] for r in by_policy["items"]] == [rule["id"]]


def test_a_pod_shows_its_class_and_with_flows_every_flow_in_force_that_concerns_it() -> None:
    (reply, everyone), channel = ask({"kind": "pods", "namespace": "y", "name": "a", "flows": True}, {"kind": "pods"})
    (pod,) = reply["items"]
    assert (pod["ip"], pod["ofport"], pod["running"]) == ("10.244.0.7", 7, True)
    assert pod["class"] != 0 and any("namespaces(kubernetes.io/metadata.name=y)" in g for g in pod["groups"])
    installed = {f.describe() for f in channel.flows.values()}
    shown = [line.split(" ", 1)[1].split(" actions=")[0] for line in pod["flows"]]
    assert set(shown) <= installed  # only flows the switch holds
    assert "table=25 priority=100 match=in_port=7" in shown  # loads its class
    assert any(f"reg5={pod['class']}" in s or f"reg4={pod['class']}" in s for s in shown)  # a rule matching it
    assert len(everyone["items"]) == 9 and "flows" not in everyone["items"][0]
    others = [p for p in everyone["items"] if p["namespace"] != "y" or p["name"] != "a"]
    assert all(not p["running"] and p["ofport"] is None for p in others)


def test_an_unknown_name_or_kind_is_one_line() -> None:
    (missing, bad), _ = ask({"kind": "pods", "namespace": "y", "name": "nope"}, {"kind": "secrets"})
    assert missing == {"ok": False, "errors": ["pod 'nope' in namespace y: not found"]}
    assert not bad["ok"] and "kind: must be one of policies, rules, pods" in bad["errors"][0]
