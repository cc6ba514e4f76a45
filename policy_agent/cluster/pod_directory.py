"""The cluster Pod directory: address -> (namespace, name) of the Pod holding it, on any node.

Built whole from one state of the engine and swapped in at once (engine._swap), so a
reader sees the mapping of one state or the next, never a mix. This node's running Pods
(their CNI endpoints) are authoritative for their addresses; other Pods are known by the
addresses their objects carry (status.podIP(s), on another node or not started here yet).
An address no Pod holds is unknown (None). An address two Pods claim at once (a deleted
Pod's address reused before the deletion arrived) is unknown too: a record names no Pod
rather than maybe the wrong one.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from policy_agent.policy.model import Pod
from policy_agent.policy.selection import Endpoint, RemotePod

PodKey = tuple[str, str]


def _remote(endpoints: Iterable[Endpoint], pods: Iterable[Pod]) -> tuple[dict[str, PodKey], dict[str, Pod]]:
    """(address -> key of the local endpoints, address -> the one Pod object not running here that claims it)."""
    local = {ep.ip: ep.pod.key for ep in endpoints}
    claims: dict[str, list[Pod]] = {}
    running = set(local.values())
    for pod in pods:
        if pod.key in running:
            continue  # its interface here says where it is
        for ip in pod.ips:
            if ip not in local:
                claims.setdefault(ip, []).append(pod)
    return local, {ip: found[0] for ip, found in claims.items() if len(found) == 1}


def pod_directory(endpoints: Iterable[Endpoint], pods: Iterable[Pod]) -> dict[str, PodKey]:
    """The address map of one state: local endpoints first, then the addresses of Pod objects."""
    local, remote = _remote(endpoints, pods)
    out = {ip: pod.key for ip, pod in remote.items()}
    out.update(local)
    return out


def with_remote(endpoints: Iterable[Endpoint], pods: Iterable[Pod]) -> tuple[Endpoint, ...]:
    """This node's endpoints and, for the compiler, one per address a Pod not running here holds
    alone (a RemotePod with no port: rules match it as a peer by address, never apply to it)."""
    endpoints = tuple(endpoints)
    _, remote = _remote(endpoints, pods)
    if not remote:
        return endpoints
    seen: set[PodKey] = set()
    out = list(endpoints)
    for ip, pod in sorted(remote.items()):
        if pod.key not in seen:  # a Pod of several addresses: its first (policy is IPv4, one per Pod)
            seen.add(pod.key)
            out.append(Endpoint(RemotePod(**{f.name: getattr(pod, f.name) for f in dataclasses.fields(pod)}),
                                ip, "", 0))
    return tuple(out)
