"""Pod names and namespaces from CNI_ARGS follow Kubernetes naming, so none can forge an agent log line."""

from __future__ import annotations

import json
import logging
import struct

import pytest

from policy_agent import rpc
from policy_agent.cni import wire
from tests.support.cni_plugin import Agent, _exchange, agent, env, invoke, netconf, tmp  # noqa: F401 (fixtures)

FORGED = "web-0\n2024-01-01 00:00:00,000 INFO npaudit: forged"


def _args(namespace: str = "default", name: str = "web-0") -> str:
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"


@pytest.mark.parametrize("namespace, name, field", [
    ("default", FORGED, "K8S_POD_NAME"),
    ("def\nault", "web-0", "K8S_POD_NAMESPACE"),
    ("default", "web\x1b[2K0", "K8S_POD_NAME"),
    ("default", "Web-0", "K8S_POD_NAME"),              # upper case
    ("default", "web_0", "K8S_POD_NAME"),
    ("default", "w" * 254, "K8S_POD_NAME"),            # DNS-1123 subdomain: at most 253
    ("default", "web..0", "K8S_POD_NAME"),             # empty label
    ("kube.system", "web-0", "K8S_POD_NAMESPACE"),     # namespaces are labels: no dots
    ("n" * 64, "web-0", "K8S_POD_NAMESPACE"),          # DNS-1123 label: at most 63
    ("-default", "web-0", "K8S_POD_NAMESPACE"),
    ("default", "", "K8S_POD_NAME"),
])
def test_the_plugin_refuses_names_kubernetes_would_not_make(agent: Agent, namespace: str, name: str,
                                                            field: str) -> None:
    code, out = invoke(env("ADD", CNI_ARGS=_args(namespace, name)), netconf(agent.path))
    assert code == 1
    assert f'"code": {wire.ERR_INVALID_ENV}' in out and field in out, out
    assert agent.handler.requests == []


@pytest.mark.parametrize("namespace, name", [
    ("default", "web-0"), ("kube-system", "coredns-5d78c9869d-x7k2p"), ("a", "a.b-c.d"),
    ("n" * 63, "p" * 253),
])
def test_kubernetes_names_pass(agent: Agent, namespace: str, name: str) -> None:
    assert invoke(env("ADD", CNI_ARGS=_args(namespace, name)), netconf(agent.path))[0] == 0
    assert agent.handler.requests[-1].args["K8S_POD_NAME"] == name


def test_a_request_sent_around_the_plugin_is_checked_by_the_agent_and_logs_one_line(
        agent: Agent, caplog: pytest.LogCaptureFixture) -> None:
    request = {"command": "ADD", "container_id": "c1", "netns": "/run/netns/x", "ifname": "eth0",
               "args": {"K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": FORGED},
               "netconf": netconf(agent.path)}
    with caplog.at_level(logging.INFO, logger="policy_agent.cni.server"):
        reply = _exchange(agent.path, rpc.encode_frame(request))
    assert reply["ok"] is False and reply["code"] == wire.ERR_INVALID_ENV, reply
    assert "K8S_POD_NAME" in reply["msg"]
    assert agent.handler.requests == []
    messages = [r.getMessage() for r in caplog.records]
    assert messages and not any("\n" in m for m in messages), messages


def test_without_kubernetes_args_standalone_calls_still_work(agent: Agent) -> None:
    assert invoke(env("DEL", CNI_ARGS="IgnoreUnknown=1"), netconf(agent.path))[0] == 0


@pytest.mark.parametrize("ifname", ["\ud800", "eth\x00", "e\u2028"])
def test_an_interface_name_no_kernel_can_hold_is_refused_in_one_line(agent: Agent, ifname: str) -> None:
    # Found by the CNI fuzz target: a lone surrogate raised UnicodeEncodeError in the agent.
    request = {"command": "ADD", "container_id": "c1", "netns": "/run/netns/x", "ifname": ifname,
               "netconf": netconf(agent.path)}
    body = json.dumps(request).encode()  # ASCII JSON: "\ud800" travels as an escape
    reply = _exchange(agent.path, struct.pack(">I", len(body)) + body)
    assert reply["ok"] is False and reply["code"] == wire.ERR_INVALID_ENV, reply
    assert "CNI_IFNAME" in reply["msg"] and agent.handler.requests == []
