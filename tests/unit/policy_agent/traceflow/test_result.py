"""Traceflow copies -> observations and outcome: each case the operator asks about, from the registers."""

from __future__ import annotations

from packetin.model import Disposition
from policy_agent.ovs import tables as t
from policy_agent.policy.compiler import ISOLATION_RULE
from policy_agent.policy.model import Action, Direction
from policy_agent.policy.rules import RuleInfo
from policy_agent.traceflow.flows import Phase
from policy_agent.traceflow.result import Copy, Destination, complete, decode

DROP_RULE = RuleInfo(rule_id=11, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="sec-drop-web",
                     rule_name="no-web-from-x", tier="securityops", priority=5, action=Action.DROP,
                     direction=Direction.INGRESS, log_label="", logged=False)
PASS_RULE = RuleInfo(rule_id=12, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="pass-to-k8s",
                     rule_name="defer-x", tier="networkops", priority=1, action=Action.PASS,
                     direction=Direction.INGRESS, log_label="", logged=False)
K8S_ALLOW = RuleInfo(rule_id=13, policy_kind="K8sNetworkPolicy", namespace="y", policy_name="c-from-a",
                     rule_name="ingress-0", tier="", priority=0, action=Action.ALLOW, direction=Direction.INGRESS,
                     log_label="", logged=False)
ISOLATION = RuleInfo(rule_id=14, policy_kind="K8sNetworkPolicy", namespace="y", policy_name="c-from-a",
                     rule_name=ISOLATION_RULE, tier="", priority=0, action=Action.DROP, direction=Direction.INGRESS,
                     log_label="", logged=False)
REJECT_RULE = RuleInfo(rule_id=15, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="reject-81",
                       rule_name="refuse-81", tier="securityops", priority=6, action=Action.REJECT,
                       direction=Direction.INGRESS, log_label="", logged=True)
RULES = {r.rule_id: r for r in (DROP_RULE, PASS_RULE, K8S_ALLOW, ISOLATION, REJECT_RULE)}
POD = Destination("10.246.0.3", "y/b", 5)
POLICY_TABLES = (t.T_EGRESS, t.T_EGRESS_K8S, t.T_EGRESS_BASELINE, t.T_INGRESS, t.T_INGRESS_K8S, t.T_INGRESS_BASELINE)


def arrive(table: int, rule: int = 0, disposition: int = 0) -> Copy:
    return Copy(table, Phase.ARRIVAL, rule, disposition)


def after(rule: int = 0, disposition: int = 0) -> Copy:
    return Copy(t.T_CT_STATE, Phase.AFTER, rule, disposition)


def run(copies: list[Copy], dest: Destination = POD, reply: str | None = None, timed_out: bool = False):
    return decode(copies, rules=RULES.get, destination=dest, reject_reply=reply, source_port=3, timed_out=timed_out)


def test_forwarded_lists_every_table_with_no_rule_default_and_the_destination_pod() -> None:
    copies = [arrive(t.T_CT_STATE)] + [arrive(x) for x in POLICY_TABLES] + [arrive(t.T_FORWARD), after()]
    res = run(copies)
    assert [(o["table"], o["action"]) for o in res.observations] == [
        (0, "accept"), (10, "track"), (20, "new"), *((x, "default") for x in POLICY_TABLES), (60, "skip"),
        (70, "output")]
    assert all(o["detail"] == "no rule: default (next table)" for o in res.observations if o["action"] == "default")
    assert res.outcome == {"result": "delivered", "pod": "y/b", "port": 5,
                           "detail": "delivered to Pod y/b on port 5"}


def test_copies_in_any_order_give_the_same_path() -> None:
    copies = [arrive(t.T_CT_STATE)] + [arrive(x) for x in POLICY_TABLES] + [arrive(t.T_FORWARD), after()]
    assert run(list(reversed(copies))).observations == run(copies).observations


