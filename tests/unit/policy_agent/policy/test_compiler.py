"""Policy semantics of the compiled flows, checked by running packets through a fake flow table."""

from __future__ import annotations

import itertools

import pytest

from packetin.model import Category, Disposition, Flags
from policy_agent.ovs import tables
from policy_agent.policy import compiler
from policy_agent.policy.compiler import compile_policies
from policy_agent.policy.model import (
    Action, Direction, IPBlock, Peer,
    PortSpec, Rule,
)

from tests.support.flowsim import FlowTable
from tests.support.policy_shapes import NS, PODS, acnp, cluster, ep, k8s, ns_sel, rule_of, sel, send, table

def test_no_policy_allows_everything() -> None:
    st = cluster()
    ft = table(st)
    for src, dst in itertools.permutations([f"{n}/{p}" for n in NS for p in PODS], 2):
        v = send(st, src, dst, ft=ft)
        assert v.forwarded and v.copies == []


def test_logged_tiered_drop_copies_disposition_rule_and_label() -> None:
    drop = Rule(Direction.EGRESS, Action.DROP, peers=(Peer(namespace_selector=ns_sel("y")),),
                ports=(PortSpec("TCP", 80),), name="no-web", enable_logging=True, log_label="audit-me")
    st = cluster(acnp("drop-web", (drop,), tier="securityops", applied=sel(pod="a"), applied_ns=ns_sel("x")))
    info = rule_of(st, "drop-web", "no-web")
    v = send(st, "x/a", "y/b", 80)
    assert not v.forwarded
    (reg7, reg6, ud), = v.copies
    assert (reg7, reg6) == (Disposition.DROP, info.rule_id)
    assert ud is not None and ud.category == Category.POLICY and ud.flags == Flags.LOG | Flags.OFFLOAD_ELIGIBLE and ud.rule_id == info.rule_id
    assert info.log_label == "audit-me" and info.tier == "securityops"
    assert info.ruleset == "AntreaClusterNetworkPolicy:drop-web" and info.direction == Direction.EGRESS
    assert send(st, "x/a", "y/b", 81).forwarded
    assert send(st, "x/b", "y/b", 80).forwarded
    assert send(st, "x/a", "z/b", 80).forwarded


def test_allow_rules_log_once_and_forward() -> None:
    allow = Rule(Direction.INGRESS, Action.ALLOW, enable_logging=True)
    st = cluster(acnp("log-all", (allow,), applied=sel(pod="c")))
    v = send(st, "x/a", "y/c")
    assert v.forwarded and [c[0] for c in v.copies] == [Disposition.ALLOW]


def test_higher_tier_decides_first() -> None:
    peers = (Peer(pod_selector=sel(pod="b"), namespace_selector=ns_sel("y")),)
    allow = acnp("allow", (Rule(Direction.EGRESS, Action.ALLOW, peers=peers),), tier="emergency")
    drop = acnp("drop", (Rule(Direction.EGRESS, Action.DROP, peers=peers),), tier="securityops")
    assert send(cluster(allow, drop), "x/a", "y/b").forwarded
    allow2 = acnp("allow", (Rule(Direction.EGRESS, Action.ALLOW, peers=peers),), tier="application")
    assert not send(cluster(allow2, drop), "x/a", "y/b").forwarded


def test_within_a_tier_the_lower_priority_number_wins() -> None:
    r_allow = Rule(Direction.INGRESS, Action.ALLOW)
    r_drop = Rule(Direction.INGRESS, Action.DROP)
    a = acnp("a", (r_allow,), priority=1, applied=sel(pod="a"))
    d = acnp("d", (r_drop,), priority=2, applied=sel(pod="a"))
    assert send(cluster(a, d), "y/b", "x/a").forwarded
    a5 = acnp("a", (r_allow,), priority=5, applied=sel(pod="a"))
    assert not send(cluster(a5, d), "y/b", "x/a").forwarded


def test_rules_inside_a_policy_apply_in_order() -> None:
    pol = acnp("ordered", (Rule(Direction.INGRESS, Action.ALLOW, ports=(PortSpec("TCP", 80),)),
                           Rule(Direction.INGRESS, Action.DROP)), applied=sel(pod="a"))
    st = cluster(pol)
    assert send(st, "y/b", "x/a", 80).forwarded
    assert not send(st, "y/b", "x/a", 81).forwarded


