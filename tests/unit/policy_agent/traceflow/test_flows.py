"""A trace's flows composed with the compiled pipeline (fake flow table): the copies name each table and
decision, the packet is never output nor committed, and real traffic is not touched."""

from __future__ import annotations

from packetin import messages
from packetin.model import Category, Userdata
from policy_agent.ovs import tables
from policy_agent.policy.compiler import compile_policies
from policy_agent.policy.model import Action, Direction, Peer, PortSpec, Rule
from policy_agent.traceflow.flows import TRACE_PRIORITY, Phase, TraceMark, trace_flows
from policy_agent.traceflow.result import Copy, Destination, decode
from policy_agent.traceflow.tags import TraceTag

from tests.support.flowsim import FlowTable, Verdict
from tests.support.policy_shapes import acnp, cluster, ep, k8s, ns_sel, sel

SPORT = 40001


def policies():  # type: ignore[no-untyped-def]
    drop = Rule(Direction.INGRESS, Action.DROP, peers=(Peer(namespace_selector=ns_sel("x")),),
                ports=(PortSpec("TCP", 80),), name="no-web-from-x")
    passing = Rule(Direction.INGRESS, Action.PASS, peers=(Peer(namespace_selector=ns_sel("x")),), name="defer-x")
    allow = Rule(Direction.INGRESS, peers=(Peer(namespace_selector=ns_sel("x")),), ports=(PortSpec("TCP", 80),))
    return cluster(acnp("sec-drop-web", (drop,), tier="securityops", applied=sel(pod="b"), applied_ns=ns_sel("y")),
                   acnp("pass-to-k8s", (passing,), tier="networkops", applied=sel(pod="c"), applied_ns=ns_sel("y")),
                   k8s("c-from-x", "y", (allow,), (Direction.INGRESS,), pods=sel(pod="c")))


def run(src: str, dst: str, port: int, *, dscp: int = 5, sport: int = SPORT, traced: bool = True
        ) -> tuple[Verdict, object]:
    state = policies()
    s, d = ep(state, src), ep(state, dst)
    compiled = compile_policies(state)
    flows = tables.fixed_flows(1) + compiled.flows
    for e in state.endpoints:
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    tag = TraceTag(5, s.ip, d.ip, 6, SPORT, port)
    if traced:
        flows += trace_flows(1, tag)
    pkt = {"in_port": s.ofport, "eth_type": 0x0800, "ipv4_src": s.ip, "ipv4_dst": d.ip, "ip_proto": 6,
           "tcp_src": sport, "tcp_dst": port, "ip_dscp": dscp}
    verdict = FlowTable(flows).run(pkt)
    copies = []
    for table, reg7, reg6, raw in verdict.copy_log:
        mark = TraceMark.decode(raw)
        if mark is not None:
            assert mark.tag == 5
            copies.append(Copy(table, mark.phase, reg6, reg7))
    result = decode(copies, rules=compiled.rules.get, destination=Destination(d.ip, dst, d.ofport),
                    reject_reply=None, source_port=s.ofport)
    return verdict, result


def test_a_traced_packet_is_never_output_nor_committed_and_ends_with_the_after_copy() -> None:
    verdict, result = run("x/a", "y/a", 80)
    assert verdict.output is None and not verdict.committed
    assert result.outcome["result"] == "delivered" and result.outcome["pod"] == "y/a"
    phases = [TraceMark.decode(raw).phase for *_, raw in verdict.copy_log]
    assert phases[-1] == Phase.AFTER and phases.count(Phase.AFTER) == 1


def test_drop_by_a_tiered_rule_and_pass_then_k8s_allow_through_the_real_pipeline() -> None:
    _, dropped = run("x/a", "y/b", 80)
    assert dropped.outcome["result"] == "dropped"
    assert (dropped.outcome["rule"]["policy"], dropped.outcome["rule"]["tier"]) == ("sec-drop-web", "securityops")
    _, passed = run("x/a", "y/c", 80)
    assert [(o["table"], o["action"]) for o in passed.observations if "rule" in o] == [(40, "Pass"), (41, "Allow")]
    _, isolated = run("x/a", "y/c", 81)
    assert isolated.outcome["rule"]["name"] == "default-isolation"


def test_real_traffic_meets_the_pipeline_as_without_the_trace() -> None:
    # Same addresses and ports without the tag, or the tag on another source port: untouched.
    for dscp, sport in ((0, SPORT), (5, SPORT + 1)):
        with_trace, _ = run("x/a", "y/a", 80, dscp=dscp, sport=sport)
        without, _ = run("x/a", "y/a", 80, dscp=dscp, sport=sport, traced=False)
        assert with_trace.output == without.output is not None
        assert with_trace.committed and with_trace.copy_log == []


def test_trace_flows_sit_above_every_rule_and_carry_traceflow_userdata_on_its_meter() -> None:
    flows = trace_flows(7, TraceTag(9, "10.0.0.1", "10.0.0.2", 17, 40000, 53))
    assert {f.priority for f in flows} == {TRACE_PRIORITY} and TRACE_PRIORITY > 60000
    assert {f.cookie for f in flows} == {tables.cookie(7, tables.COOKIE_KIND_TRACEFLOW)}
    assert {f.table for f in flows} == {10, 20, 30, 31, 32, 40, 41, 42, 60, 70}
    for f in flows:
        match = dict(f.match)
        assert (match["ip_dscp"], match["udp_src"], match["udp_dst"]) == (9, 40000, 53)
        for a in f.actions:
            if isinstance(a, messages.Controller):
                assert a.reason == 1 and a.meter_id == 3
                assert Userdata.decode(a.userdata).category == Category.TRACEFLOW
        messages.serialize(messages.flow_add(f).to_ofp(), 1)  # os-ken encodes every one
    commit = next(f for f in flows if f.table == 60)
    assert commit.actions == () and commit.goto.table == 70
    assert not any(isinstance(a, messages.Output) for f in flows for a in f.actions)


