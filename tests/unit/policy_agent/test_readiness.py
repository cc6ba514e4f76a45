"""/readyz and /healthz on the agent's metrics listener: ready means OpenFlow, flows installed and CNI listening."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from policy_agent.config import loader as config_mod
from policy_agent.agent import Agent
from policy_agent.http.endpoints import serve


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[str]]]:
    registry = CollectorRegistry(auto_describe=False)
    Gauge("npaudit_test_gauge", "a gauge", registry=registry).set(7)
    waiting = ["OpenFlow not connected", "CNI server not listening"]
    server = serve("127.0.0.1", 0, registry, lambda: list(waiting))
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", waiting
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readyz_is_503_naming_what_is_missing_until_nothing_is(endpoint: tuple[str, list[str]]) -> None:
    url, waiting = endpoint
    assert _get(url + "/readyz") == (503, "not ready: OpenFlow not connected; CNI server not listening\n")
    assert _get(url + "/healthz") == (200, "ok\n")  # alive all the same
    waiting.clear()
    assert _get(url + "/readyz") == (200, "ok\n")
    status, text = _get(url + "/metrics")
    assert status == 200 and "npaudit_test_gauge 7.0" in text


def test_an_agent_not_started_is_not_ready_for_any_of_the_three_reasons(tmp_path) -> None:
    cfg = config_mod.loads(f"state_dir: {tmp_path / 'state'}\naudit:\n  path: {tmp_path / 'audit' / 'a.jsonl'}\n")
    assert Agent(cfg).readiness() == ["OpenFlow not connected", "policy flows not installed yet",
                                      "CNI server not listening"]
    no_cni = config_mod.loads(f"state_dir: {tmp_path / 'state'}\ncni:\n  enabled: false\n")
    assert "CNI server not listening" not in Agent(no_cni).readiness()
