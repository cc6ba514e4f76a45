"""Each peer's underlay next hop, resolved before a Pod packet needs it and kept in the userspace tunnel's cache.

OVS's userspace tunnel (the netdev datapath) looks the next hop of a tunnel packet up in a neighbour
cache of its own (`tnl/neigh/show`); on a miss it sends an ARP request in the packet's place and drops
the packet: a TCP connect rides that out on its SYN retry, a lone UDP datagram (a DNS query) is lost.
An entry lives `tnl/neigh/aging` seconds (900 by default, 3600 at most) from its last use or setting;
OVS 3.1 has no permanent entry. So, per peer, the agent asks OVS the route its tunnel will take
(`ovs/route/lookup`: the output bridge and a gateway, if any), sends one ARP request for that next hop
out of the bridge's own port in the switch's namespace, and sets the answer with `tnl/neigh/set` (OVS
snoops the same reply; setting it makes it certain). Done when a peer is added, before its flows, and
again every cluster.underlay_refresh seconds (within the aging: the entry never lapses, and a changed
MAC is picked up) and after an OVS restart (the cache goes with the process).

The frame codec and the parsers are pure; `TunnelNeighbours` is the one adapter.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from meters.netns import call_in_netns
from packetin.protocol_numbers import ETH_TYPE_ARP
from policy_agent.errors import OvsError
from policy_agent.ovs import unixctl

log = logging.getLogger(__name__)

ARP_REQUEST, ARP_REPLY = 1, 2
BROADCAST = b"\xff" * 6
_ARP = struct.Struct("!HHBBH6s4s6s4s")  # htype, ptype, hlen, plen, op, sha, spa, tha, tpa


@dataclass(frozen=True)
class NextHop:
    """Where OVS sends a tunnel packet for a peer: out of `bridge`, to `address` (the peer, or the gateway
    towards it), from `source` (our address there)."""

    bridge: str
    address: str
    source: str


def next_hop(peer: str, lookup: str) -> NextHop:
    """The next hop towards `peer` from OVS's `ovs/route/lookup` answer ("src A\\ngateway G\\ndev D");
    ValueError when the answer says none. The route's device is taken as its bridge: OVS's recipe puts the
    node address on the bridge's own port, which has the bridge's name."""
    fields = dict(line.split(None, 1) for line in lookup.splitlines() if len(line.split(None, 1)) == 2)
    if "dev" not in fields or "src" not in fields:
        raise ValueError(f"no route to {peer} in OVS's answer {lookup.strip()!r}")
    gateway = fields.get("gateway", "").strip()
    on_link = gateway in ("", "::", "0.0.0.0")
    via = peer if on_link else gateway.removeprefix("::ffff:")
    return NextHop(fields["dev"].strip(), str(ipaddress.IPv4Address(via)),
                   str(ipaddress.IPv4Address(fields["src"].strip().removeprefix("::ffff:"))))


def arp_request(src_mac: bytes, src_ip: str, target: str) -> bytes:
    """The broadcast Ethernet frame asking who has `target`, from `src_mac` / `src_ip`."""
    body = _ARP.pack(1, 0x0800, 6, 4, ARP_REQUEST, src_mac, ipaddress.IPv4Address(src_ip).packed, b"\0" * 6,
                     ipaddress.IPv4Address(target).packed)
    return BROADCAST + src_mac + struct.pack("!H", ETH_TYPE_ARP) + body


def garp(src_mac: bytes, address: str) -> bytes:
    """The gratuitous ARP announcing `address` at `src_mac` (a request for itself, broadcast): the other
    nodes' OVS take it into their tunnel neighbour caches (they snoop gratuitous ARP)."""
    return arp_request(src_mac, address, address)


def arp_reply(frame: bytes) -> tuple[str, str] | None:
    """(sender address, sender MAC "aa:bb:..") of an Ethernet ARP reply; None for any other frame."""
    if len(frame) < 14 + _ARP.size or struct.unpack_from("!H", frame, 12)[0] != ETH_TYPE_ARP:
        return None
    htype, ptype, hlen, plen, op, sha, spa, _, _ = _ARP.unpack_from(frame, 14)
    if (htype, ptype, hlen, plen, op) != (1, 0x0800, 6, 4, ARP_REPLY) or sha == b"\0" * 6:
        return None
    return str(ipaddress.IPv4Address(spa)), sha.hex(":")


def parse_aging(text: str) -> int:
    """Seconds, from `tnl/neigh/aging` without an argument."""
    return int(text.strip())


