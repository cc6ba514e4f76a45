"""Geneve between nodes: the tunnel's flows with the pipeline, the gateway and compiled policy, by running
packets through a fake flow table (egress judged where a packet leaves, ingress where it arrives)."""

from __future__ import annotations

from packetin import messages
from packetin.model import Disposition
from policy_agent.cluster.pod_directory import with_remote
from policy_agent.config.node import NodeNetworkConfig
from policy_agent.ovs import tables
from policy_agent.ovs.gateway import plan
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies
from policy_agent.policy.gateway_flows import gateway_flows
from policy_agent.policy.model import (
    Action, AppliedTo, Direction, LabelSelector, Namespace, Peer, Pod, Policy, PolicyKind, PortSpec, Rule,
)
from policy_agent.policy.reject import build_reject
from policy_agent.policy.tunnel_flows import (
    TUN_DST_FIELD, admission_change, admission_next, unknown_source_request, answer_through_tunnel, known_source_flow, peer_flows, tunnel_port_flows,
    unknown_vni_request,
)
from tests.support.flowsim import FlowTable

GW = plan(NodeNetworkConfig(pod_cidr="10.246.1.0/24"))
TUN = 1
PEER = ("10.246.2.0/24", "198.51.100.2")  # node-2's Pod subnet and address
OTHER_PEER = ("10.246.3.0/24", "198.51.100.3")
SERVER = Endpoint(Pod("x", "server", (("app", "server"),)), "10.246.1.2", "02:00:0a:f6:01:02", 100)
CLIENT = Endpoint(Pod("y", "client", (("app", "client"),)), "10.246.1.3", "02:00:0a:f6:01:03", 101)
REMOTE = Pod("y", "remote-client", (("app", "client"),), ips=("10.246.2.5",), node="node-2")
NAMESPACES = {n: Namespace(n, (("kubernetes.io/metadata.name", n),)) for n in ("x", "y")}
IP = 0x0800


def table(*policies: Policy, peers: tuple[tuple[str, str], ...] = (PEER, OTHER_PEER)) -> FlowTable:
    assert GW is not None
    st = ClusterState(NAMESPACES, with_remote((SERVER, CLIENT), (REMOTE,)), policies, pods=(REMOTE,))
    flows = tables.fixed_flows(1) + gateway_flows(1, GW) + tunnel_port_flows(1, TUN) + compile_policies(st).flows
    for p in peers:
        flows += peer_flows(1, TUN, *p)
    for e in (SERVER, CLIENT):
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    return FlowTable(flows)


def tcp(in_port: int, src: str, dst: str, port: int = 80) -> dict:
    return {"in_port": in_port, "eth_type": IP, "ipv4_src": src, "ipv4_dst": dst, "ip_proto": 6, "tcp_dst": port}


def test_a_pods_packet_to_another_nodes_subnet_goes_into_the_tunnel_addressed_to_that_node() -> None:
    ft = table()
    out = ft.run(tcp(100, SERVER.ip, "10.246.2.9"))
    assert out.output == TUN and out.regs[TUN_DST_FIELD] == "198.51.100.2"
    assert ft.run(tcp(100, SERVER.ip, "10.246.3.4")).regs[TUN_DST_FIELD] == "198.51.100.3"
    # The rest is as before: Pods directly, outside through the gateway, the node's own subnet misses dropped.
    assert ft.run(tcp(100, SERVER.ip, CLIENT.ip)).output == 101
    assert ft.run(tcp(100, SERVER.ip, "192.0.2.7")).output == 2
    assert not ft.run(tcp(100, SERVER.ip, "10.246.1.77")).forwarded
    # Without a route to a peer its subnet is just "outside" (the gateway), never the tunnel.
    assert table(peers=(OTHER_PEER,)).run(tcp(100, SERVER.ip, "10.246.2.9")).output == 2


def test_traffic_from_the_tunnel_reaches_only_this_nodes_pods_and_gateway_never_a_third_node() -> None:
    ft = table()
    assert ft.run(tcp(TUN, "10.246.2.5", SERVER.ip)).output == 100
    assert ft.run(tcp(TUN, "10.246.2.5", "10.246.1.1")).output == 2  # the gateway address (the node)
    assert not ft.run(tcp(TUN, "10.246.2.5", "10.246.3.4")).forwarded  # relayed to another node: no
    assert not ft.run(tcp(TUN, "10.246.2.5", "192.0.2.7")).forwarded  # out of the gateway: no
    assert not ft.run({"in_port": TUN, "eth_type": 0x0806, "arp_tpa": SERVER.ip}).forwarded


