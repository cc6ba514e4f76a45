"""The node gateway's flows with the pipeline and compiled policy, by running packets through a fake flow table."""

from __future__ import annotations

import pytest

from packetin.model import Disposition
from policy_agent.config.loader import ConfigError, loads
from policy_agent.config.node import NodeNetworkConfig
from policy_agent.ovs import tables
from policy_agent.ovs.gateway import GatewayPlan, masquerade_steps, plan
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies
from policy_agent.policy.gateway_flows import gateway_flows
from policy_agent.policy.model import (
    Action, AppliedTo, Direction, IPBlock, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, PortSpec, Rule,
)
from policy_agent.traceflow.flows import Phase
from policy_agent.traceflow.result import Copy, Destination, decode
from policy_agent.traceflow.service import destination

from tests.support.flowsim import FlowTable, Verdict

GW = plan(NodeNetworkConfig(pod_cidr="10.244.0.0/24"))
NS_X = LabelSelector((("kubernetes.io/metadata.name", "x"),))
OUTSIDE = "192.0.2.7"
ARP, IP = 0x0806, 0x0800


def state(*policies: Policy) -> ClusterState:
    namespaces = {"x": Namespace("x", (("kubernetes.io/metadata.name", "x"),))}
    eps = (Endpoint(Pod("x", "a", (("pod", "a"),)), "10.244.0.2", "02:00:0a:f4:00:02", 100),
           Endpoint(Pod("x", "b", (("pod", "b"),)), "10.244.0.3", "02:00:0a:f4:00:03", 101))
    return ClusterState(namespaces, eps, policies)


def flow_table(st: ClusterState, gateway: bool = True) -> FlowTable:
    assert GW is not None
    flows = tables.fixed_flows(1) + compile_policies(st).flows
    for e in st.endpoints:
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    return FlowTable(flows + (gateway_flows(1, GW) if gateway else []))


def tcp(in_port: int, src: str, dst: str, port: int = 80) -> dict:
    return {"in_port": in_port, "eth_type": IP, "ipv4_src": src, "ipv4_dst": dst, "ip_proto": 6, "tcp_dst": port}


def gateway_out(v: Verdict) -> bool:
    assert GW is not None
    return v.output == GW.ofport and v.regs.get("eth_dst") == GW.mac


def test_the_plan_takes_the_first_host_address_and_a_mac_derived_from_it() -> None:
    assert GW == GatewayPlan(port="npaudit-gw0", ofport=2, ip="10.244.0.1", subnet="10.244.0.0/24",
                             mac="02:00:0a:f4:00:01")
    assert GW.address == "10.244.0.1/24"
    assert plan(NodeNetworkConfig()) is None
    assert plan(NodeNetworkConfig(pod_cidr="10.9.0.0/16", gateway="10.9.3.254")).address == "10.9.3.254/16"  # type: ignore[union-attr]


def test_pods_reach_the_gateway_address_and_everything_outside_their_subnet_through_the_gateway_port() -> None:
    ft = flow_table(state())
    arp = ft.run({"in_port": 100, "eth_type": ARP, "arp_tpa": "10.244.0.1"})
    assert arp.output == 2
    assert gateway_out(ft.run(tcp(100, "10.244.0.2", "10.244.0.1", 8080)))
    assert gateway_out(ft.run(tcp(100, "10.244.0.2", OUTSIDE, 443)))
    # Pods still reach Pods directly; an unassigned address of the subnet goes nowhere.
    assert ft.run(tcp(100, "10.244.0.2", "10.244.0.3")).output == 101
    assert not ft.run(tcp(100, "10.244.0.2", "10.244.0.77")).forwarded


def test_without_the_gateway_flows_nothing_leaves_the_node() -> None:
    ft = flow_table(state(), gateway=False)
    assert not ft.run({"in_port": 100, "eth_type": ARP, "arp_tpa": "10.244.0.1"}).forwarded
    assert not ft.run(tcp(100, "10.244.0.2", OUTSIDE)).forwarded
    assert not ft.run(tcp(2, "10.244.0.1", "10.244.0.2")).forwarded


def test_the_node_reaches_its_pods_whatever_ingress_policy_says_but_routed_sources_meet_it() -> None:
    isolate = Policy(PolicyKind.K8S, "deny-all", namespace="x", applied_to=(AppliedTo(pod_selector=LabelSelector(())),),
                     isolates=(Direction.INGRESS,))
    drop_all = Policy(PolicyKind.ACNP, "drop-all", tier="securityops", priority=1,
                      applied_to=(AppliedTo(namespace_selector=NS_X),),
                      rules=(Rule(Direction.INGRESS, Action.DROP, (Peer(ip_block=IPBlock("0.0.0.0/0")),),
                                  name="all"),))
    for policy in (isolate, drop_all):
        ft = flow_table(state(policy))
        assert ft.run(tcp(2, "10.244.0.1", "10.244.0.2")).output == 100  # kubelet's probe
        assert not ft.run(tcp(101, "10.244.0.3", "10.244.0.2")).forwarded  # another Pod
        assert not ft.run(tcp(2, OUTSIDE, "10.244.0.2")).forwarded  # routed in from outside
    # The gateway's ARP for a Pod reaches it; the gateway never gets its own packets back.
    ft = flow_table(state())
    assert ft.run({"in_port": 2, "eth_type": ARP, "arp_tpa": "10.244.0.2"}).output == 100
    assert not ft.run(tcp(2, "10.244.0.1", OUTSIDE)).forwarded


