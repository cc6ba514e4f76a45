"""The node gateway: an OVS internal port on the bridge holding the Pod subnet's gateway address.

It is the host side of every Pod's default route (Antrea's antrea-gw0). What it should be is a
pure plan (`plan`, `masquerade_steps`); `NodeGateway` is the one adapter that makes it so, in the
switch's network namespace (the embedded OVS's, else the agent's own): the port, its address (the
Pod subnet's route comes with it), IPv4 forwarding, and a MASQUERADE rule for Pod traffic leaving
for addresses outside the subnet. Nothing is ever done in another namespace.
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
import time
from dataclasses import dataclass
from typing import Sequence

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from meters.netns import call_in_netns
from policy_agent.config.node import NodeNetworkConfig
from policy_agent.config.ovs import OvsConfig
from policy_agent.errors import OvsError
from policy_agent.ovs.bridge import Ovsdb
from policy_agent.ovs.tables import mac_for_ip

log = logging.getLogger(__name__)

MASQ_CHAIN = "NPAUDIT-MASQ"  # our own nat chain, jumped to from POSTROUTING


@dataclass(frozen=True)
class GatewayPlan:
    """What the gateway port is: its name and OpenFlow number, address, subnet and MAC."""

    port: str
    ofport: int
    ip: str
    subnet: str  # the Pod subnet, CIDR
    mac: str
    masquerade: bool = True

    @property
    def address(self) -> str:
        """The gateway address with the subnet's prefix length, as put on the interface."""
        return f"{self.ip}/{ipaddress.IPv4Network(self.subnet).prefixlen}"

    def routes_to(self, ip: str) -> bool:
        """True when a Pod's packet to `ip` leaves through the gateway: the gateway address itself
        or any address outside the Pod subnet (an unassigned address inside it goes nowhere)."""
        addr = ipaddress.IPv4Address(ip)
        return str(addr) == self.ip or addr not in ipaddress.IPv4Network(self.subnet)

    def describe(self) -> str:
        return f"the node gateway {self.port} ({self.ip}, port {self.ofport})"


def plan(node: NodeNetworkConfig) -> GatewayPlan | None:
    """The gateway `node` asks for; None without a Pod subnet."""
    if not node.pod_cidr:
        return None
    ip = node.gateway_ip
    # The MAC is a function of the address, so it survives a vswitchd restart (which remakes the
    # interface) and the Pods' ARP caches stay right.
    return GatewayPlan(port=node.gateway_port, ofport=node.gateway_ofport, ip=ip, subnet=node.pod_cidr,
                       mac=mac_for_ip(ip), masquerade=node.masquerade)


def masquerade_steps(gw: GatewayPlan, current: Sequence[str], exclude: Sequence[str] = ()) -> list[list[str]]:
    """The iptables arguments that turn the nat table `current` (`iptables -t nat -S` lines) into
    ours: chain MASQ_CHAIN with one rule SNATing Pod traffic to non-Pod addresses (none when
    masquerade is off), jumped to from POSTROUTING. Traffic to the subnets in `exclude` (the other
    nodes' Pods, routed mode) returns first: it keeps the Pod's address, as policy on the other node
    needs. Empty when it is so already."""
    subnet = gw.subnet
    rule = ["-s", subnet, "!", "-d", subnet, "-j", "MASQUERADE"]
    keep = [["-d", cidr, "-j", "RETURN"] for cidr in exclude] if gw.masquerade else []
    rules = [*keep, rule] if gw.masquerade else []
    want = [f"-A {MASQ_CHAIN} {' '.join(r)}" for r in rules]
    have = [line for line in current if line.startswith(f"-A {MASQ_CHAIN} ")]
    steps: list[list[str]] = []
    if f"-N {MASQ_CHAIN}" not in current:
        steps.append(["-N", MASQ_CHAIN])
    if have != want:
        if have:
            steps.append(["-F", MASQ_CHAIN])
        steps += [["-A", MASQ_CHAIN, *r] for r in rules]
    if f"-A POSTROUTING -j {MASQ_CHAIN}" not in current:
        steps.append(["-A", "POSTROUTING", "-j", MASQ_CHAIN])
    return [["-t", "nat", *step] for step in steps]