def test_pass_skips_lower_tiers_and_lands_in_baseline() -> None:
    passed = acnp("pass", (Rule(Direction.INGRESS, Action.PASS, enable_logging=True),), tier="securityops",
                  applied=sel(pod="a"))
    app_drop = acnp("app-drop", (Rule(Direction.INGRESS, Action.DROP),), tier="application", applied=sel(pod="a"))
    st = cluster(passed, app_drop)
    v = send(st, "y/b", "x/a")
    assert v.forwarded  # the application tier was skipped
    assert [c[0] for c in v.copies] == [Disposition.PASS]
    base_drop = acnp("base-drop", (Rule(Direction.INGRESS, Action.DROP),), tier="baseline", applied=sel(pod="a"))
    assert not send(cluster(passed, app_drop, base_drop), "y/b", "x/a").forwarded


def test_k8s_isolation_allows_only_the_union_and_logs_by_namespace() -> None:
    from_x = Rule(Direction.INGRESS, peers=(Peer(namespace_selector=ns_sel("x")),))
    from_yb = Rule(Direction.INGRESS, peers=(Peer(pod_selector=sel(pod="b"), namespace_selector=ns_sel("y")),))
    p1 = k8s("allow-x", "z", (from_x,), (Direction.INGRESS,), pods=sel(pod="a"))
    p2 = k8s("allow-yb", "z", (from_yb,), (Direction.INGRESS,), pods=sel(pod="a"))
    st = cluster(p1, p2, logging_ns=("z",))
    assert send(st, "x/c", "z/a").forwarded
    assert send(st, "y/b", "z/a").forwarded
    v = send(st, "y/c", "z/a")
    assert not v.forwarded
    iso = rule_of(st, "allow-x", compiler.ISOLATION_RULE)  # the first isolating policy names the drop
    assert v.copies == [(Disposition.DROP, iso.rule_id, v.copies[0][2])] and v.copies[0][2].flags == Flags.LOG | Flags.OFFLOAD_ELIGIBLE
    assert iso.ruleset == "K8sNetworkPolicy:z/allow-x" and iso.action == Action.DROP
    assert send(st, "y/c", "z/b").forwarded  # z/b is not selected: not isolated
    assert send(cluster(p1, p2), "y/c", "z/a").copies == []  # namespace without logging: silent


def test_k8s_allow_takes_precedence_over_baseline() -> None:
    allow = k8s("allow-x", "z", (Rule(Direction.INGRESS, peers=(Peer(namespace_selector=ns_sel("x")),)),),
                (Direction.INGRESS,))
    base = acnp("base", (Rule(Direction.INGRESS, Action.DROP),), tier="baseline", applied_ns=ns_sel("z"))
    st = cluster(allow, base)
    assert send(st, "x/a", "z/b").forwarded
    assert not send(st, "y/a", "z/b").forwarded
    assert not send(cluster(base), "x/a", "z/b").forwarded


def test_k8s_egress_isolation_with_empty_rules_blocks_everything() -> None:
    deny = k8s("deny-egress", "x", (), (Direction.EGRESS,))
    st = cluster(deny)
    assert not send(st, "x/a", "y/a").forwarded
    assert send(st, "y/a", "x/a").forwarded


def test_ip_block_except() -> None:
    st0 = cluster()
    yb = ep(st0, "y/b").ip
    allow = acnp("cidr", (Rule(Direction.EGRESS, Action.ALLOW,
                               peers=(Peer(ip_block=IPBlock("10.244.0.0/24", (f"{yb}/32",))),)),
                          Rule(Direction.EGRESS, Action.DROP)), applied=sel(pod="a"), applied_ns=ns_sel("x"))
    st = cluster(allow)
    assert not send(st, "x/a", "y/b").forwarded
    assert send(st, "x/a", "y/c").forwarded


@pytest.mark.parametrize("port,allowed", [(999, True), (1000, False), (1050, False), (1100, False), (1101, True)])
def test_end_port_range(port: int, allowed: bool) -> None:
    drop = acnp("range", (Rule(Direction.INGRESS, Action.DROP, ports=(PortSpec("TCP", 1000, 1100),)),),
                applied=sel(pod="a"))
    assert send(cluster(drop), "y/b", "x/a", port).forwarded is allowed


