"""The node's side of the underlay: what carries Pod traffic to the other nodes, and the one adapter that makes it so.

Geneve on the userspace (netdev) datapath, the embedded OVS's and an external one's alike: the
userspace datapath sends tunnel packets itself, so the node's underlay address sits on an OVS bridge
of its own (cluster.underlay_bridge, br-phy) whose port is the underlay interface; OVS learns the
route to the other nodes from that address, and the tunnel port on br-int (type geneve,
remote_ip=flow, key=flow) sends to whichever node a flow names in tun_dst (OVS's system-userspace
tunnel tests use the same recipe; its tunnel neighbour cache is kept filled by
ovs/tunnel_neighbours.py). The agent makes br-phy when cluster.underlay_interface is set;
an external netdev OVS without it must have its own (the admin's), which start-up warns of.
Tested: the embedded OVS (tests/e2e/test_tunnel_e2e.py) and an external userspace OVS the test
runs itself (tests/e2e/test_tunnel_external_ovs_e2e.py).
Geneve on the kernel (system) datapath, an external OVS: the tunnel port, and the node address
on underlay_interface in the kernel when that is set; the host's routes carry it. Not tested: this
project's machines have no openvswitch kernel module.
Routed: no tunnel port; the underlay interface keeps node_address in the kernel and each peer's
Pod subnet is routed to the peer's address (`route_steps`), IPv4 forwarding on.

What it should be is pure (`plan`, `route_steps`); `NodeUnderlay` does it, only in the switch's
network namespace (the embedded OVS's, else the agent's own).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from meters.netns import call_in_netns
from policy_agent.config.cluster import ClusterConfig
from policy_agent.config.node import NodeNetworkConfig
from policy_agent.config.ovs import OvsConfig
from policy_agent.errors import OvsError
from policy_agent.ovs.bridge import Ovsdb
from policy_agent.ovs.coverage import vswitchd_ctl_path
from policy_agent.ovs.gateway import run_in_netns
from policy_agent.ovs.tunnel_neighbours import TunnelNeighbours

log = logging.getLogger(__name__)

ROUTE_PROTO = 77  # the rtnetlink protocol number marking the kernel routes to peers that are ours


@dataclass(frozen=True)
class TunnelPlan:
    """How this node reaches the others."""

    encapsulation: str  # geneve | routed
    node_address: str  # ours on the underlay, with its prefix (198.51.100.11/24)
    pod_cidr: str  # this node's Pod subnet
    tunnel_port: str
    tunnel_ofport: int
    underlay_interface: str  # "" = the host's (external OVS)
    underlay_bridge: str
    embedded: bool
    deny_unknown_sources: bool = False  # only sources the Pod directory holds are taken from other nodes
    gateway_ofport: int = 2  # routed: where other nodes' Pod traffic comes in (node_network.gateway_ofport)

    @property
    def geneve(self) -> bool:
        return self.encapsulation == "geneve"

    @property
    def node_ip(self) -> str:
        return self.node_address.split("/")[0]

    @property
    def on_ovs_bridge(self) -> bool:
        """The underlay address on an OVS bridge (the userspace datapath's tunnel recipe) whatever the
        datapath: the embedded OVS always gets it."""
        return self.geneve and self.embedded and bool(self.underlay_interface)

    def underlay_on_ovs_bridge(self, datapath_type: str) -> bool:
        """The recipe on a switch of `datapath_type`: embedded always, external on netdev (its userspace
        datapath cannot send a tunnel packet through an address the kernel holds)."""
        return self.on_ovs_bridge or (self.geneve and bool(self.underlay_interface) and datapath_type == "netdev")

    def describe(self) -> str:
        if self.geneve:
            return f"Geneve port {self.tunnel_port} (port {self.tunnel_ofport}) from {self.node_ip}"
        return f"routed from {self.node_ip}"


def plan(cluster: ClusterConfig, node: NodeNetworkConfig, ovs: OvsConfig) -> TunnelPlan | None:
    """The underlay `cluster` asks for; None for one node (no node_address)."""
    if not cluster.enabled:
        return None
    return TunnelPlan(encapsulation=cluster.encapsulation, node_address=cluster.node_address,
                      pod_cidr=node.pod_cidr, tunnel_port=cluster.tunnel_port, tunnel_ofport=cluster.tunnel_ofport,
                      underlay_interface=cluster.underlay_interface, underlay_bridge=cluster.underlay_bridge,
                      embedded=ovs.mode == "embedded", deny_unknown_sources=cluster.deny_unknown_sources,
                      gateway_ofport=node.gateway_ofport)


def route_steps(current: Sequence[str], routes: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The `ip route` arguments that turn our routes `current` (`ip -4 route show proto ROUTE_PROTO`
    lines, "10.246.2.0/24 via 198.51.100.2 dev eth1 ...") into `routes`: (a peer's Pod subnet, its address)."""
    have: dict[str, str] = {}
    for line in current:
        words = line.split()
        if len(words) >= 3 and words[1] == "via":
            have[words[0]] = words[2]
    want = {str(ipaddress.IPv4Network(cidr)): via for cidr, via in routes}
    steps = [["replace", dst, "via", via, "proto", str(ROUTE_PROTO)]
             for dst, via in sorted(want.items()) if have.get(dst) != via]
    steps += [["del", dst, "proto", str(ROUTE_PROTO)] for dst in sorted(have) if dst not in want]
    return steps


class NodeUnderlay:
    """Makes `tunnel` so on `bridge` (br-int), whose vswitchd runs in `netns` ("" = the agent's namespace)."""

    def __init__(self, tunnel: TunnelPlan, bridge: str, netns: str, neighbours: TunnelNeighbours | None = None
                 ) -> None:
        self.plan = tunnel
        self._bridge = bridge
        self._netns = netns
        self._neighbours = neighbours  # None: next hops left to OVS (tests without a switch)
        self._userspace_tunnel = False  # Geneve on the netdev datapath: its own neighbour cache (ensure says)
        self._on_bridge = False  # node_address on underlay_bridge, made by the agent (ensure says)
        self._kept: set[str] = set()  # peer addresses whose next hops are kept resolved
        self._kept_lock = threading.Lock()  # the routes' thread and an OVS restart's (ensure) both use it

    @classmethod
    def of(cls, cluster: ClusterConfig, node: NodeNetworkConfig, ovs: OvsConfig) -> "NodeUnderlay | None":
        tunnel = plan(cluster, node, ovs)
        if tunnel is None:
            return None
        netns = ovs.netns if ovs.mode == "embedded" else ""
        rundir = ovs.ovs_rundir
        return cls(tunnel, ovs.bridge, netns, TunnelNeighbours(lambda: vswitchd_ctl_path(rundir), netns))

    @property
    def resolves_next_hops(self) -> bool:
        """Whether the agent resolves peers' next hops for OVS (Geneve on the userspace datapath); elsewhere
        the kernel resolves them and holds a packet meanwhile."""
        return self._userspace_tunnel and self._neighbours is not None

    def resolve_peers(self, add: Sequence[str], drop: Sequence[str] = (),
                      on_set: Callable[[str], None] = lambda address: None) -> dict[str, str]:
        """The next hops of the peer addresses `add` resolved and set in OVS's tunnel neighbour cache
        (ovs/tunnel_neighbours.py) and kept so (`refresh_peers`, an OVS restart); `drop` no longer kept.
        `on_set(address)` as each is set. {address: why not resolved}; {} where the agent does not resolve
        (`resolves_next_hops`)."""
        with self._kept_lock:
            self._kept.difference_update(drop)
            self._kept.update(add)
        if not self.resolves_next_hops or not add or self._neighbours is None:
            return {}
        return self._neighbours.resolve(sorted(set(add)), on_set)

    def refresh_peers(self) -> dict[str, str]:
        """This node announced again, and every kept peer's next hop resolved and set again (its entry's
        aging starts over)."""
        self.announce()
        return self.resolve_peers(self._kept_now())

    def _kept_now(self) -> list[str]:
        with self._kept_lock:
            return sorted(self._kept)

    def announce(self) -> None:
        """Our node address announced on the underlay bridge (a gratuitous ARP) where the agent made it."""
        if self.resolves_next_hops and self._neighbours is not None and self._on_bridge:
            self._neighbours.announce(self.plan.underlay_bridge, self.plan.node_ip)

    def neighbour_aging(self) -> int | None:
        """OVS's tnl/neigh/aging in seconds; None where the agent does not resolve or OVS did not say."""
        if not self.resolves_next_hops or self._neighbours is None:
            return None
        try:
            return self._neighbours.aging()
        except (OvsError, ValueError):
            return None

    def ensure(self, ovsdb: Ovsdb, datapath_type: str, timeout: float = 10.0) -> None:
        """Idempotent; at start and after an OVS restart (interfaces and addresses checked again)."""
        p = self.plan
        if p.geneve:
            if p.underlay_on_ovs_bridge(datapath_type):
                self._ovs_underlay(ovsdb, datapath_type)
                call_in_netns(self._netns or None, lambda: self._address(p.underlay_bridge, timeout, True))
                # The port's kernel side must not answer ARP for node_address too (Linux answers for any of its
                # addresses on any interface): a peer taking that answer's MAC sends its tunnel packets where
                # OVS never ends the tunnel, and which of the two answers it keeps is a race.
                self._run(["sysctl", "-qw", f"net/ipv4/conf/{p.underlay_interface}/arp_ignore=1"])
            elif p.underlay_interface:
                call_in_netns(self._netns or None, lambda: self._address(p.underlay_interface, timeout, False))
            self._tunnel_port(ovsdb, timeout)
            if not p.embedded and not p.underlay_interface:
                if datapath_type == "netdev":
                    log.warning("tunnel %s on the userspace (netdev) datapath without cluster.underlay_interface: "
                                "%s must be on an OVS bridge port of this OVS (br-phy, made by its admin), or "
                                "no tunnel packet leaves the node", p.tunnel_port, p.node_address)
                else:
                    log.info("tunnel %s: the host's addresses and routes carry it (kernel datapath; "
                             "not tested on this project's machines)", p.tunnel_port)
        else:
            if p.underlay_interface:
                call_in_netns(self._netns or None, lambda: self._address(p.underlay_interface, timeout, False))
            self._run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        log.info("underlay: %s", p.describe())
        self._userspace_tunnel = p.geneve and datapath_type == "netdev"
        self._on_bridge = p.underlay_on_ovs_bridge(datapath_type)
        self.announce()
        if kept := self._kept_now():  # after an OVS restart: its tunnel neighbour cache went with it
            for address, why in sorted(self.resolve_peers(kept).items()):
                log.warning("cluster: the next hop to peer address %s is not resolved after the OVS restart "
                            "(%s): the first packet towards it may be lost", address, why)

    def set_routes(self, routes: Sequence[tuple[str, str]]) -> None:
        """Routed mode: the kernel routes each (Pod subnet, peer address) of `routes`, and no others of ours."""
        if self.plan.geneve:
            return
        current = self._run(["ip", "-4", "route", "show", "proto", str(ROUTE_PROTO)]).splitlines()
        for step in route_steps(current, routes):
            try:
                self._run(["ip", "-4", "route", *step])
            except OvsError as exc:  # one peer's route (an unreachable gateway): the others still go in
                log.warning("cluster: %s", exc)

    def unreachable(self, address: str) -> str | None:
        """Why the node cannot reach `address` on the underlay (no route to it), or None."""
        try:
            self._run(["ip", "-4", "route", "get", address])
        except OvsError as exc:
            return str(exc).split(" failed: ", 1)[-1]
        return None

    def _ovs_underlay(self, ovsdb: Ovsdb, datapath_type: str) -> None:
        p, api = self.plan, ovsdb.api
        try:
            with api.transaction(check_error=True) as txn:
                # No controller and no fail_mode: OVS switches it as a learning switch (NORMAL).
                txn.add(api.add_br(p.underlay_bridge, may_exist=True, datapath_type=datapath_type))
                txn.add(api.add_port(p.underlay_bridge, p.underlay_interface, may_exist=True))
        except Exception as exc:
            raise OvsError(f"OVSDB {ovsdb.remote}: underlay bridge {p.underlay_bridge} with "
                           f"{p.underlay_interface} failed: {exc}") from exc

    def _tunnel_port(self, ovsdb: Ovsdb, timeout: float) -> None:
        p, api = self.plan, ovsdb.api
        try:
            with api.transaction(check_error=True) as txn:
                txn.add(api.add_port(self._bridge, p.tunnel_port, may_exist=True))
                txn.add(api.db_set("Interface", p.tunnel_port, ("type", "geneve"),
                                   ("options", {"remote_ip": "flow", "key": "flow"}),
                                   ("ofport_request", p.tunnel_ofport)))
        except Exception as exc:
            raise OvsError(f"OVSDB {ovsdb.remote}: tunnel port {p.tunnel_port} on {self._bridge} "
                           f"failed: {exc}") from exc
        got = ovsdb.add_port(self._bridge, p.tunnel_port, p.tunnel_ofport, timeout)
        if got != p.tunnel_ofport:
            raise OvsError(f"tunnel port {p.tunnel_port} on {self._bridge} got OpenFlow port {got}, not "
                           f"{p.tunnel_ofport} (cluster.tunnel_ofport): another port has that number")

    def _address(self, ifname: str, timeout: float, bridged: bool) -> None:
        """In the switch's namespace: `ifname` up with the node address."""
        deadline = time.monotonic() + timeout
        ip, prefix = self.plan.node_address.split("/")
        with IPRoute() as ipr:
            while not (found := ipr.link_lookup(ifname=ifname)):
                if time.monotonic() > deadline:
                    raise OvsError(f"underlay interface {ifname} did not appear within {timeout}s")
                time.sleep(0.02)
            index = found[0]
            ipr.link("set", index=index, state="up")
            have = {(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.addr("dump", index=index)}
            if (ip, int(prefix)) not in have:
                try:
                    ipr.addr("add", index=index, address=ip, prefixlen=int(prefix))
                except NetlinkError as exc:
                    raise OvsError(f"underlay {ifname}: cannot add {self.plan.node_address}: {exc}") from exc
        if bridged:  # the underlay port itself carries no address, only frames
            with IPRoute() as ipr:
                for index in ipr.link_lookup(ifname=self.plan.underlay_interface):
                    ipr.link("set", index=index, state="up")

    def _run(self, cmd: list[str]) -> str:
        return run_in_netns(self._netns, cmd, "underlay")
