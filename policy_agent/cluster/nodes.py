"""The other nodes of the cluster as the datapath needs them: name, Pod subnet, underlay address.

One shape for every source of them (config peers standalone, Node objects in Kubernetes mode):
the source hands the whole current set to a `PeerSink` (the tunnel's node routes), which
replaces what it had from that source at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True, order=True)
class PeerNode:
    """Another node: Pods in `pod_cidr` (IPv4 CIDR) are reached through `address` (its underlay IPv4)."""

    name: str
    pod_cidr: str
    address: str


class PeerSink(Protocol):
    """What takes the current set of other nodes from one source (`source` names it in logs)."""

    def set_peers(self, source: str, peers: Sequence[PeerNode]) -> None: ...