def test_named_port_resolves_on_the_destination_pod() -> None:
    only_http = k8s("http", "x", (Rule(Direction.INGRESS, ports=(PortSpec("TCP", "http"),)),), (Direction.INGRESS,))
    st = cluster(only_http)
    assert send(st, "y/a", "x/a", 8080).forwarded
    assert not send(st, "y/a", "x/a", 80).forwarded
    egress = k8s("http-out", "x", (Rule(Direction.EGRESS, ports=(PortSpec("TCP", "http"),)),), (Direction.EGRESS,))
    st2 = cluster(egress)
    assert send(st2, "x/a", "y/a", 8080).forwarded
    assert not send(st2, "x/a", "y/a", 80).forwarded


def test_reject_copies_with_reject_flag_even_unlogged() -> None:
    rej = acnp("rej", (Rule(Direction.INGRESS, Action.REJECT),), applied=sel(pod="a"))
    v = send(cluster(rej), "y/b", "x/a")
    assert not v.forwarded
    (reg7, _, ud), = v.copies
    assert reg7 == Disposition.REJECT and ud is not None and ud.flags == Flags.REJECT


def test_udp_port_rules_do_not_match_tcp() -> None:
    drop = acnp("udp", (Rule(Direction.INGRESS, Action.DROP, ports=(PortSpec("UDP", 53),)),), applied=sel(pod="a"))
    st = cluster(drop)
    assert not send(st, "y/b", "x/a", 53, "udp").forwarded
    assert send(st, "y/b", "x/a", 53, "tcp").forwarded


def test_conjunction_gives_the_same_verdicts_as_the_cross_product(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = (Rule(Direction.EGRESS, Action.DROP,
                  peers=(Peer(namespace_selector=ns_sel("y")), Peer(namespace_selector=ns_sel("z"))),
                  ports=(PortSpec("TCP", 80), PortSpec("TCP", 443), PortSpec("TCP", 8000, 8100)), enable_logging=True),)
    big = acnp("big", rules, applied_ns=ns_sel("x"))
    st = cluster(big)
    monkeypatch.setattr(compiler, "CONJUNCTION_THRESHOLD", 10**9)
    cross = compile_policies(st).flows
    monkeypatch.setattr(compiler, "CONJUNCTION_THRESHOLD", 0)
    conj = compile_policies(st).flows
    # Pods are matched by class (3 applied-to Pods = 1 class, the peers 2): the product is small
    # already, conjunction still smaller.
    assert len(conj) < len(cross)
    assert any(k == "conj_id" for f in conj for k, _ in f.match)
    base = tables.fixed_flows(1) + [f for e in st.endpoints
                                     for f in tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)]
    ft_cross, ft_conj = FlowTable(base + cross), FlowTable(base + conj)
    names = [f"{n}/{p}" for n in NS for p in PODS]
    for src, dst in itertools.permutations(names, 2):
        for port in (22, 80, 443, 8000, 8050, 8100, 8101):
            a = send(st, src, dst, port, ft=ft_cross)
            b = send(st, src, dst, port, ft=ft_conj)
            assert (a.forwarded, a.copies) == (b.forwarded, b.copies), (src, dst, port)


def test_rule_ids_are_stable_and_independent_of_other_policies() -> None:
    p1 = acnp("one", (Rule(Direction.INGRESS, Action.DROP, name="r"),), applied=sel(pod="a"))
    p2 = acnp("two", (Rule(Direction.INGRESS, Action.DROP, name="r"),), applied=sel(pod="b"))
    id_alone = rule_of(cluster(p1), "one", "r").rule_id
    assert rule_of(cluster(p1, p2), "one", "r").rule_id == id_alone
    assert rule_of(cluster(p2, p1), "one", "r").rule_id == id_alone
    ids = [r.rule_id for r in compile_policies(cluster(p1, p2)).rules.values()]
    assert len(set(ids)) == len(ids) and 0 not in ids


def test_port_range_masks_cover_exactly_the_range() -> None:
    for lo, hi in [(0, 65535), (1, 1), (1000, 1100), (1023, 1025), (65000, 65535)]:
        covered = set()
        for vm in compiler.port_range_masks(lo, hi):
            value, mask = (vm, 0xFFFF) if isinstance(vm, int) else vm
            size = (~mask & 0xFFFF) + 1
            covered |= set(range(value, value + size))
        assert covered == set(range(lo, hi + 1)), (lo, hi)