def test_traffic_from_the_tunnel_meets_ingress_policy_only() -> None:
    # Egress isolation of every client Pod (y) is judged where the client runs: the remote client's
    # packet has passed it on its own node already and is not judged again here...
    isolated = Policy(PolicyKind.K8S, "clients-isolated", namespace="y",
                      applied_to=(AppliedTo(pod_selector=LabelSelector(())),), isolates=(Direction.EGRESS,))
    ft = table(isolated)
    assert ft.run(tcp(TUN, REMOTE.ips[0], SERVER.ip)).output == 100
    assert not ft.run(tcp(101, CLIENT.ip, SERVER.ip)).forwarded  # while the local client is isolated
    # ...while ingress to the server is judged here: a logged Drop for the remote client's address,
    # a Reject for the others, and the rest allowed.
    peer = Peer(pod_selector=LabelSelector((("app", "client"),)), namespace_selector=LabelSelector(()))
    guard = Policy(PolicyKind.ACNP, "guard", tier="securityops", priority=1,
                   applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "server"),))),),
                   rules=(Rule(Direction.INGRESS, Action.DROP, (peer,), (PortSpec("TCP", 80),), name="drop",
                               enable_logging=True),
                          Rule(Direction.INGRESS, Action.REJECT, (), (PortSpec("TCP", 81),), name="reject")))
    ft = table(guard)
    dropped = ft.run(tcp(TUN, REMOTE.ips[0], SERVER.ip, 80))
    assert not dropped.forwarded and [c[0] for c in dropped.copies] == [Disposition.DROP]
    assert ft.run(tcp(TUN, "10.246.2.6", SERVER.ip, 80)).output == 100  # an address no client holds
    rejected = ft.run(tcp(TUN, "10.246.2.6", SERVER.ip, 81))
    assert not rejected.forwarded and [c[0] for c in rejected.copies] == [Disposition.REJECT]
    assert ft.run(tcp(TUN, REMOTE.ips[0], SERVER.ip, 82)).output == 100


def test_only_vni_0_from_the_tunnel_is_pod_traffic_any_other_vni_is_dropped_by_its_own_counted_flow() -> None:
    ft = table()
    assert ft.run({**tcp(TUN, "10.246.2.5", SERVER.ip), "tunnel_id": 0}).output == 100
    counted = unknown_vni_request(1)
    # A mark this node does not know (a newer node's; today's trace marks included, without their flows
    # above: traceflow/flows.py) never reaches a Pod, its gateway or policy, and its drop is counted.
    for vni in (1, 5, 0x7FFFFC, 0x7FFFFD, 0x7FFFFE, 0xFFFFFF):
        out = ft.run({**tcp(TUN, "10.246.2.5", SERVER.ip), "tunnel_id": vni})
        assert not out.forwarded and not out.copies and out.tables == [0]
        assert [f.cookie for f in out.flows] == [counted.cookie]
        assert not ft.run({**tcp(TUN, "10.246.2.5", "10.246.1.1"), "tunnel_id": vni}).forwarded
    assert counted.table_id == 0 and counted.cookie_mask == (1 << 64) - 1
    # A Pod's own packets (no tunnel: tun_id 0) and ARP from the tunnel are as before.
    assert ft.run(tcp(100, SERVER.ip, CLIENT.ip)).output == 101
    arp = ft.run({"in_port": TUN, "eth_type": 0x0806, "arp_tpa": SERVER.ip, "tunnel_id": 5})
    assert not arp.forwarded and unknown_vni_request(1).cookie not in [f.cookie for f in arp.flows]


def test_the_flows_carry_the_tunnel_cookie_and_serialise() -> None:
    flows = tunnel_port_flows(7, TUN) + peer_flows(7, TUN, *PEER)
    vni_drop = [f for f in flows if f.cookie == unknown_vni_request(7).cookie]
    assert len(vni_drop) == 1 and vni_drop[0].table == 0 and not vni_drop[0].actions
    assert {f.cookie for f in flows if f not in vni_drop} == {tables.cookie(7, tables.COOKIE_KIND_TUNNEL)}
    assert (unknown_vni_request(7).cookie & ~tables.ROUND_MASK) & 0xFF == tables.COOKIE_KIND_TUNNEL
    assert tables.marker_generation(flows[0].cookie) is None
    for f in flows:
        assert len(messages.flow_add(f).encode(1)) > 16
    frame = (bytes.fromhex("020000000001") + bytes.fromhex("0200") + b"\x0a\xf6\x02\x05" + b"\x08\x00"
             + bytes.fromhex("450000280000400040060000") + b"\x0a\xf6\x02\x05" + b"\x0a\xf6\x01\x02"
             + bytes.fromhex("d43100500000000100000000500200000000000000"))
    answer = build_reject(frame[:54])
    assert answer is not None
    msg = answer_through_tunnel(answer, "198.51.100.2", TUN)
    raw = messages.serialize(msg, 5)
    # set_field (OFPAT 25) of NXM_NX_TUN_IPV4_DST (class 1, field 32) = 198.51.100.2, then output to the tunnel.
    set_tun_dst = bytes.fromhex("00190010" "00014004") + bytes([198, 51, 100, 2])
    output = bytes.fromhex("00000010") + TUN.to_bytes(4, "big")
    assert set_tun_dst in raw and output in raw and raw.index(set_tun_dst) < raw.index(output)
    assert raw.endswith(answer)


