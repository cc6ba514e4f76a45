"""The cluster Pod directory: address -> (namespace, name) of the Pod holding it, on any node.

Kept per state of the engine (a `RemoteDirectory` in each of its states) and swapped in with
it at once (engine._swap), so a reader sees the mapping of one state or the next, never a mix.
This node's running Pods (their CNI endpoints) are authoritative for their addresses; other
Pods are known by the addresses their objects carry (status.podIP(s), on another node or not
started here yet). An address no Pod holds is unknown (None). An address two Pods claim at once
(a deleted Pod's address reused before the deletion arrived) is unknown too: a record names no
Pod rather than maybe the wrong one. So is an address only a Pod being deleted claims
(metadata.deletionTimestamp): its node gives the address back at CNI DEL, before the object goes,
and a new Pod there may hold it before its own object says so. Rules still match a Pod being deleted
by its address (`remote`) until its object goes: only the name is withheld.

A change of a few Pods costs what those Pods (and the Pods sharing their addresses) cost, not
what every known Pod does: `RemoteDirectory.update` copies the previous state's maps (never
changes them: a refused change leaves the previous state whole) and redoes only the addresses
the changed Pods held or hold; the compiler's endpoint of every other remote Pod stays the same
object, so the incremental compiler sees at once that it did not change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from policy_agent.policy.model import Pod
from policy_agent.policy.selection import Endpoint, RemotePod

PodKey = tuple[str, str]


def _remote_endpoint(pod: Pod, ip: str) -> Endpoint:
    """The compiler's endpoint of a Pod not running here: no port, rules match it by address."""
    return Endpoint(RemotePod(**{f.name: getattr(pod, f.name) for f in dataclasses.fields(pod)}), ip, "", 0)


@dataclass(frozen=True)
class RemoteDirectory:
    """The addresses of one state: built from its running Pods' endpoints and its Pod objects.
    Never changed once built (`update` returns a new one)."""

    local: dict[str, PodKey] = field(default_factory=dict)  # address -> the local endpoint's Pod
    claims: dict[str, dict[PodKey, Pod]] = field(default_factory=dict)  # address -> Pods not running here
    by_ip: dict[str, PodKey] = field(default_factory=dict)  # the directory: address -> its one holder
    remote: dict[PodKey, Endpoint] = field(default_factory=dict)  # a Pod not running here -> its endpoint
    pods: Mapping[PodKey, Pod] = field(default_factory=dict)  # what it was built from
    endpoints: Mapping[PodKey, Endpoint] = field(default_factory=dict)
    by_key: dict[PodKey, Endpoint] = field(default_factory=dict)  # the compiler's endpoints: local and remote
    touched: frozenset[PodKey] = frozenset()  # the Pods whose object or entry in `by_key` may differ from...
    base: dict[PodKey, Endpoint] | None = None  # ...those of the directory this one was updated from (its by_key)

    @staticmethod
    def build(endpoints: Mapping[PodKey, Endpoint], pods: Mapping[PodKey, Pod]) -> "RemoteDirectory":
        """From scratch (what `update` must agree with)."""
        return RemoteDirectory().update(endpoints, pods, endpoints.keys() | pods.keys())

    def update(self, endpoints: Mapping[PodKey, Endpoint], pods: Mapping[PodKey, Pod],
               touched: Iterable[PodKey]) -> "RemoteDirectory":
        """The directory of (`endpoints`, `pods`), which differ from this one's inputs at most in the
        Pods `touched` (their object or their endpoint, added, changed or gone)."""
        touched = set(touched)
        if not touched:  # nothing to redo (a policy change): the same maps, for the next state
            return replace(self, pods=pods, endpoints=endpoints, touched=frozenset(), base=self.by_key)
        local, claims = dict(self.local), dict(self.claims)
        addresses: set[str] = set()
        for key in touched:
            for ep, pod, sign in ((self.endpoints.get(key), self.pods.get(key), -1),
                                  (endpoints.get(key), pods.get(key), 1)):
                if ep is not None:  # its interface here says where it is: its object's addresses do not count
                    addresses.add(ep.ip)
                    if sign > 0:
                        local[ep.ip] = key
                    elif local.get(ep.ip) == key:
                        del local[ep.ip]
                elif pod is not None:
                    for ip in pod.ips:
                        addresses.add(ip)
                        held = dict(claims.get(ip, {}))
                        if sign > 0:
                            held[key] = pod
                        else:
                            held.pop(key, None)
                        if held:
                            claims[ip] = held
                        else:
                            claims.pop(ip, None)
        by_ip, remote = dict(self.by_ip), dict(self.remote)
        redo = set(touched)  # Pods whose remote endpoint may differ
        for ip in addresses:
            held = claims.get(ip, {})
            redo.update(held)
            redo.update(self.claims.get(ip, {}))
            alone = next(iter(held.items())) if len(held) == 1 else None
            owner = local.get(ip) or (alone[0] if alone is not None and not alone[1].terminating else None)
            if owner is None:
                by_ip.pop(ip, None)
            else:
                by_ip[ip] = owner
        by_key = dict(self.by_key)
        for key in redo:
            pod = pods.get(key)
            first: str | None = None
            if pod is not None and key not in endpoints:  # a Pod of several addresses: the first it holds alone
                first = min((a for a in pod.ips if a not in local and len(claims.get(a, ())) == 1), default=None)
            if pod is None or first is None:
                remote.pop(key, None)
            else:
                ep = remote.get(key)
                if ep is None or ep.ip != first or self.pods.get(key) is not pod:
                    remote[key] = _remote_endpoint(pod, first)
            entry = endpoints.get(key) or remote.get(key)
            if entry is None:
                by_key.pop(key, None)
            else:
                by_key[key] = entry
        return RemoteDirectory(local, claims, by_ip, remote, pods, endpoints, by_key, frozenset(redo), self.by_key)

    def with_remote(self) -> tuple[Endpoint, ...]:
        """This node's endpoints and, for the compiler, one per Pod not running here that holds an
        address alone (a RemotePod with no port: rules match it as a peer by address, never apply to it)."""
        return tuple(self.by_key.values())


def pod_directory(endpoints: Iterable[Endpoint], pods: Iterable[Pod]) -> dict[str, PodKey]:
    """The address map of one state: local endpoints first, then the addresses of Pod objects."""
    return RemoteDirectory.build({ep.pod.key: ep for ep in endpoints}, {p.key: p for p in pods}).by_ip


def with_remote(endpoints: Iterable[Endpoint], pods: Iterable[Pod]) -> tuple[Endpoint, ...]:
    """This node's endpoints and one endpoint per Pod not running here that holds an address alone."""
    return RemoteDirectory.build({ep.pod.key: ep for ep in endpoints}, {p.key: p for p in pods}).with_remote()
