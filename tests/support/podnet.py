"""Pod-like network namespaces on veth pairs attached to the bridge, for tests and benches.

Real Pods come through the CNI path (policy_agent/cni/); this wires a namespace
straight onto the bridge with no policy involved, which is what the packet-in
tests and the throughput bench want. Everything it creates is named by the
caller and removed by that name.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from policy_agent.ovs.embedded import netns_exists
from policy_agent.ovs.bridge import Ovsdb


def ip(*args: str, netns: str = "") -> None:
    cmd = ["ip", "-n", netns, *args] if netns else ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class PodNet:
    """One Pod-like namespace: `eth0` inside, `host_if` on the bridge (in the OVS namespace)."""

    netns: str
    host_if: str
    ip_cidr: str
    mac: str
    ofport: int

    @property
    def ip(self) -> str:
        return self.ip_cidr.split("/")[0]


def create_pod(db: Ovsdb, bridge: str, *, netns: str, host_if: str, ip_cidr: str, mac: str,
               ofport: int, ovs_netns: str = "") -> PodNet:
    """Create namespace + veth, move the host end next to vswitchd, attach it to the bridge."""
    if not netns_exists(netns):
        subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns)
    if ovs_netns:
        ip("link", "set", host_if, "netns", ovs_netns)
    ip("link", "set", host_if, "up", netns=ovs_netns)
    ip("link", "set", "lo", "up", netns=netns)
    ip("link", "set", "eth0", "address", mac, netns=netns)
    ip("addr", "add", ip_cidr, "dev", "eth0", netns=netns)
    ip("link", "set", "eth0", "up", netns=netns)
    # No offloads: the userspace datapath reads whole frames from AF_PACKET.
    subprocess.run(["ip", "netns", "exec", netns, "ethtool", "-K", "eth0", "tx", "off"],
                   capture_output=True)
    got = db.add_port(bridge, host_if, ofport=ofport)
    return PodNet(netns=netns, host_if=host_if, ip_cidr=ip_cidr, mac=mac, ofport=got)


def set_neighbor(pod: PodNet, peer: PodNet) -> None:
    """Static neighbour entry so IP traffic flows without an ARP exchange."""
    ip("neigh", "replace", peer.ip, "lladdr", peer.mac, "dev", "eth0", netns=pod.netns)


def delete_pod(db: Ovsdb | None, bridge: str, pod: PodNet, ovs_netns: str = "") -> None:
    if db is not None:
        db.del_port(bridge, pod.host_if)
    subprocess.run(["ip", "-n", ovs_netns, "link", "del", pod.host_if] if ovs_netns
                   else ["ip", "link", "del", pod.host_if], capture_output=True)
    if netns_exists(pod.netns):
        subprocess.run(["ip", "netns", "delete", pod.netns], capture_output=True)