def test_dropped_by_a_tiered_rule_names_policy_rule_and_tier() -> None:
    copies = [arrive(t.T_CT_STATE), arrive(30), arrive(31), arrive(32), arrive(40), after(11, Disposition.DROP)]
    res = run(copies)
    assert res.result == "dropped"
    assert res.outcome["rule"] == {"id": 11, "kind": "AntreaClusterNetworkPolicy", "namespace": None,
                                   "policy": "sec-drop-web", "name": "no-web-from-x", "tier": "securityops",
                                   "action": "Drop", "direction": "ingress"}
    assert res.outcome["detail"] == ("Drop by AntreaClusterNetworkPolicy sec-drop-web, rule no-web-from-x, "
                                     "tier securityops")
    assert res.observations[-1]["table"] == 40


def test_pass_then_k8s_allow_lists_both_decisions() -> None:
    copies = [arrive(t.T_CT_STATE), arrive(30), arrive(31), arrive(32), arrive(40),
              arrive(41, 12, Disposition.PASS), arrive(t.T_FORWARD, 13, Disposition.ALLOW), after(13)]
    res = run(copies)
    decided = [(o["table"], o["action"], o["rule"]["policy"]) for o in res.observations if "rule" in o]
    assert decided == [(40, "Pass", "pass-to-k8s"), (41, "Allow", "c-from-a")]
    assert res.result == "delivered"


def test_k8s_isolation_names_the_isolating_policy() -> None:
    copies = [arrive(t.T_CT_STATE), arrive(30), arrive(31), arrive(32), arrive(40), arrive(41, 12, Disposition.PASS),
              after(14, Disposition.DROP)]
    res = run(copies)
    assert res.result == "dropped" and res.outcome["rule"]["name"] == ISOLATION_RULE
    assert "isolated by NetworkPolicy y/c-from-a (ingress)" in res.outcome["detail"]


def test_rejected_says_what_the_pod_would_receive() -> None:
    copies = [arrive(t.T_CT_STATE), arrive(30), arrive(31), arrive(32), arrive(40), after(15, Disposition.REJECT)]
    res = run(copies, reply="a TCP RST")
    assert res.result == "rejected" and res.outcome["reply"] == "a TCP RST"
    assert res.outcome["detail"].endswith("the source Pod would receive a TCP RST")


def test_unknown_destination_and_established_bypass() -> None:
    res = run([arrive(t.T_CT_STATE), arrive(t.T_FORWARD), after()], dest=Destination("10.9.9.9"))
    assert res.result == "unknown-destination" and res.outcome["detail"] == "no Pod has IP 10.9.9.9"
    assert res.observations[2]["action"] == "established"


def test_invalid_conntrack_state_is_a_drop_in_table_20() -> None:
    res = run([arrive(t.T_CT_STATE), after()])
    assert res.result == "dropped" and res.outcome["table"] == 20
    assert "invalid" in res.outcome["detail"]


def test_missing_after_copy_or_timeout_is_a_timeout_naming_what_was_seen() -> None:
    copies = [arrive(t.T_CT_STATE), arrive(30)]
    assert not complete(copies)
    res = run(copies, timed_out=True)
    assert res.result == "timeout" and "tables seen: 20, 30" in res.outcome["detail"]
    assert run([], timed_out=True).observations == []


def test_a_rule_id_the_agent_no_longer_knows_is_reported_as_such() -> None:
    res = run([arrive(t.T_CT_STATE), arrive(30), after(999, Disposition.DROP)])
    assert res.result == "dropped" and res.outcome["rule"]["policy"] is None
    assert "unknown to the agent" in res.outcome["rule"]["note"]


def test_a_packet_from_the_tunnel_stopped_before_policy_may_be_an_unknown_source() -> None:
    res = decode([arrive(t.T_CT_STATE), after()], rules=RULES.get, destination=POD, reject_reply=None,
                 arrived_from="node n1 (198.51.100.11)")
    assert res.observations[0]["detail"] == "from the tunnel: node n1 (198.51.100.11)"
    assert res.outcome["result"] == "dropped" and "cluster.deny_unknown_sources" in res.outcome["detail"]
