"""This node's underlay address from its own Node object, read once at start (Kubernetes mode, the host's OVS).

With `ovs.mode: external` the host holds its addresses and routes and carries the tunnel; what a node
of the cluster needs is which address is its own. So with `kubernetes.enabled` and
`cluster.node_address: ""` the agent reads its Node (NODE_NAME) before it builds anything and takes the
first IPv4 InternalIP of `status.addresses`, else the first ExternalIP (the same address the other
nodes' agents take for it as their peer: cluster/peer_nodes.py). The Node is read with a list of that
one Node (fieldSelector metadata.name): the list verb the Node watch holds already, so RBAC grows by
nothing. An embedded OVS puts the node address, with its prefix, on an underlay interface of its own
namespace: there it stays per-node config.

A Node that cannot be read within `kubernetes.sync_timeout`, or has no IPv4 address, leaves the node
without a tunnel to the others: said at start in a warning line and counted by the agent
(npaudit_cluster_node_problems_total{reason="node_without_address"}); the node otherwise runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Callable, Mapping

from policy_agent.cluster.peer_nodes import node_address
from policy_agent.config.loader import AgentConfig

log = logging.getLogger(__name__)

HOST_PREFIX = 32  # the Node gives an address, not its subnet: the host's own routes reach the peers

ReadNode = Callable[[], Mapping[str, Any] | None]  # this node's Node object, None: no such Node


def wanted(config: AgentConfig) -> bool:
    """Whether the node address comes from the Node: Kubernetes mode, the host's OVS, none configured."""
    return config.kubernetes.enabled and config.ovs.mode == "external" and not config.cluster.node_address


def with_node_address(config: AgentConfig, node: Mapping[str, Any] | None, why: str = ""
                      ) -> tuple[AgentConfig, str | None]:
    """`config` with cluster.node_address from `node` (None: not read, `why`), and the warning to log when
    there is none to take (the config then stays one node)."""
    name = config.node
    if node is None:
        return config, (f"cluster: Node {name} could not be read ({why or 'no such Node'}): cluster.node_address "
                        "is not configured, so this node has no tunnel to the other nodes' Pods until the agent "
                        "restarts and reads it")
    ip = node_address(node)
    if ip is None:
        return config, (f"cluster: Node {name} has no IPv4 InternalIP or ExternalIP in status.addresses: "
                        "cluster.node_address is not configured, so this node has no tunnel to the other "
                        "nodes' Pods until the agent restarts with one")
    cluster = dataclasses.replace(config.cluster, node_address=f"{ip}/{HOST_PREFIX}")
    return dataclasses.replace(config, cluster=cluster), None


def list_own_node(api: Any, node_name: str, timeout: float) -> Mapping[str, Any] | None:
    """One list of the Node named `node_name` (blocking); None when there is none."""
    from kubernetes import client

    resp: Any = client.CoreV1Api(api).list_node(field_selector=f"metadata.name={node_name}", _preload_content=False,
                                                _request_timeout=timeout)
    try:
        body = json.loads(resp.data)
    finally:
        resp.release_conn()
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise ValueError("list nodes: not a Kubernetes list object")
    return next((i for i in items if isinstance(i, dict)), None)


def resolve(config: AgentConfig, read: ReadNode, *, deadline: float, retry: float = 1.0,
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
            ) -> AgentConfig:
    """The config the agent runs with (blocking): cluster.node_address from the Node when `wanted`, `read`
    tried until it answers or `deadline` (on `clock`) passes."""
    if not wanted(config):
        return config
    why = ""
    while True:
        try:
            node = read()
            break
        except Exception as exc:  # of any kind from the client: the API may come up later; said at the end
            why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if clock() + retry > deadline:
                node = None
                break
            sleep(retry)
    resolved, warning = with_node_address(config, node, why)
    if warning is not None:
        log.warning("%s", warning)
    else:
        log.info("cluster: node address %s from Node %s status.addresses (cluster.node_address not configured)",
                 resolved.cluster.node_address, config.node)
    return resolved


def from_api(config: AgentConfig) -> AgentConfig:
    """`resolve` against the Kubernetes API the config names (blocking; the client closed after)."""
    if not wanted(config):
        return config
    from policy_agent.sources.kubernetes import api_client_from_config

    kc = config.kubernetes
    api = api_client_from_config(kc.kubeconfig or None)
    try:
        return resolve(config, lambda: list_own_node(api, config.node, min(10.0, kc.sync_timeout)),
                       deadline=time.monotonic() + kc.sync_timeout)
    finally:
        api.close()