def admitting_table(remote: tuple[Pod, ...], *policies: Policy) -> FlowTable:
    """The node with deny_unknown_sources, knowing the other nodes' Pods `remote`: the tunnel takes
    only their addresses."""
    assert GW is not None
    known = tuple(ip for p in remote for ip in p.ips)
    st = ClusterState(NAMESPACES, with_remote((SERVER, CLIENT), remote), policies, pods=remote)
    flows = tables.fixed_flows(1) + gateway_flows(1, GW) + tunnel_port_flows(1, TUN, deny_unknown=True)
    flows += compile_policies(st).flows + peer_flows(1, TUN, *PEER)
    flows += [known_source_flow(1, TUN, ip) for ip in known]
    for e in (SERVER, CLIENT):
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    return FlowTable(flows)


def test_with_deny_unknown_sources_a_pod_no_object_names_yet_cannot_pass_a_rule_its_labels_would_fail() -> None:
    # Everyone may reach the server except app=client Pods: a client whose object this node has
    # not seen yet would otherwise pass as "anyone".
    peer = Peer(pod_selector=LabelSelector((("app", "client"),)), namespace_selector=LabelSelector(()))
    no_clients = Policy(PolicyKind.ACNP, "no-clients", tier="securityops", priority=1,
                        applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "server"),))),),
                        rules=(Rule(Direction.INGRESS, Action.DROP, (peer,), name="drop"),))
    ft = admitting_table((REMOTE,), no_clients)
    assert not ft.run(tcp(TUN, "10.246.2.9", SERVER.ip)).forwarded  # unknown: dropped before any rule
    assert ft.run(tcp(TUN, "10.246.2.9", SERVER.ip)).tables[-1] == tables.T_SRC_CLASS
    # (Replies to connections this node's Pods opened are established and never reach table 25:
    # tests/e2e/test_tunnel_e2e.py checks it on real OVS.)
    known = ft.run(tcp(TUN, REMOTE.ips[0], SERVER.ip))
    assert not known.forwarded and known.tables[-1] >= tables.T_INGRESS  # judged by its labels: dropped
    web = Pod("y", "web", (("app", "web"),), ips=("10.246.2.10",), node="node-2")
    assert admitting_table((REMOTE, web), no_clients).run(tcp(TUN, "10.246.2.10", SERVER.ip)).output == 100
    # Off: every source from the tunnel meets the policy tables.
    assert table().run(tcp(TUN, "10.246.2.9", SERVER.ip)).output == 100


def test_admission_changes_only_the_addresses_that_come_and_go() -> None:
    made: list[str] = []

    def make(ip: str) -> messages.FlowSpec:
        made.append(ip)
        return known_source_flow(1, TUN, ip)

    add, gone, after = admission_change({}, {"10.246.2.5", "10.246.2.6"}, make)
    assert [f.match for f in add] == [known_source_flow(1, TUN, ip).match for ip in ("10.246.2.5", "10.246.2.6")]
    assert gone == [] and set(after) == {"10.246.2.5", "10.246.2.6"}
    add2, gone2, after2 = admission_change(after, {"10.246.2.6", "10.246.2.7"}, make)
    assert add2 == [after2["10.246.2.7"]] and gone2 == [after["10.246.2.5"]]
    assert sorted(made) == ["10.246.2.5", "10.246.2.6", "10.246.2.7"]  # each address's flow made once
    assert admission_change(after2, {"10.246.2.6", "10.246.2.7"}, make)[:2] == ([], [])


