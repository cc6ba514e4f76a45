"""This node's underlay address from its Node (Kubernetes mode, the host's OVS, none configured): the
InternalIP first, the API tried until the deadline, every way without one said in a warning line."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from policy_agent.config.loader import loads
from policy_agent.sources.kubernetes_own_node import list_own_node, resolve, wanted, with_node_address
from tests.support.clock import ManualClock
from tests.support.fake_apiserver import NODES, FakeApiServer
from tests.support.fake_apiserver import server  # noqa: F401 (fixture)

K8S = "node_name: node-a\nkubernetes: {enabled: true}\novs: {mode: external}\n"


def node(name: str, *addresses: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}


def test_only_kubernetes_mode_with_the_hosts_ovs_and_no_configured_address_asks_the_node() -> None:
    assert wanted(loads(K8S))
    assert not wanted(loads(K8S.replace("mode: external", "mode: embedded")))  # its own underlay interface
    assert not wanted(loads("node_name: node-a\novs: {mode: external}\n"))  # standalone
    assert not wanted(loads(K8S + "node_network: {pod_cidr: 10.244.1.0/24}\n"
                            "cluster: {node_address: 198.51.100.7/24}\n"))  # configured: kept


def test_the_first_ipv4_internal_ip_is_the_node_address_else_the_external_ip() -> None:
    cfg = loads(K8S)
    got, warning = with_node_address(cfg, node("node-a", ("Hostname", "a"), ("ExternalIP", "203.0.113.5"),
                                               ("InternalIP", "fd00::5"), ("InternalIP", "192.0.2.5"),
                                               ("InternalIP", "192.0.2.6")))
    assert warning is None and got.cluster.node_address == "192.0.2.5/32" and got.cluster.enabled
    assert got.cluster.pod_mtu == 1450 and got.cluster.peers == cfg.cluster.peers
    got, warning = with_node_address(cfg, node("node-a", ("ExternalIP", "203.0.113.5")))
    assert warning is None and got.cluster.node_address == "203.0.113.5/32"


@pytest.mark.parametrize("found, said", [
    (None, "Node node-a could not be read (no such Node)"),
    (node("node-a", ("InternalIP", "fd00::5"), ("Hostname", "a")), "Node node-a has no IPv4 InternalIP or ExternalIP"),
])
def test_without_an_address_the_node_stays_one_node_and_says_so(found: dict[str, Any] | None, said: str) -> None:
    cfg = loads(K8S)
    got, warning = with_node_address(cfg, found)
    assert got is cfg and not got.cluster.enabled
    assert warning is not None and said in warning and "no tunnel to the other nodes' Pods" in warning


def test_the_api_is_tried_until_it_answers_or_the_deadline_passes(caplog: pytest.LogCaptureFixture) -> None:
    cfg, clock = loads(K8S), ManualClock(0.0)
    answers: list[Any] = [OSError("connection refused"), OSError("connection refused"),
                          node("node-a", ("InternalIP", "192.0.2.5"))]

    def read() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def sleep(s: float) -> None:
        clock.now += s

    with caplog.at_level("INFO"):
        assert resolve(cfg, read, deadline=10.0, clock=clock, sleep=sleep).cluster.node_address == "192.0.2.5/32"
    assert clock.now == 2.0 and "node address 192.0.2.5/32 from Node node-a" in caplog.text
    answers[:] = [OSError("connection refused")] * 20
    caplog.clear()
    got = resolve(cfg, read, deadline=15.0, clock=clock, sleep=sleep)
    assert got is cfg and clock.now == 15.0
    assert "could not be read (OSError: connection refused)" in caplog.text and "WARNING" in caplog.text.upper()
    calls: list[int] = []
    configured = loads(K8S.replace("mode: external", "mode: embedded"))
    assert resolve(configured, lambda: calls.append(1), deadline=1.0) is configured and calls == []


def test_the_node_is_listed_by_its_name_alone(server: FakeApiServer) -> None:  # noqa: F811
    server.set_items(NODES, [node("node-b", ("InternalIP", "192.0.2.6")), node("node-a", ("InternalIP", "192.0.2.5"))],
                       "7")
    cfg = client.Configuration(host=server.url)
    cfg.proxy = None
    api = client.ApiClient(cfg)
    try:
        got = list_own_node(api, "node-a", 5.0)
        assert got is not None and got["metadata"]["name"] == "node-a"
        assert list_own_node(api, "node-c", 5.0) is None
    finally:
        api.close()
    assert [q.get("fieldSelector") for q in server.lists_of(NODES)] == ["metadata.name=node-a",
                                                                         "metadata.name=node-c"]


def test_an_agent_whose_node_gave_no_address_counts_it_as_a_node_problem(tmp_path: Any) -> None:
    from prometheus_client import generate_latest

    from policy_agent.agent import Agent

    base = K8S + f"state_dir: {tmp_path / 'state'}\naudit: {{path: {tmp_path / 'a.jsonl'}}}\n"
    metric = 'npaudit_cluster_node_problems_total{reason="node_without_address"}'

    def problems(cfg: Any) -> float:
        line = next(li for li in generate_latest(Agent(cfg).registry).decode().splitlines() if li.startswith(metric))
        return float(line.split()[-1])

    unresolved = loads(base)
    assert problems(unresolved) == 1 and Agent(unresolved).routes is None  # one node, said and counted
    resolved, _ = with_node_address(unresolved, node("node-a", ("InternalIP", "192.0.2.5")))
    agent = Agent(resolved)
    assert problems(resolved) == 0 and agent.routes is not None and agent.routes.denies_unknown
