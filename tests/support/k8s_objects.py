"""Kubernetes objects as the API server lists them (Nodes, Pods, Namespaces) and a kubeconfig for the
fake API server, for tests and benches that run the agent in Kubernetes mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def node(name: str, pod_cidr: str | None = None, internal_ip: str | None = None, rv: str = "5") -> dict[str, Any]:
    """A Node with an optional spec.podCIDR(s) and InternalIP, and the conditions a kubelet reports."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": rv},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]} if pod_cidr else {},
            "status": {"addresses": ([{"type": "InternalIP", "address": internal_ip}] if internal_ip else []) +
                       [{"type": "Hostname", "address": name}],
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def namespace(name: str, rv: str = "3") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "resourceVersion": rv, "labels": {"kubernetes.io/metadata.name": name}}}


def pod(namespace: str, name: str, node: str, ip: str | None = None, labels: dict[str, str] | None = None,
        rv: str = "7") -> dict[str, Any]:
    """A Pod as the API server has it: running on `node` with address `ip` (None: not assigned yet)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv, "labels": labels or {},
                         "uid": f"uid-{namespace}-{name}", "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/app:1",
                                                        "ports": [{"name": "http", "containerPort": 80}]}]},
            "status": {"phase": "Running", "hostIP": "192.0.2.10",
                       **({"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {})}}


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig for `server_url` (the fake API server on loopback, no credentials)."""
    path.write_text(f"apiVersion: v1\nkind: Config\n"
                    f"clusters: [{{name: fake, cluster: {{server: '{server_url}'}}}}]\n"
                    f"users: [{{name: fake, user: {{}}}}]\n"
                    f"contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\n"
                    f"current-context: fake\n")
    return path
