"""The plan of a cluster on one machine (policy_agent/cluster/local.py): addresses, subnets, names, the
configs every node gets (loaded by the real config loader), the record `down` reads and what it stops."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from policy_agent.cluster.local import (
    NODE_UNDERLAY_IF, ClusterPlan, PlanError, check_requested_ip, kubeconfig, netconf, node_config, node_config_yaml,
    node_objects, parse_labels, plan_cluster, plan_pod, pod_object, shared_name, teardown)
from policy_agent.cluster.peer_nodes import peers_from_nodes
from policy_agent.cni.subnet import node_pod_cidr
from policy_agent.config.loader import loads
from policy_agent.policy.manifests import load_text

DIR = Path("/tmp/npc-test")


def three(encapsulation: str = "geneve") -> ClusterPlan:
    return plan_cluster(DIR, 3, encapsulation, "a1b2c3", [9101, 9102, 9103])


def test_each_node_has_its_own_subnet_address_namespace_and_directory() -> None:
    plan = three()
    assert [n.name for n in plan.nodes] == ["n1", "n2", "n3"]
    assert [n.pod_cidr for n in plan.nodes] == ["10.248.1.0/24", "10.248.2.0/24", "10.248.3.0/24"]
    assert [n.address for n in plan.nodes] == ["198.51.100.11/24", "198.51.100.12/24", "198.51.100.13/24"]
    assert [n.netns for n in plan.nodes] == ["npc-a1b2c3-n1", "npc-a1b2c3-n2", "npc-a1b2c3-n3"]
    assert plan.underlay_netns == "npc-a1b2c3-ul"
    assert [n.config_path for n in plan.nodes] == [DIR / f"n{i}" / "npaudit.yaml" for i in (1, 2, 3)]
    assert len({n.metrics_listen for n in plan.nodes}) == 3
    nets = [ipaddress.IPv4Network(n.pod_cidr) for n in plan.nodes]
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])


@pytest.mark.parametrize("encapsulation", ["geneve", "routed"])
def test_every_node_config_loads_and_names_the_others_as_peers(encapsulation: str) -> None:
    plan = three(encapsulation)
    for node in plan.nodes:
        cfg = loads(node_config_yaml(plan, node), source=str(node.config_path), environ={})
        assert cfg.node_name == node.name
        assert cfg.state_dir == str(DIR / node.name / "state")
        assert cfg.ovs.netns == node.netns and cfg.ovs.run_dir == str(DIR / node.name / "ovs")
        assert cfg.audit.path == str(DIR / node.name / "audit" / "audit.jsonl")
        assert cfg.metrics.listen == f"127.0.0.1:{node.metrics_port}"
        assert cfg.policy.manifest_dir == str(DIR / "shared")
        assert cfg.node_network.pod_cidr == node.pod_cidr
        assert cfg.cluster.encapsulation == encapsulation
        assert cfg.cluster.node_address == node.address
        assert cfg.cluster.underlay_interface == NODE_UNDERLAY_IF
        assert [(p.name, p.pod_cidr, p.address) for p in cfg.cluster.peers] == [
            (o.name, o.pod_cidr, o.ip) for o in plan.nodes if o is not node]


def test_the_netconf_points_at_the_nodes_own_agent_and_ipam() -> None:
    plan = three()
    conf = netconf(plan, plan.nodes[1])
    assert conf["type"] == "npaudit" and conf["agentSocket"] == str(DIR / "n2" / "state" / "cni.sock")
    assert conf["ipam"]["dataDir"] == str(DIR / "n2" / "ipam") and "ranges" not in conf["ipam"]  # the agent's subnet


@pytest.mark.parametrize(("args", "message"), [
    ((Path("rel"), 2, "geneve", "abcd", [1, 2]), "absolute"),
    ((DIR, 0, "geneve", "abcd", []), "--nodes"),
    ((DIR, 201, "geneve", "abcd", list(range(201))), "--nodes"),
    ((DIR, 2, "vxlan", "abcd", [1, 2]), "--encapsulation"),
    ((DIR, 2, "geneve", "abcd", [1, 1]), "distinct"),
    ((DIR, 2, "geneve", "ab;d", [1, 2]), "tag"),
    ((Path("/" + "d" * 90), 2, "geneve", "abcd", [1, 2]), "too long"),
    ((DIR, 2, "geneve", "abcd", [1, 2], "127.0.0.1:6443"), "--kubernetes-api"),
    ((DIR, 2, "geneve", "abcd", [1, 2], "ftp://127.0.0.1"), "--kubernetes-api"),
    ((DIR, 2, "geneve", "abcd", [1, 2], "http://a b"), "--kubernetes-api"),
])
def test_impossible_plans_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_cluster(*args)


def test_the_record_round_trips_with_its_pods() -> None:
    plan = three()
    pod = plan_pod(plan, "n2", "x/a", ["app=web", "tier=1"])
    from dataclasses import replace

    plan = replace(plan, pods=(replace(pod, ip="10.248.2.5"),))
    again = ClusterPlan.from_json(plan.to_json())
    assert again == plan
    with pytest.raises(PlanError):
        ClusterPlan.from_json('{"version": 99}')


def test_down_stops_pods_then_agents_then_ovs_then_node_and_underlay_namespaces() -> None:
    from dataclasses import replace

    plan = three()
    first = plan_pod(plan, "n1", "x/a", [])
    plan = replace(plan, pods=(first,))
    second = plan_pod(plan, "n3", "y/b", [])
    plan = replace(plan, pods=(first, second))
    down = teardown(plan)
    assert down.pod_netns == ("npc-a1b2c3-p1", "npc-a1b2c3-p0")
    assert down.agent_pid_files == tuple(str(DIR / f"n{i}" / "agent.pid") for i in (1, 2, 3))
    assert down.ovs_run_dirs == tuple((str(DIR / f"n{i}" / "ovs"), f"npc-a1b2c3-n{i}") for i in (1, 2, 3))
    assert down.namespaces == ("npc-a1b2c3-p1", "npc-a1b2c3-p0", "npc-a1b2c3-n1", "npc-a1b2c3-n2",
                               "npc-a1b2c3-n3", "npc-a1b2c3-ul")
    assert set(down.namespaces) == set(plan.namespaces())  # exactly what up made, nothing else


def test_a_pod_object_carries_labels_node_and_address_and_parses() -> None:
    plan = three()
    pod = plan_pod(plan, "n2", "x/a", ["app=web"])
    objs = load_text(yaml.safe_dump(pod_object(pod)), "t")
    assert [(p.key, p.labels, p.node, p.ips) for p in objs.pods] == [(("x", "a"), (("app", "web"),), "n2", ())]
    from dataclasses import replace

    objs = load_text(yaml.safe_dump(pod_object(replace(pod, ip="10.248.2.7"))), "t")
    assert objs.pods[0].ips == ("10.248.2.7",)


@pytest.mark.parametrize(("node", "ref", "labels", "message"), [
    ("n9", "x/a", [], "no node"),
    ("n1", "xa", [], "NAMESPACE/NAME"),
    ("n1", "X/a", [], "DNS-1123"),
    ("n1", "x/a", ["app"], "KEY=VALUE"),
    ("n1", "x/a", ["app=a", "app=b"], "twice"),
])
def test_bad_pod_requests_are_refused(node: str, ref: str, labels: list[str], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_pod(three(), node, ref, labels)


def test_labels_keep_their_order() -> None:
    assert parse_labels(["b=1", "a=2", "example.com/x="]) == (("b", "1"), ("a", "2"), ("example.com/x", ""))


@pytest.mark.parametrize(("source", "name"), [
    ("policies/deny.yaml", "apply-deny.yaml"), ("-", "apply-stdin.yaml"), ("config/samples/", "apply-samples.yaml"),
    ("a b.json", "apply-a_b.yaml"), ("../.hidden.yml", "apply-hidden.yaml"),
])
def test_cluster_apply_writes_one_file_per_source(source: str, name: str) -> None:
    assert shared_name(source) == name


def test_node_config_is_only_fields_the_loader_knows() -> None:
    plan = three()
    cfg = node_config(plan, plan.nodes[0])
    assert set(cfg) <= {"node_name", "cluster_name", "state_dir", "ovs", "metrics", "audit", "policy",
                        "node_network", "cluster"}
    assert set(node_config(kube(), kube().nodes[0])) <= {"node_name", "cluster_name", "state_dir", "ovs", "metrics",
                                                          "audit", "kubernetes", "node_network", "cluster"}


API = "http://127.0.0.1:6443"


def kube() -> ClusterPlan:
    return plan_cluster(DIR, 3, "geneve", "a1b2c3", [9101, 9102, 9103], kubernetes_api=API)


def test_with_a_kubernetes_api_every_node_watches_it_under_its_own_name_and_finds_its_peers_there() -> None:
    plan = kube()
    for node in plan.nodes:
        cfg = loads(node_config_yaml(plan, node), source=str(node.config_path), environ={})
        assert cfg.node_name == node.name
        assert cfg.kubernetes.enabled and cfg.kubernetes.kubeconfig == str(DIR / "kubeconfig")
        assert cfg.policy.manifest_dir == ""  # DIR/shared is not read
        assert cfg.node_network.pod_cidr == node.pod_cidr  # what its Node object says too
        assert cfg.cluster.node_address == node.address and cfg.cluster.underlay_interface == NODE_UNDERLAY_IF
        assert cfg.cluster.peers == ()  # the other Node objects are its peers
    doc = yaml.safe_load(kubeconfig(plan))
    assert doc["clusters"][0]["cluster"]["server"] == API and doc["current-context"] == "npaudit"


def test_the_node_objects_carry_what_the_plan_chose_as_the_agent_reads_nodes() -> None:
    plan = kube()
    nodes = node_objects(plan)
    assert [(n["metadata"]["name"], node_pod_cidr(n)) for n in nodes] == [(p.name, p.pod_cidr) for p in plan.nodes]
    peers, problems = peers_from_nodes(nodes, "n2")
    assert list(problems) == []
    assert sorted((p.name, p.pod_cidr, p.address) for p in peers) == [
        ("n1", "10.248.1.0/24", "198.51.100.11"), ("n3", "10.248.3.0/24", "198.51.100.13")]


def test_the_record_keeps_the_kubernetes_api_and_an_older_record_has_none() -> None:
    plan = kube()
    assert ClusterPlan.from_json(plan.to_json()) == plan
    import json

    old = json.loads(three().to_json())
    del old["kubernetes_api"]
    assert ClusterPlan.from_json(json.dumps(old)).kubernetes_api == ""


@pytest.mark.parametrize(("ip", "message"), [
    ("10.248.2.1", "gateway"), ("10.248.2.0", "not a Pod address"), ("10.248.2.255", "not a Pod address"),
    ("10.248.1.5", "not a Pod address"), ("10.248.2", "IPv4"), ("fd00::5", "IPv4"),
])
def test_a_requested_pod_address_must_be_one_of_the_nodes_pod_addresses(ip: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        check_requested_ip(three().nodes[1], ip)
    assert check_requested_ip(three().nodes[1], "10.248.2.5") == "10.248.2.5"


def test_every_node_denies_unknown_sources_unless_up_is_told_not_to_and_the_record_keeps_the_choice() -> None:
    from policy_agent.config.loader import loads

    plan = three()
    assert plan.deny_unknown_sources
    for node in plan.nodes:
        assert loads(node_config_yaml(plan, node)).cluster.deny_unknown_sources
    off = plan_cluster(DIR, 3, "geneve", "a1b2c3", [9101, 9102, 9103], deny_unknown_sources=False)
    assert not loads(node_config_yaml(off, off.nodes[1])).cluster.deny_unknown_sources
    assert not ClusterPlan.from_json(off.to_json()).deny_unknown_sources
    assert ClusterPlan.from_json(plan.to_json()).deny_unknown_sources
