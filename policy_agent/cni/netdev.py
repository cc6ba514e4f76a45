"""Pod netdev plumbing: a veth from the OVS namespace into the Pod's, its addresses, and its port on the bridge."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import logging
import socket
import struct
from typing import Callable, ContextManager

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from meters.netns import call_in_netns
from policy_agent.cni.ipam import IpamLease
from policy_agent.cni.rtnl import Rtnl
from policy_agent.cni.state import PodInterfaceInfo
from policy_agent.cni.wire import ERR_INTERNAL, CniError, CniRequest
from policy_agent.errors import OvsError
from policy_agent.ovs.bridge import Ovsdb
from policy_agent.ovs.tables import mac_for_ip

log = logging.getLogger(__name__)


def host_ifname(container_id: str) -> str:
    """The host end's name: stable per container, 13 characters (Linux allows 15)."""
    return "np" + hashlib.sha1(container_id.encode()).hexdigest()[:11]


class Netdevs:
    """Blocking netlink and OVSDB work for Pod interfaces on `bridge`, whose vswitchd runs in `ovs_netns`."""

    def __init__(self, ovsdb: Ovsdb, bridge: str, ovs_netns: str, mtu: int = 0) -> None:
        self._ovsdb = ovsdb
        self._bridge = bridge
        self._ovs_netns = ovs_netns
        self._mtu = mtu  # of both ends of a Pod's veth (cluster.pod_mtu: room for the tunnel's headers); 0: default

    def make_veth(self, req: CniRequest, host_if: str) -> tuple[str, int]:
        """The veth, its host end up next to vswitchd: the host end's MAC and the Pod end's
        ifindex. Needs no address, so it runs while IPAM allocates one (and `attach_port` after
        it); `configure` (the Pod end) then runs with the policy hook.

        The netlink work runs in a thread moved into each namespace (meters.netns): an
        IPRoute(netns=...) costs ~10 ms to start there, a thread ~1 ms. Checksum offload
        goes off by ioctl, not by running ethtool (two processes per ADD); the requests are
        encoded by hand (rtnl.py), not by pyroute2 (~0.3 ms of CPU per call)."""

        def host_side() -> tuple[str, int]:
            with Rtnl() as rtnl:
                # Created from the OVS namespace with the peer straight in the Pod's, so neither
                # name ever appears in (or collides with) the host namespace. Up at once: the
                # port is attached only after this returns.
                try:
                    rtnl.add_veth(host_if, req.ifname, req.netns, self._mtu)
                except OSError as exc:
                    if exc.errno != errno.EEXIST or not _link_exists(rtnl, host_if):
                        raise
                    # Left by an ADD of this container that died before recording state; its
                    # port too: the new one must get the number asked for, not keep the old.
                    log.warning("ADD %s: removing stale %s", req.container_id, host_if)
                    rtnl.delete_link(host_if)
                    self._ovsdb.del_port(self._bridge, host_if)
                    rtnl.add_veth(host_if, req.ifname, req.netns, self._mtu)
                # The userspace datapath forwards frames as read from AF_PACKET: with tx
                # checksum offload on, the Pod's TCP/UDP checksums would stay partial.
                tx_checksum_off(host_if)
                # IFLA_LINK of a veth: its peer's ifindex (in the Pod's namespace).
                return rtnl.link(host_if)

        try:
            return call_in_netns(self._ovs_netns or None, host_side)
        except (OSError, KeyError, OvsError) as exc:
            raise CniError(ERR_INTERNAL, f"creating {host_if} / {req.ifname} in {req.netns} failed",
                           f"{type(exc).__name__}: {exc}") from exc

    def attach_port(self, host_if: str, ofport: int) -> None:
        """The host end (made by `make_veth`) as a port on the bridge, asking for OpenFlow port
        `ofport`; returns before vswitchd numbered it (watch_ofport tells)."""
        try:
            self._ovsdb.attach_port(self._bridge, host_if, ofport)
        except OvsError as exc:
            raise CniError(ERR_INTERNAL, f"attaching {host_if} to {self._bridge} failed", str(exc)) from exc

    def watch_ofport(self, host_if: str, callback: Callable[[int], object]) -> ContextManager[None]:
        return self._ovsdb.watch_ofport(host_if, callback)

    def ofport(self, host_if: str) -> int | None:
        """The port's number in OVSDB now, None while vswitchd has given none."""
        try:
            return self._ovsdb.ofport(host_if)
        except OvsError as exc:
            raise CniError(ERR_INTERNAL, f"reading the OpenFlow port of {host_if} failed", str(exc)) from exc

    def no_ofport(self, host_if: str, timeout: float) -> CniError:
        try:
            why = str(self._ovsdb.no_ofport(self._bridge, host_if, timeout))
        except OvsError as exc:
            why = str(exc)
        return CniError(ERR_INTERNAL, f"attaching {host_if} to {self._bridge} failed", why)

    def keep_ofport(self, host_if: str) -> None:
        """The port keeps the number vswitchd gave it (its request dropped; see Ovsdb.forget_ofport_request)."""
        try:
            self._ovsdb.forget_ofport_request(host_if)
        except OvsError as exc:
            raise CniError(ERR_INTERNAL, f"renumbering {host_if} failed", str(exc)) from exc

    def ofports_in_use(self) -> set[int]:
        return self._ovsdb.ofports_in_use()

    def configure(self, req: CniRequest, lease: IpamLease, cidx: int) -> None:
        """The Pod end (made by `make_veth`, index `cidx`): its MAC, address and routes, up."""
        ip = str(lease.address.ip)

        def pod_side() -> None:
            with Rtnl() as rtnl:
                tx_checksum_off(req.ifname)
                rtnl.set_mac_up(cidx, mac_for_ip(ip))
                rtnl.add_address(cidx, lease.address)
                rtnl.add_routes(cidx, lease.routes)

        try:
            call_in_netns(req.netns, pod_side)
        except (NetlinkError, OSError, IndexError) as exc:
            raise CniError(ERR_INTERNAL, f"configuring {req.ifname} in {req.netns} failed",
                           f"{type(exc).__name__}: {exc}") from exc

    def teardown(self, host_if: str) -> list[str]:
        """Port off the bridge, veth gone (deleting the host end removes both); missing is fine."""
        problems: list[str] = []
        try:
            self._ovsdb.del_port(self._bridge, host_if)
        except OvsError as exc:
            problems.append(str(exc))

        def remove() -> None:
            with IPRoute(flags=0) as hns:
                for idx in hns.link_lookup(ifname=host_if):
                    hns.link("del", index=idx)

        try:
            call_in_netns(self._ovs_netns or None, remove)
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:
                problems.append(f"deleting {host_if}: {exc}")
        except OSError as exc:
            problems.append(f"deleting {host_if}: {exc}")
        return problems

    def inspect(self, info: PodInterfaceInfo) -> list[str]:
        """What differs from `info` (CNI CHECK): the Pod end's MAC and address, the port and its ofport."""
        problems: list[str] = []
        want = f"{info.ip}/{info.prefix_len}"
        try:
            with IPRoute(netns=info.netns, flags=0) as cns:
                idx = cns.link_lookup(ifname=info.ifname)
                if not idx:
                    problems.append(f"{info.ifname} is missing in {info.netns}")
                else:
                    mac = cns.link("get", index=idx[0])[0].get("address")
                    if mac != info.mac:
                        problems.append(f"{info.ifname} has MAC {mac}, expected {info.mac}")
                    have = {f"{a.get('address')}/{a['prefixlen']}" for a in cns.addr("dump", index=idx[0])}
                    if want not in have:
                        problems.append(f"{info.ifname} lacks {want} (has {sorted(have)})")
        except (NetlinkError, OSError) as exc:
            problems.append(f"cannot inspect {info.netns}: {exc}")
        try:
            api = self._ovsdb.api
            ports = api.list_ports(self._bridge).execute(check_error=True)
            if info.host_ifname not in ports:
                problems.append(f"{info.host_ifname} is not a port of {self._bridge}")
            else:
                got = api.db_get("Interface", info.host_ifname, "ofport").execute(check_error=True)
                ofport = got[0] if isinstance(got, list) and got else got
                if ofport != info.ofport:
                    problems.append(f"{info.host_ifname} has ofport {ofport}, expected {info.ofport}")
        except Exception as exc:  # ovsdbapp raises many types for "not there"
            problems.append(f"cannot read {self._bridge} from OVSDB: {exc}")
        return problems


def _link_exists(rtnl: Rtnl, ifname: str) -> bool:
    try:
        rtnl.link(ifname)
    except OSError:
        return False
    except KeyError:  # there, but no veth
        pass
    return True


# SIOCETHTOOL with ETHTOOL_STXCSUM (linux/sockios.h, linux/ethtool.h): what `ethtool -K tx off` does.
_SIOCETHTOOL = 0x8946
_ETHTOOL_STXCSUM = 0x17


def tx_checksum_off(ifname: str) -> None:
    """Turn tx checksum offload off on `ifname` in the calling thread's network namespace."""
    value = ctypes.create_string_buffer(struct.pack("II", _ETHTOOL_STXCSUM, 0), 8)
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value)).ljust(40, b"\0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            fcntl.ioctl(sock.fileno(), _SIOCETHTOOL, ifreq)
        except OSError as exc:
            raise CniError(ERR_INTERNAL, f"disabling tx checksum offload on {ifname} failed",
                           f"{type(exc).__name__}: {exc}") from exc