def test_egress_ipblock_rules_judge_outside_destinations_before_the_gateway() -> None:
    policy = Policy(PolicyKind.ACNP, "outside", tier="securityops", priority=1,
                    applied_to=(AppliedTo(namespace_selector=NS_X),),
                    rules=(Rule(Direction.EGRESS, Action.DROP, (Peer(ip_block=IPBlock("192.0.2.0/24")),),
                                (PortSpec("TCP", 8081),), name="drop", enable_logging=True),
                           Rule(Direction.EGRESS, Action.REJECT, (Peer(ip_block=IPBlock(f"{OUTSIDE}/32")),),
                                (PortSpec("TCP", 8082),), name="reject")))
    ft = flow_table(state(policy))
    assert gateway_out(ft.run(tcp(100, "10.244.0.2", OUTSIDE, 8080)))
    dropped = ft.run(tcp(100, "10.244.0.2", OUTSIDE, 8081))
    assert not dropped.forwarded and [c[0] for c in dropped.copies] == [Disposition.DROP]
    rejected = ft.run(tcp(100, "10.244.0.2", OUTSIDE, 8082))
    assert not rejected.forwarded and [c[0] for c in rejected.copies] == [Disposition.REJECT]
    assert gateway_out(ft.run(tcp(100, "10.244.0.2", "198.51.100.1", 8081)))  # outside the block


def test_masquerade_steps_make_the_chain_once_and_only_fix_what_differs() -> None:
    assert GW is not None
    fresh = masquerade_steps(GW, ["-P POSTROUTING ACCEPT"])
    assert fresh == [["-t", "nat", "-N", "NPAUDIT-MASQ"],
                     ["-t", "nat", "-A", "NPAUDIT-MASQ", "-s", "10.244.0.0/24", "!", "-d", "10.244.0.0/24",
                      "-j", "MASQUERADE"],
                     ["-t", "nat", "-A", "POSTROUTING", "-j", "NPAUDIT-MASQ"]]
    done = ["-P POSTROUTING ACCEPT", "-N NPAUDIT-MASQ", "-A POSTROUTING -j NPAUDIT-MASQ",
            "-A NPAUDIT-MASQ -s 10.244.0.0/24 ! -d 10.244.0.0/24 -j MASQUERADE"]
    assert masquerade_steps(GW, done) == []
    other = done[:3] + ["-A NPAUDIT-MASQ -s 10.9.0.0/24 ! -d 10.9.0.0/24 -j MASQUERADE"]
    assert masquerade_steps(GW, other) == [["-t", "nat", "-F", "NPAUDIT-MASQ"], fresh[1]]
    off = plan(NodeNetworkConfig(pod_cidr="10.244.0.0/24", masquerade=False))
    assert off is not None and masquerade_steps(off, done) == [["-t", "nat", "-F", "NPAUDIT-MASQ"]]


def test_a_trace_to_an_outside_address_ends_at_the_gateway() -> None:
    assert GW is not None
    dest = destination(OUTSIDE, None, GW)
    assert dest == Destination(OUTSIDE, None, 2, "the node gateway npaudit-gw0 (10.244.0.1, port 2)")
    assert destination("10.244.0.1", None, GW).gateway is not None
    assert destination("10.244.0.77", None, GW) == Destination("10.244.0.77")  # in the subnet, no Pod
    assert destination(OUTSIDE, None, None) == Destination(OUTSIDE)
    copies = [Copy(t, Phase.ARRIVAL, 0, 0) for t in (20, 30, 31, 32, 40, 41, 42, 70)]
    res = decode(copies + [Copy(20, Phase.AFTER, 0, 0)], rules=lambda _: None, destination=dest, reject_reply=None)
    assert res.result == "forwarded" and "npaudit-gw0" in res.outcome["detail"]
    assert res.observations[-1]["action"] == "output" and "node gateway" in res.observations[-1]["detail"]


@pytest.mark.parametrize("text, problem", [
    ("node_network: {pod_cidr: 10.244.0.1/24}", "node_network.pod_cidr: must be an IPv4 subnet"),
    ("node_network: {pod_cidr: 10.244.0.0/31}", "node_network.pod_cidr: must leave room"),
    ("node_network: {pod_cidr: 10.244.0.0/24, gateway: 10.9.0.1}", "node_network.gateway: 10.9.0.1 is not a host"),
    ("node_network: {pod_cidr: 10.244.0.0/24, gateway: 10.244.0.0}", "node_network.gateway: 10.244.0.0 is not"),
    ("node_network: {gateway: 10.244.0.1}", "node_network.gateway: needs node_network.pod_cidr"),
    ("node_network: {gateway_port: 'a b'}", "node_network.gateway_port: must be an interface name"),
    ("node_network: {gateway_ofport: 65280}", "node_network.gateway_ofport: must be between 1 and 65279"),
])
def test_a_bad_node_network_section_is_refused_naming_the_field(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads(text)
    assert problem in str(err.value)


def test_the_node_network_section_defaults_to_no_gateway() -> None:
    cfg = loads("")
    assert cfg.node_network.pod_cidr == "" and cfg.node_network.gateway_ip == ""
    assert loads("node_network: {pod_cidr: 10.244.0.0/24}").node_network.gateway_ip == "10.244.0.1"
