"""The `cluster:` section: one node by default, peers checked together and against this node's subnet."""

from __future__ import annotations

import pytest

from policy_agent.config.loader import ConfigError, loads

TWO = ("node_network: {pod_cidr: 10.244.1.0/24}\n"
       "cluster: {node_address: 198.51.100.11/24, underlay_interface: eth-ul,\n"
       "          peers: [{name: n2, pod_cidr: 10.244.2.0/24, address: 198.51.100.12}]}\n")


def test_one_node_by_default_and_pods_keep_the_full_mtu() -> None:
    cfg = loads("")
    assert not cfg.cluster.enabled and cfg.cluster.peers == () and cfg.cluster.pod_mtu == 1500


def test_geneve_takes_its_overhead_from_the_pod_mtu_and_routed_does_not() -> None:
    cfg = loads(TWO)
    assert cfg.cluster.enabled and cfg.cluster.peers[0].name == "n2" and cfg.cluster.pod_mtu == 1450
    assert loads(TWO.replace("node_address:", "encapsulation: routed, node_address:")).cluster.pod_mtu == 1500


@pytest.mark.parametrize(("text", "problem"), [
    ("cluster: {node_address: 198.51.100.11}", "cluster.node_address: must give the prefix length"),
    ("cluster: {node_address: 10.0.0.300/24}", "cluster.node_address: must be an IPv4 address with its prefix"),
    ("cluster: {encapsulation: vxlan}", "cluster.encapsulation: must be one of"),
    ("cluster: {peers: [{name: a, pod_cidr: 10.1.0.0/24, address: 1.1.1.1}]}", "cluster.peers: needs cluster.node_address"),
    (TWO.replace("10.244.2.0/24", "10.244.0.0/16"), "cluster.peers[0].pod_cidr: 10.244.0.0/16 overlaps the Pod subnet of this node"),
    (TWO.replace("198.51.100.12", "n2.example"), "cluster.peers[0].address: must be an IPv4 address"),
    (TWO.replace("name: n2", "name: ''"), "cluster.peers[0].name: must be given and unique"),
    (TWO.replace("}]}", "}, {name: n2, pod_cidr: 10.244.3.0/24, address: 198.51.100.13}]}"),
     "cluster.peers[1].name: must be given and unique"),
    (TWO.replace("}]}", "}, {name: n3, pod_cidr: 10.244.2.128/25, address: 198.51.100.13}]}"),
     "cluster.peers[1].pod_cidr: 10.244.2.128/25 overlaps the Pod subnet of n2"),
])
def test_a_bad_cluster_section_is_refused_naming_the_field(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads(text)
    assert any(problem in e for e in err.value.errors), err.value.errors
