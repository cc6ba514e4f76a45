"""Rules whose peers are Pods on other nodes match them by address: run packets from the node
gateway (where another node's traffic enters) through the compiled flows, full and incremental."""

from __future__ import annotations

import pytest

from policy_agent.config.node import NodeNetworkConfig
from policy_agent.ovs import tables
from policy_agent.ovs.gateway import plan
from policy_agent.cluster.pod_directory import with_remote
from policy_agent.policy import incremental
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies
from policy_agent.policy.gateway_flows import gateway_flows
from policy_agent.policy.model import (
    Action, AppliedTo, Direction, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, PortSpec, Rule,
)
from tests.support.flowsim import FlowTable

GW = plan(NodeNetworkConfig(pod_cidr="10.246.0.0/24"))
IP = 0x0800
SERVER = Endpoint(Pod("x", "server", (("app", "server"),)), "10.246.0.2", "02:00:0a:f6:00:02", 100)
LOCAL_OTHER = Endpoint(Pod("y", "other", (("app", "other"),)), "10.246.0.3", "02:00:0a:f6:00:03", 101)
REMOTE = Pod("y", "client-1", (("app", "client"),), ips=("10.245.0.7",), node="node-b")
NAMESPACES = {n: Namespace(n, (("kubernetes.io/metadata.name", n),)) for n in ("x", "y")}


def only_clients(ports: tuple[PortSpec, ...]) -> Policy:
    """Ingress to app=server from app=client Pods of any namespace, nothing else."""
    peer = Peer(pod_selector=LabelSelector((("app", "client"),)), namespace_selector=LabelSelector(()))
    return Policy(PolicyKind.K8S, "only-clients", namespace="x",
                  applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "server"),))),),
                  rules=(Rule(Direction.INGRESS, Action.ALLOW, (peer,), ports),), isolates=(Direction.INGRESS,))


def client_egress_drop() -> Policy:
    """Applies to app=client Pods: must never judge the remote client's traffic on this node."""
    return Policy(PolicyKind.K8S, "clients-isolated", namespace="y",
                  applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "client"),))),),
                  isolates=(Direction.EGRESS, Direction.INGRESS))


def state(pods: tuple[Pod, ...], *policies: Policy) -> ClusterState:
    return ClusterState(NAMESPACES, with_remote((SERVER, LOCAL_OTHER), pods), policies, pods=pods)


def table(flows: list) -> FlowTable:
    assert GW is not None
    base = tables.fixed_flows(1) + gateway_flows(1, GW)
    for e in (SERVER, LOCAL_OTHER):
        base += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    return FlowTable(base + flows)


def tcp(in_port: int, src: str, dst: str, port: int = 80) -> dict:
    return {"in_port": in_port, "eth_type": IP, "ipv4_src": src, "ipv4_dst": dst, "ip_proto": 6, "tcp_dst": port}


# by class (a numbered port), per Pod (a named port: the applied-to Pod names it), and any port
@pytest.mark.parametrize("ports", [(PortSpec("TCP", 80),), (PortSpec("TCP", "http"),), ()])
def test_a_rule_whose_peer_is_a_remote_pod_allows_its_address_and_drops_others(ports: tuple[PortSpec, ...]) -> None:
    server = Endpoint(Pod("x", "server", (("app", "server"),), ports=_http()), SERVER.ip, SERVER.mac, 100)
    st = ClusterState(NAMESPACES, with_remote((server, LOCAL_OTHER), (REMOTE,)),
                      (only_clients(ports), client_egress_drop()), pods=(server.pod, REMOTE))
    full = compile_policies(st).flows
    snap, _ = incremental.update(None, ClusterState(NAMESPACES, (server, LOCAL_OTHER), st.policies,
                                                    pods=(server.pod,)))
    snap, _ = incremental.update(snap, st)  # the remote Pod arrives after the policy
    assert sorted(f.key for f in snap.flows()) == sorted(f.key for f in full)
    for flows in (full, list(snap.flows())):
        ft = table(flows)
        assert ft.run(tcp(2, "10.245.0.7", SERVER.ip)).output == 100  # the remote client
        assert not ft.run(tcp(2, "10.245.0.8", SERVER.ip)).forwarded  # an address no Pod holds
        assert not ft.run(tcp(101, LOCAL_OTHER.ip, SERVER.ip)).forwarded  # a local Pod not selected
        # The egress isolation of app=client Pods is the remote node's business, not ours.
        assert ft.run(tcp(100, SERVER.ip, "10.245.0.7")).output == 2


def test_a_deleted_remote_pod_is_no_peer_and_a_new_one_on_its_address_is_judged_by_its_own_labels() -> None:
    policy = only_clients((PortSpec("TCP", 80),))
    snap, _ = incremental.update(None, state((REMOTE,), policy))
    assert table(list(snap.flows())).run(tcp(2, "10.245.0.7", SERVER.ip)).output == 100
    reused = Pod("y", "batch-9", (("app", "batch"),), ips=("10.245.0.7",), node="node-c")
    snap, _ = incremental.update(snap, state((reused,), policy))
    assert not table(list(snap.flows())).run(tcp(2, "10.245.0.7", SERVER.ip)).forwarded
    assert sorted(f.key for f in snap.flows()) == sorted(f.key for f in compile_policies(state((reused,), policy)).flows)


def _http() -> tuple:
    from policy_agent.policy.model import ContainerPort
    return (ContainerPort("http", 80),)