def _ask(bridge: str, src_ip: str, targets: Sequence[str], timeout: float,
         answered: Callable[[str, str], None]) -> dict[str, str]:
    """In the switch's namespace: one ARP request per target out of `bridge`'s own port; the MACs of
    those that answered within `timeout`, each also given to `answered(ip, mac)` as it comes (one
    target that never answers holds back none of the others)."""
    want = set(targets)
    got: dict[str, str] = {}
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_TYPE_ARP)) as s:
        s.bind((bridge, ETH_TYPE_ARP))
        mac = s.getsockname()[4]
        for target in sorted(want):
            s.send(arp_request(mac, src_ip, target))
        deadline = time.monotonic() + timeout
        while want - set(got) and (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                frame = s.recv(2048)
            except socket.timeout:
                break
            answer = arp_reply(frame)
            if answer is not None and answer[0] in want and answer[0] not in got:
                got[answer[0]] = answer[1]
                answered(*answer)
    return got


def _announce(bridge: str, address: str) -> None:
    """In the switch's namespace: one gratuitous ARP for `address` out of `bridge`'s own port."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_TYPE_ARP)) as s:
        s.bind((bridge, ETH_TYPE_ARP))
        s.send(garp(s.getsockname()[4], address))


class TunnelNeighbours:
    """Resolves peers' next hops for the OVS whose control socket `ctl()` names, running in `netns`
    ("" = the agent's namespace). Blocking: call it from a thread."""

    def __init__(self, ctl: Callable[[], Path], netns: str, timeout: float = 1.0,
                 call: Callable[..., str] = unixctl.call,
                 ask: Callable[[str, str, Sequence[str], float, Callable[[str, str], None]],
                               dict[str, str]] = _ask) -> None:
        self._ctl = ctl
        self._netns = netns
        self._timeout = timeout
        self._call = call
        self._ask = ask

    def announce(self, bridge: str, address: str) -> None:
        """Our own `address` on `bridge` told to the segment (a gratuitous ARP): a node that starts or whose
        OVS restarts is known to the others' OVS before its first packet (they may have tried it while it
        was down). Failures are logged, not raised: the peers resolve it themselves then."""
        try:
            call_in_netns(self._netns or None, partial(_announce, bridge, address))
        except OSError as exc:
            log.warning("cluster: gratuitous ARP for %s out of %s not sent: %s", address, bridge, exc)

    def aging(self) -> int:
        """OVS's tunnel neighbour aging, in seconds."""
        return parse_aging(self._call(self._ctl(), "tnl/neigh/aging"))

    def resolve(self, peers: Sequence[str], on_set: Callable[[str], None] = lambda peer: None) -> dict[str, str]:
        """Each peer's next hop resolved and set in OVS; {peer: why not} for those that were not.
        A next hop is set as its answer comes, and `on_set(peer)` told then (from the thread this runs
        in): a peer that does not answer holds back only itself, for the ARP timeout."""
        failed: dict[str, str] = {}
        hops: dict[str, NextHop] = {}
        for peer in peers:
            try:
                hops[peer] = next_hop(peer, self._call(self._ctl(), "ovs/route/lookup", [peer]))
            except (OvsError, ValueError) as exc:
                failed[peer] = f"OVS has no route to it ({exc})"
        by_way: dict[tuple[str, str], set[str]] = {}
        for hop in hops.values():
            by_way.setdefault((hop.bridge, hop.source), set()).add(hop.address)
        done: set[tuple[str, str]] = set()  # (bridge, next hop) set in OVS, or that failed to be

        def answered(bridge: str, address: str, mac: str) -> None:
            if (bridge, address) in done:
                return
            done.add((bridge, address))
            behind = [peer for peer, hop in hops.items() if (hop.bridge, hop.address) == (bridge, address)]
            try:
                self._call(self._ctl(), "tnl/neigh/set", [bridge, address, mac])
            except OvsError as exc:
                failed.update((peer, str(exc)) for peer in behind)
                return
            for peer in behind:
                on_set(peer)

        broken: dict[str, str] = {}  # bridge -> why no ARP request left it
        for (bridge, source), targets in sorted(by_way.items()):
            try:
                call_in_netns(self._netns or None, partial(self._ask, bridge, source, sorted(targets), self._timeout,
                                                           partial(answered, bridge)))
            except OSError as exc:
                broken[bridge] = f"no ARP request out of {bridge}: {exc}"
        for peer, hop in hops.items():
            if (hop.bridge, hop.address) not in done:
                gateway = "" if hop.address == peer else " (the gateway towards it)"
                failed[peer] = broken.get(hop.bridge) or (f"no ARP answer from {hop.address}{gateway} on "
                                                          f"{hop.bridge} within {self._timeout:g}s")
        return failed
