"""Antrea's `protocols` field (ICMP type/code): read from manifests, refused precisely, compiled to flows."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packetin.model import Disposition
from policy_agent.policy import manifests
from policy_agent.policy.compiler import ClusterState
from policy_agent.policy.model import Action, Direction, IcmpSpec, Peer, PortSpec, Rule

from tests.support.flowsim import FlowTable, Verdict
from tests.support.policy_shapes import acnp, cluster, ep, ns_sel, rule_of, send, sel, table

AC = "ClusterNetworkPolicy/p (t.yaml#1)"
ECHO_REQUEST, ECHO_REPLY, UNREACHABLE = 8, 0, 3


API = {"ClusterNetworkPolicy": "crd.antrea.io/v1beta1", "NetworkPolicy": "crd.antrea.io/v1beta1",
       "K8s": "networking.k8s.io/v1"}


def policy_text(rule: str, kind: str = "ClusterNetworkPolicy") -> str:
    """One policy whose single ingress rule is `rule` (a YAML flow mapping); kind K8s = networking.k8s.io."""
    meta = "{name: p}" if kind == "ClusterNetworkPolicy" else "{name: p, namespace: x}"
    spec = "podSelector: {}" if kind == "K8s" else "priority: 1\n  appliedTo: [{podSelector: {}}]"
    return (f"apiVersion: {API[kind]}\nkind: {kind.replace('K8s', 'NetworkPolicy')}\nmetadata: {meta}\n"
            f"spec:\n  {spec}\n  ingress:\n  - {rule}\n")


def errors_of(text: str) -> list[str]:
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text(text, "t.yaml")
    return err.value.errors


# --- manifests ------------------------------------------------------------------------------------

def test_protocols_are_read_into_the_rule_beside_ports() -> None:
    objs = manifests.load_text(policy_text(
        "{action: Drop, name: no-ping, ports: [{port: 80}], protocols: [{icmp: {icmpType: 8, icmpCode: 0}}, "
        "{icmp: {icmpType: 3}}, {icmp: {icmpCode: 4}}, {icmp: {}}, {icmp: {icmpType: 3}}]}"), "t.yaml")
    rule, = objs.policies[0].rules
    assert rule.ports == (PortSpec("TCP", 80),)
    # A repeated entry is kept once: it would be the same flow twice.
    assert rule.protocols == (IcmpSpec(8, 0), IcmpSpec(3, None), IcmpSpec(None, 4), IcmpSpec(None, None))


def test_antrea_namespaced_policies_take_protocols_too() -> None:
    objs = manifests.load_text(policy_text("{action: Drop, protocols: [{icmp: {icmpType: 8}}]}",
                                           kind="NetworkPolicy"), "t.yaml")
    assert objs.policies[0].rules[0].protocols == (IcmpSpec(8, None),)


INVALID = [
    ("{action: Drop, protocols: [{igmp: {igmpType: 0x11}}]}",
     f"{AC}: spec.ingress[0].protocols[0].igmp: IGMP is not supported; only icmp (icmpType, icmpCode) can be "
     "matched"),
    ("{action: Drop, protocols: [{icmp: {icmpType: 256}}]}",
     f"{AC}: spec.ingress[0].protocols[0].icmp.icmpType: must be 0..255; got 256"),
    ("{action: Drop, protocols: [{icmp: {icmpCode: -1}}]}",
     f"{AC}: spec.ingress[0].protocols[0].icmp.icmpCode: must be 0..255; got -1"),
    ("{action: Drop, protocols: [{icmp: {icmpType: echo}}]}",
     f"{AC}: spec.ingress[0].protocols[0].icmp.icmpType: must be an integer, got string"),
    ("{action: Drop, protocols: [{icmp: {type: 8}}]}",
     f"{AC}: spec.ingress[0].protocols[0].icmp.type: unknown field; expected one of icmpCode, icmpType"),
    ("{action: Drop, protocols: [{icmpv6: {}}]}",
     f"{AC}: spec.ingress[0].protocols[0].icmpv6: unknown field (did you mean 'icmp'?); expected one of icmp, igmp"),
    ("{action: Drop, protocols: [{icmp: }]}",
     f"{AC}: spec.ingress[0].protocols[0].icmp: required (icmp: {{}} matches all ICMP)"),
    ("{action: Drop, protocols: [ICMP]}",
     f"{AC}: spec.ingress[0].protocols[0]: must be a mapping, got string"),
    ("{action: Drop, protocols: {icmp: {}}}",
     f"{AC}: spec.ingress[0].protocols: must be a list, got mapping"),
]


@pytest.mark.parametrize("rule, expected", INVALID, ids=[e.split(": ", 1)[1][:60] for _, e in INVALID])
def test_each_invalid_protocols_entry_is_one_line_naming_the_field(rule: str, expected: str) -> None:
    assert errors_of(policy_text(rule)) == [expected]


def test_kubernetes_network_policies_have_no_protocols_field() -> None:
    assert errors_of(policy_text("{protocols: [{icmp: {}}]}", kind="K8s")) == [
        "NetworkPolicy/x/p (t.yaml#1): spec.ingress[0].protocols: unknown field; expected one of from, ports"]


SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8) \
    | st.sampled_from(["icmp", "igmp", "icmpType", "icmpCode", 8, 0, 255])
KEYS = st.sampled_from(["icmp", "igmp", "icmpType", "icmpCode", "groupAddress", "igmpType"]) | st.text(max_size=6)
YAMLISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(KEYS, inner, max_size=3), max_leaves=15)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=YAMLISH)
def test_arbitrary_protocols_raise_only_manifest_error(value: Any) -> None:
    document = yaml.safe_load(policy_text("{action: Drop}"))
    document["spec"]["ingress"][0]["protocols"] = value
    try:
        manifests.load_documents([document], "h.yaml")
    except manifests.ManifestError as err:
        assert err.errors and all(isinstance(e, str) and e for e in err.errors)


# --- compiled flows -------------------------------------------------------------------------------

def ping(state: ClusterState, src: str, dst: str, icmp_type: int = ECHO_REQUEST, code: int = 0,
         ft: FlowTable | None = None) -> Verdict:
    s, d = ep(state, src), ep(state, dst)
    pkt = {"in_port": s.ofport, "eth_type": 0x0800, "ipv4_src": s.ip, "ipv4_dst": d.ip, "ip_proto": 1,
           "icmpv4_type": icmp_type, "icmpv4_code": code}
    return (ft or table(state)).run(pkt)


def test_a_drop_of_icmp_echo_stops_ping_and_nothing_else() -> None:
    drop = Rule(Direction.INGRESS, Action.DROP, peers=(Peer(pod_selector=sel(pod="a"), namespace_selector=ns_sel("y")),),
                protocols=(IcmpSpec(icmp_type=ECHO_REQUEST),), name="no-ping", enable_logging=True)
    st = cluster(acnp("drop-ping", (drop,), applied=sel(pod="a"), applied_ns=ns_sel("x")))
    ft = table(st)
    info = rule_of(st, "drop-ping", "no-ping")
    v = ping(st, "y/a", "x/a", ft=ft)
    assert not v.forwarded
    assert [(reg7, reg6) for reg7, reg6, _ in v.copies] == [(Disposition.DROP, info.rule_id)]
    assert ping(st, "y/a", "x/a", ECHO_REQUEST, code=5, ft=ft).forwarded is False  # any code of type 8
    assert ping(st, "y/a", "x/a", UNREACHABLE, code=3, ft=ft).forwarded  # another ICMP type passes
    assert ping(st, "y/a", "x/a", ECHO_REPLY, ft=ft).forwarded
    assert ping(st, "y/b", "x/a", ft=ft).forwarded  # another peer
    assert ping(st, "y/a", "x/b", ft=ft).forwarded  # another applied-to Pod
    for port in (80, 8, 0):
        assert send(st, "y/a", "x/a", port, ft=ft).forwarded  # TCP unaffected, whatever the port number
        assert send(st, "y/a", "x/a", port, proto="udp", ft=ft).forwarded


def test_type_and_code_together_match_only_that_pair() -> None:
    drop = Rule(Direction.EGRESS, Action.DROP, protocols=(IcmpSpec(UNREACHABLE, 13),), name="no-13")
    st = cluster(acnp("drop-13", (drop,), applied=sel(pod="b")))
    ft = table(st)
    assert not ping(st, "x/b", "z/c", UNREACHABLE, 13, ft=ft).forwarded
    assert ping(st, "x/b", "z/c", UNREACHABLE, 3, ft=ft).forwarded
    assert ping(st, "x/b", "z/c", ECHO_REQUEST, 13, ft=ft).forwarded


def test_code_alone_and_empty_icmp_match_every_type() -> None:
    code_only = Rule(Direction.INGRESS, Action.DROP, protocols=(IcmpSpec(icmp_code=4),), name="code-4")
    any_icmp = Rule(Direction.INGRESS, Action.DROP, protocols=(IcmpSpec(),), name="any-icmp")
    st = cluster(acnp("code", (code_only,), applied=sel(pod="a")),
                 acnp("all", (any_icmp,), applied=sel(pod="c"), priority=6))
    ft = table(st)
    assert not ping(st, "x/b", "y/a", UNREACHABLE, 4, ft=ft).forwarded
    assert ping(st, "x/b", "y/a", UNREACHABLE, 3, ft=ft).forwarded
    for icmp_type in (ECHO_REQUEST, ECHO_REPLY, UNREACHABLE):
        assert not ping(st, "x/b", "y/c", icmp_type, ft=ft).forwarded
    assert send(st, "x/b", "y/c", ft=ft).forwarded


def test_ports_and_protocols_in_one_rule_are_their_union() -> None:
    drop = Rule(Direction.INGRESS, Action.DROP, ports=(PortSpec("TCP", 81),), protocols=(IcmpSpec(ECHO_REQUEST),),
                name="no-81-no-ping")
    st = cluster(acnp("union", (drop,), applied=sel(pod="a")))
    ft = table(st)
    assert not ping(st, "z/b", "x/a", ft=ft).forwarded
    assert not send(st, "z/b", "x/a", 81, ft=ft).forwarded
    assert send(st, "z/b", "x/a", 80, ft=ft).forwarded
    assert ping(st, "z/b", "x/a", ECHO_REPLY, ft=ft).forwarded


def test_allow_ping_then_drop_the_rest_lets_only_ping_through() -> None:
    rules = (Rule(Direction.INGRESS, Action.ALLOW, protocols=(IcmpSpec(ECHO_REQUEST),), name="ping-ok"),
             Rule(Direction.INGRESS, Action.DROP, name="rest"))
    st = cluster(acnp("only-ping", rules, applied=sel(pod="b"), applied_ns=ns_sel("z")))
    ft = table(st)
    assert ping(st, "x/a", "z/b", ft=ft).forwarded
    assert not ping(st, "x/a", "z/b", UNREACHABLE, ft=ft).forwarded
    assert not send(st, "x/a", "z/b", ft=ft).forwarded


def test_icmp_beside_a_named_egress_port_still_matches_any_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    # Named egress ports give one term per destination Pod; ICMP must not be tied to them.
    from policy_agent.policy import compiler
    drop = Rule(Direction.EGRESS, Action.DROP, ports=(PortSpec("TCP", "http"),), protocols=(IcmpSpec(),),
                peers=(Peer(namespace_selector=ns_sel("y")),), name="named-and-icmp")
    for threshold in (compiler.CONJUNCTION_THRESHOLD, 0):
        monkeypatch.setattr(compiler, "CONJUNCTION_THRESHOLD", threshold)
        st = cluster(acnp("named", (drop,), applied=sel(pod="a")))
        ft = table(st)
        for dst in ("y/a", "y/b", "y/c"):
            assert not ping(st, "x/a", dst, ft=ft).forwarded
            assert not send(st, "x/a", dst, 8080, ft=ft).forwarded
            assert send(st, "x/a", dst, 80, ft=ft).forwarded
        assert ping(st, "x/a", "z/a", ft=ft).forwarded
