"""What of a Pod object the agent keeps: all of a cluster's Pods are watched, so each is cut to the fields
policy reads (name, namespace, labels, node, container ports, addresses) as it arrives."""

from __future__ import annotations

import sys
from typing import Any

# A Pod in one of these phases has released its address (another Pod may hold it now).
TERMINAL_PHASES = ("Succeeded", "Failed")


def pod_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields the Pod loader reads (policy/manifests.py), with no addresses for a host-network Pod
    (it holds its node's address, never a Pod address: policy does not select it by address, as in
    Antrea) or a Pod that has ended (its address may be another Pod's already)."""
    out: dict[str, Any] = {k: doc[k] for k in ("apiVersion", "kind") if k in doc}
    meta = doc.get("metadata")
    if isinstance(meta, dict):
        # deletionTimestamp: a Pod being deleted is named by its address no more (cluster/pod_directory.py).
        out["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels", "resourceVersion", "deletionTimestamp")
                           if k in meta}
        _intern(out["metadata"], "namespace")
        labels = meta.get("labels")
        if isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            # Label keys and values repeat across a cluster's Pods: one copy of each.
            out["metadata"]["labels"] = {sys.intern(k): sys.intern(v) for k, v in labels.items()}
    elif meta is not None:
        out["metadata"] = meta  # not a mapping: the loader says so
    spec = doc.get("spec")
    host_network = False
    if isinstance(spec, dict):
        host_network = spec.get("hostNetwork") is True
        kept: dict[str, Any] = {k: spec[k] for k in ("nodeName",) if k in spec}
        _intern(kept, "nodeName")
        containers = spec.get("containers")
        if isinstance(containers, list):
            kept["containers"] = [{"ports": c["ports"]} if isinstance(c, dict) and "ports" in c else
                                  ({} if isinstance(c, dict) else c) for c in containers]
        elif containers is not None:
            kept["containers"] = containers
        out["spec"] = kept
    elif spec is not None:
        out["spec"] = spec
    status = doc.get("status")
    if isinstance(status, dict):
        ended = status.get("phase") in TERMINAL_PHASES
        out["status"] = {} if host_network or ended else \
            {k: status[k] for k in ("podIP", "podIPs") if k in status}
    elif status is not None:
        out["status"] = status
    return out


def _intern(d: dict[str, Any], key: str) -> None:
    if isinstance(d.get(key), str):
        d[key] = sys.intern(d[key])