class NodeGateway:
    """Makes `gw` so on `bridge`, whose vswitchd runs in `netns` ("" = the agent's namespace)."""

    def __init__(self, gw: GatewayPlan, bridge: str, netns: str) -> None:
        self.plan = gw
        self._bridge = bridge
        self._netns = netns
        self._exclude: tuple[str, ...] = ()  # subnets never masqueraded (other nodes' Pods)

    @classmethod
    def of(cls, node: NodeNetworkConfig, ovs: OvsConfig) -> "NodeGateway | None":
        """The gateway `node` asks for on `ovs`'s bridge; None without a Pod subnet."""
        gw = plan(node)
        if gw is None:
            return None
        return cls(gw, ovs.bridge, ovs.netns if ovs.mode == "embedded" else "")

    def ensure(self, ovsdb: Ovsdb, timeout: float = 10.0) -> None:
        """Idempotent; at start and after an OVS restart (the interface and its address are checked again)."""
        gw = self.plan
        got = ovsdb.ensure_internal_port(self._bridge, gw.port, gw.ofport, gw.mac, timeout)
        if got != gw.ofport:
            raise OvsError(f"gateway port {gw.port} on {self._bridge} got OpenFlow port {got}, not {gw.ofport} "
                           "(node_network.gateway_ofport): another port has that number")
        call_in_netns(self._netns or None, lambda: self._address(timeout))
        self._run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        self._masquerade()
        log.info("gateway %s on %s: %s (port %d, MAC %s), Pod subnet %s%s", gw.port, self._bridge, gw.address,
                 gw.ofport, gw.mac, gw.subnet, ", masqueraded beyond it" if gw.masquerade else "")

    def exclude_from_masquerade(self, cidrs: Sequence[str]) -> None:
        """Never SNAT Pod traffic to `cidrs` (the routed peers' Pod subnets) from now on."""
        self._exclude = tuple(sorted(set(cidrs)))
        self._masquerade()

    def _masquerade(self) -> None:
        current = self._run(["iptables", "-w", "5", "-t", "nat", "-S"]).splitlines()
        for step in masquerade_steps(self.plan, current, self._exclude):
            self._run(["iptables", "-w", "5", *step])

    def _address(self, timeout: float) -> None:
        """In the switch's namespace: the interface (vswitchd makes it) up with the gateway address."""
        gw = self.plan
        deadline = time.monotonic() + timeout
        with IPRoute() as ipr:
            while not (found := ipr.link_lookup(ifname=gw.port)):
                if time.monotonic() > deadline:
                    raise OvsError(f"gateway interface {gw.port} did not appear within {timeout}s")
                time.sleep(0.02)
            index = found[0]
            ipr.link("set", index=index, state="up")
            have = {(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.addr("dump", index=index)}
            ip, prefix = gw.address.split("/")
            if (ip, int(prefix)) not in have:
                try:
                    ipr.addr("add", index=index, address=ip, prefixlen=int(prefix))
                except NetlinkError as exc:
                    raise OvsError(f"gateway {gw.port}: cannot add {gw.address}: {exc}") from exc

    def _run(self, cmd: list[str]) -> str:
        return run_in_netns(self._netns, cmd, f"gateway {self.plan.port}")


def run_in_netns(netns: str, cmd: list[str], who: str) -> str:
    """`cmd`'s output, run in `netns` ("" = the agent's own); OvsError naming `who` when it cannot run or fails."""
    argv = ["ip", "netns", "exec", netns, *cmd] if netns else cmd
    try:
        out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise OvsError(f"{who}: {cmd[0]} not found (make setup installs it)") from exc
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        err = getattr(exc, "stderr", "") or ""
        raise OvsError(f"{who}: {' '.join(cmd)} failed: {err.strip() or exc}") from exc
    return out.stdout