def test_the_drop_of_unknown_sources_has_a_cookie_of_its_own_which_its_statistics_request_asks_for_alone() -> None:
    flows = tunnel_port_flows(7, TUN, deny_unknown=True)
    deny = [f for f in flows if f.table == tables.T_SRC_CLASS]
    assert len(deny) == 1 and not deny[0].actions and deny[0].goto is None  # a drop
    others = {f.cookie for f in flows if f is not deny[0]} | {known_source_flow(7, TUN, "10.246.2.5").cookie}
    assert deny[0].cookie not in others and deny[0].cookie >> 32 == 7  # this round's, like every flow of it
    assert tables.marker_generation(deny[0].cookie) is None
    req = unknown_source_request(7)
    assert (req.table_id, req.cookie, req.cookie_mask) == (tables.T_SRC_CLASS, deny[0].cookie, (1 << 64) - 1)
    assert unknown_source_request(8).cookie != deny[0].cookie  # another round's is another flow
    assert len(messages.serialize(req, 5)) > 16


def test_admission_from_the_touched_pods_alone_agrees_with_a_walk_of_every_pod() -> None:
    """Random changes to a directory of local and remote Pods (addresses reused, moved, claimed twice):
    the admission kept from the Pods each change touched is the walk's, flow for flow, and a change
    that touches no remote address makes no flow and copies nothing."""
    import random

    from policy_agent.cluster.pod_directory import RemoteDirectory

    rnd = random.Random(21)

    def make(ip: str) -> messages.FlowSpec:
        return known_source_flow(1, TUN, ip)

    pods: dict[tuple[str, str], Pod] = {}
    endpoints: dict[tuple[str, str], Endpoint] = {}
    directory = RemoteDirectory.build(endpoints, pods)
    admitted: dict[str, messages.FlowSpec] = {}
    admitted_of = None
    for step in range(600):
        pods, endpoints = dict(pods), dict(endpoints)
        keys = {("y", f"p{rnd.randrange(12)}") for _ in range(rnd.randrange(1, 4))}  # a change of 1-3 Pods
        for key in keys:
            roll = rnd.random()
            ip = f"10.246.2.{rnd.randrange(8)}"
            if roll < 0.45:
                pods[key] = Pod(*key, (("app", "c"),), ips=(ip,), node="node-2")
            elif roll < 0.6:
                endpoints[key] = Endpoint(Pod(*key, ()), ip, "02:00:0a:f6:02:01", 100 + step)
            elif roll < 0.8:
                pods.pop(key, None)
            else:
                endpoints.pop(key, None)
        nxt = directory.update(endpoints, pods, keys)
        walk = {e.ip for e in nxt.by_key.values() if e.ofport == 0}
        before = admitted
        add, gone, admitted = admission_next(admitted, admitted_of, nxt.base, nxt.by_key, nxt.touched, make)
        assert set(admitted) == walk, step
        assert [dict(f.match)["ipv4_src"] for f in add] == sorted(walk - set(before))
        assert [dict(f.match)["ipv4_src"] for f in gone] == sorted(set(before) - walk)
        if not add and not gone and admitted_of is not None:
            assert admitted is before  # nothing copied
        directory, admitted_of = nxt, nxt.by_key
    # A directory not updated from the one admitted (a state built afresh) is walked whole.
    fresh = RemoteDirectory.build(endpoints, pods)
    assert set(admission_next(admitted, admitted_of, fresh.base, fresh.by_key, fresh.touched, make)[2]) == {
        e.ip for e in fresh.by_key.values() if e.ofport == 0}


def test_routed_with_deny_unknown_sources_only_peer_pods_the_node_knows_come_in_through_the_gateway() -> None:
    from policy_agent.policy.tunnel_flows import unknown_peer_flow

    assert GW is not None
    st = ClusterState(NAMESPACES, with_remote((SERVER, CLIENT), (REMOTE,)), (), pods=(REMOTE,))
    flows = tables.fixed_flows(1) + gateway_flows(1, GW) + compile_policies(st).flows
    flows += [unknown_peer_flow(1, GW.ofport, PEER[0]), known_source_flow(1, GW.ofport, REMOTE.ips[0])]
    for e in (SERVER, CLIENT):
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    ft = FlowTable(flows)
    unknown = ft.run(tcp(GW.ofport, "10.246.2.9", SERVER.ip))
    assert not unknown.forwarded and unknown.tables[-1] == tables.T_SRC_CLASS  # a peer's Pod no object names
    assert ft.run(tcp(GW.ofport, REMOTE.ips[0], SERVER.ip)).output == SERVER.ofport  # known: meets policy
    assert ft.run(tcp(GW.ofport, "10.246.3.9", SERVER.ip)).output == SERVER.ofport  # no peer's subnet here
    assert ft.run(tcp(GW.ofport, "203.0.113.9", SERVER.ip)).output == SERVER.ofport  # the outside
    assert ft.run(tcp(GW.ofport, GW.ip, SERVER.ip)).output == SERVER.ofport  # the node itself