def test_trace_mark_round_trips_and_refuses_other_userdata() -> None:
    for phase in Phase:
        assert TraceMark.decode(TraceMark(42, phase).userdata()) == TraceMark(42, phase)
    assert TraceMark.decode(Userdata(category=Category.POLICY, rule_id=7).encode()) is None
    assert TraceMark.decode(b"") is None
    assert TraceMark.decode(Userdata(category=Category.TRACEFLOW, rule_id=(1 << 24) | (9 << 16)).encode()) is None


def test_live_flows_observe_a_real_packet_and_leave_its_forwarding_and_commit_alone() -> None:
    state = policies()
    s, d = ep(state, "x/a"), ep(state, "y/a")
    base = tables.fixed_flows(1) + compile_policies(state).flows
    for e in state.endpoints:
        base += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    live = trace_flows(1, TraceTag(5, s.ip, d.ip, 6, None, 80), live=True)
    assert all("ip_dscp" not in dict(f.match) and "tcp_src" not in dict(f.match) for f in live)
    assert tables.T_FORWARD not in {f.table for f in live}
    pkt = {"in_port": s.ofport, "eth_type": 0x0800, "ipv4_src": s.ip, "ipv4_dst": d.ip, "ip_proto": 6,
           "tcp_src": 50000, "tcp_dst": 80, "ip_dscp": 0}
    traced, plain = FlowTable(base + live).run(pkt), FlowTable(base).run(pkt)
    assert traced.output == plain.output == d.ofport and traced.committed
    copies = [Copy(table, TraceMark.decode(raw).phase, reg6, reg7) for table, reg7, reg6, raw in traced.copy_log]
    res = decode(copies, rules=compile_policies(state).rules.get, destination=Destination(d.ip, "y/a", d.ofport),
                 reject_reply=None, live=True)
    assert res.outcome["result"] == "delivered"
    assert [o["table"] for o in res.observations][-2:] == [60, 70]


def test_a_trace_to_another_node_s_pod_leaves_table_70_into_the_tunnel_marked_after_its_copy() -> None:
    from policy_agent.policy.tunnel_flows import peer_flows, tunnel_port_flows
    from policy_agent.traceflow.report import TRACE_VNI

    state = policies()
    s = ep(state, "x/a")
    base = tables.fixed_flows(1) + compile_policies(state).flows + tunnel_port_flows(1, 1) + \
        peer_flows(1, 1, "10.248.2.0/24", "198.51.100.12")
    for e in state.endpoints:
        base += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    tag = TraceTag(5, s.ip, "10.248.2.2", 6, SPORT, 80)
    pkt = {"in_port": s.ofport, "eth_type": 0x0800, "ipv4_src": s.ip, "ipv4_dst": "10.248.2.2", "ip_proto": 6,
           "tcp_src": SPORT, "tcp_dst": 80, "ip_dscp": 5}
    traced = FlowTable(base + trace_flows(1, tag, tunnel=(1, "198.51.100.12"))).run(pkt)
    assert traced.output == 1 and not traced.committed
    assert (traced.regs["tun_ipv4_dst"], traced.regs["tunnel_id"]) == ("198.51.100.12", TRACE_VNI)
    assert [t for t, *_ in traced.copy_log][-2:] == [70, 20]  # the hop's copy, then the AFTER copy
    real = FlowTable(base + trace_flows(1, tag, tunnel=(1, "198.51.100.12"))).run({**pkt, "ip_dscp": 0})
    assert real.output == 1 and real.regs.get("tunnel_id", 0) == 0 and real.committed  # real traffic: VNI 0


def test_marked_packets_from_the_tunnel_go_to_the_agent_only_and_real_ones_to_the_pipeline() -> None:
    from policy_agent.policy.tunnel_flows import tunnel_port_flows
    from policy_agent.traceflow.flows import tunnel_flows
    from policy_agent.traceflow.report import REPORT_VNI, TRACE_VNI

    state = policies()
    d = ep(state, "y/a")
    flows = tables.fixed_flows(1) + compile_policies(state).flows + tunnel_port_flows(1, 1) + tunnel_flows(1, 1)
    for e in state.endpoints:
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    pkt = {"in_port": 1, "eth_type": 0x0800, "ipv4_src": "10.248.2.2", "ipv4_dst": d.ip, "ip_proto": 6,
           "tcp_src": SPORT, "tcp_dst": 80, "ip_dscp": 5}
    for vni, phase in ((TRACE_VNI, Phase.FROM_TUNNEL), (REPORT_VNI, Phase.REPORT)):
        marked = FlowTable(flows).run({**pkt, "tunnel_id": vni})
        assert marked.output is None and marked.tables == [0]
        assert [TraceMark.decode(raw).phase for *_, raw in marked.copy_log] == [phase]
    assert FlowTable(flows).run({**pkt, "tunnel_id": 0}).output == d.ofport
    for f in tunnel_flows(1, 1):
        messages.serialize(messages.flow_add(f).to_ofp(), 1)
