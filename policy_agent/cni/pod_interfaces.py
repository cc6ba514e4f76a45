"""Pod interfaces for CNI: IPAM via host-local, a veth into the Pod, an OVS port, then the agent's hooks."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import hashlib
import ipaddress
import json
import logging
import os
import re
import subprocess
import tempfile
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from policy_agent.cni.wire import (
    CURRENT_VERSION, ERR_INTERNAL, ERR_INVALID_CONFIG, ERR_INVALID_ENV, ERR_UNKNOWN_CONTAINER, CniError,
    CniRequest, container_id_problem,
)
from policy_agent.errors import OvsError
from policy_agent.ovs.bridge import Ovsdb

log = logging.getLogger(__name__)
T = TypeVar("T")

_STATE_VERSION = 1
# "attached": the port is on the bridge and pod_added may have run, so undoing
# it must call pod_deleted. "ready": the runtime got (or will get) a result.
_ATTACHED, _READY = "attached", "ready"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_IPAM_TIMEOUT = 30.0
# Children get this PATH and the CNI variables, nothing else of the agent's environment.
_CHILD_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class PodInterfaceInfo:
    """One Pod's interface as the agent sees it: enough to compile its policy and forwarding flows."""

    namespace: str
    name: str
    container_id: str
    netns: str
    ifname: str
    ip: str
    prefix_len: int
    mac: str
    gateway: str | None
    host_ifname: str
    ofport: int


class PodHooks(Protocol):
    """The agent side. pod_added realises every policy selecting the Pod, then its forwarding flows;
    pod_deleted removes them and must tolerate a Pod whose pod_added failed half-way."""

    async def pod_added(self, info: PodInterfaceInfo) -> None: ...

    async def pod_deleted(self, info: PodInterfaceInfo) -> None: ...


def host_ifname(container_id: str) -> str:
    """The host end's name: stable per container, 13 characters (Linux allows 15)."""
    return "np" + hashlib.sha1(container_id.encode()).hexdigest()[:11]


def mac_for_ip(ip: str) -> str:
    """02:00 + the IPv4 bytes: locally administered, unique while IPs are, readable in dumps."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ipaddress.IPv4Address(ip).packed)


@dataclass(frozen=True)
class IpamLease:
    """What the IPAM plugin handed out, reduced to what a Pod interface needs."""

    address: ipaddress.IPv4Interface
    gateway: str | None
    routes: list[dict[str, str]]
    dns: dict[str, Any]


def parse_ipam_result(raw: Any, netconf: Mapping[str, Any]) -> IpamLease:
    """The first IPv4 address of an IPAM result (any spec version), its routes and DNS."""
    try:
        ips = [ip for ip in raw["ips"] if ipaddress.ip_interface(ip["address"]).version == 4]
        if not ips:
            raise CniError(ERR_INVALID_CONFIG, "npaudit supports IPv4 Pods only",
                           f"IPAM returned {[ip.get('address') for ip in raw['ips']]}")
        address = ipaddress.IPv4Interface(ips[0]["address"])
        gateway = str(ipaddress.IPv4Address(ips[0]["gateway"])) if ips[0].get("gateway") else None
        routes: list[dict[str, str]] = []
        for route in raw.get("routes") or []:
            dst = ipaddress.ip_network(route["dst"], strict=False)
            if dst.version != 4:
                continue
            gw = route.get("gw") or gateway
            routes.append({"dst": str(dst), "gw": str(gw)} if gw else {"dst": str(dst)})
    except CniError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CniError(ERR_INTERNAL, "IPAM result not understood", f"{type(exc).__name__}: {exc}") from exc
    if gateway and not any(r["dst"] == "0.0.0.0/0" for r in routes):
        routes.append({"dst": "0.0.0.0/0", "gw": gateway})
    dns = netconf.get("dns") or raw.get("dns") or {}
    return IpamLease(address=address, gateway=gateway, routes=routes, dns=dict(dns))


def build_result(info: PodInterfaceInfo, host_mac: str, lease: IpamLease) -> dict[str, Any]:
    """The CNI 1.0.0 result; versioned() adapts it to what the runtime asked for."""
    ip: dict[str, Any] = {"address": f"{info.ip}/{info.prefix_len}"}
    if info.gateway:
        ip["gateway"] = info.gateway
    ip["interface"] = 1
    return {"cniVersion": CURRENT_VERSION,
            "interfaces": [{"name": info.host_ifname, "mac": host_mac},
                           {"name": info.ifname, "mac": info.mac, "sandbox": info.netns}],
            "ips": [ip], "routes": lease.routes, "dns": lease.dns}


def versioned(result: Mapping[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(result))
    out["cniVersion"] = version
    if version != "1.0.0":
        for ip in out["ips"]:  # 0.3.x and 0.4.0 results carry the address family
            ip["version"] = "4"
    return out


async def _blocking(fn: Callable[..., T], *args: Any) -> T:
    """asyncio.to_thread, except that a cancelled caller still waits for the thread to finish:
    a rollback must never race the step it undoes (e.g. IPAM DEL against a running IPAM ADD)."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await fut
        raise


class PodInterfaces:
    """The CniHandler: ADD, DEL and CHECK of Pod interfaces on `bridge`, state under `state_dir`."""

    def __init__(self, ovsdb: Ovsdb, bridge: str, ovs_netns: str, state_dir: Path, hooks: PodHooks,
                 ipam_bin_dir: Path = Path("/usr/lib/cni")) -> None:
        self._ovsdb = ovsdb
        self._bridge = bridge
        self._ovs_netns = ovs_netns
        self._state_dir = Path(state_dir)
        self._hooks = hooks
        self._ipam_bin_dir = Path(ipam_bin_dir)
        # One lock per container serialises its ADD/DEL/CHECK; weak values let a lock
        # vanish once no call holds or waits for it, so the map never grows with churn.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, container_id: str) -> asyncio.Lock:
        lock = self._locks.get(container_id)
        if lock is None:
            lock = self._locks[container_id] = asyncio.Lock()
        return lock

    @property
    def ipam_data_dir(self) -> Path:
        """host-local's dataDir unless the network configuration names one."""
        return self._state_dir / "ipam"

    # ---- CniHandler ----

    async def add(self, req: CniRequest) -> dict[str, Any]:
        namespace, name = req.args.get("K8S_POD_NAMESPACE", ""), req.args.get("K8S_POD_NAME", "")
        if not namespace or not name:
            raise CniError(ERR_INVALID_ENV, "CNI_ARGS must carry K8S_POD_NAMESPACE and K8S_POD_NAME")
        async with self._lock(req.container_id):
            state = await _blocking(self._load, req.container_id)
            if state is not None and state["phase"] == _READY:
                info = PodInterfaceInfo(**state["info"])
                if (info.ifname, info.netns) != (req.ifname, req.netns):
                    raise CniError(ERR_INVALID_ENV, f"container {req.container_id} already has "
                                   f"{info.ifname} in {info.netns}")
                log.info("ADD %s again: returning the recorded result", req.container_id)
                return versioned(state["result"], req.cni_version)
            if state is not None:
                # The agent died inside an earlier ADD: undo that one, then start afresh.
                log.warning("ADD %s: undoing an unfinished earlier ADD", req.container_id)
                await self._delete_known(state, req.netns)
            return await self._add_new(req, namespace, name)

    async def delete(self, req: CniRequest) -> None:
        async with self._lock(req.container_id):
            state = await _blocking(self._load, req.container_id)
            if state is None:
                await self._forget_unknown(req)
                raise CniError(ERR_UNKNOWN_CONTAINER, f"container {req.container_id} is not known to npaudit")
            await self._delete_known(state, req.netns)

    async def check(self, req: CniRequest) -> None:
        async with self._lock(req.container_id):
            state = await _blocking(self._load, req.container_id)
            if state is None:
                raise CniError(ERR_UNKNOWN_CONTAINER, f"container {req.container_id} is not known to npaudit")
            if state["phase"] != _READY:
                raise CniError(ERR_INTERNAL, f"ADD of container {req.container_id} has not completed")
            info = PodInterfaceInfo(**state["info"])
            if (info.ifname, info.netns) != (req.ifname, req.netns):
                raise CniError(ERR_INVALID_ENV, f"container {req.container_id} has {info.ifname} in "
                               f"{info.netns}, not {req.ifname} in {req.netns}")
            problems = await _blocking(self._inspect, info)
            try:
                await _blocking(self._ipam, "CHECK", state["ipam_netconf"], info.container_id,
                                        info.netns, info.ifname)
            except CniError as exc:
                problems.append(str(exc))
            if problems:
                raise CniError(ERR_INTERNAL, f"CHECK of container {info.container_id} failed",
                               "; ".join(problems))

    def pods(self) -> list[PodInterfaceInfo]:
        """Pods whose ADD completed, from the state directory (for re-realising policy after a restart)."""
        out = []
        for path in sorted(self._containers_dir.glob("*.json")):
            state = self._load(path.stem)
            if state is not None and state["phase"] == _READY:
                out.append(PodInterfaceInfo(**state["info"]))
        return out

    # ---- ADD / DEL steps ----

    async def _add_new(self, req: CniRequest, namespace: str, name: str) -> dict[str, Any]:
        ipam_conf = self._ipam_netconf(req.netconf)
        if not await _blocking(os.path.exists, req.netns):
            raise CniError(ERR_INVALID_ENV, f"CNI_NETNS {req.netns} does not exist")
        host_if = host_ifname(req.container_id)
        hooked: PodInterfaceInfo | None = None
        # Everything from IPAM ADD on is undone on any failure; each undo step
        # tolerates "was never done", so there is no bookkeeping of how far we got.
        try:
            raw = await _blocking(self._ipam, "ADD", ipam_conf, req.container_id, req.netns, req.ifname)
            lease = parse_ipam_result(raw, req.netconf)
            host_mac, ofport = await _blocking(self._plumb, req, lease, host_if)
            info = PodInterfaceInfo(
                namespace=namespace, name=name, container_id=req.container_id, netns=req.netns,
                ifname=req.ifname, ip=str(lease.address.ip), prefix_len=lease.address.network.prefixlen,
                mac=mac_for_ip(str(lease.address.ip)), gateway=lease.gateway, host_ifname=host_if,
                ofport=ofport)
            state: dict[str, Any] = {"version": _STATE_VERSION, "phase": _ATTACHED, "info": asdict(info),
                                     "host_mac": host_mac, "ipam_netconf": ipam_conf, "result": None}
            # Recorded before the hook runs, so a DEL after an agent crash here still calls pod_deleted.
            await _blocking(self._save, req.container_id, state)
            hooked = info
            # Policy first, forwarding flows last (inside the hook), answer after both:
            # the Pod's first packet already meets its policy (Antrea issue #197).
            await self._hooks.pod_added(info)
            state.update(phase=_READY, result=build_result(info, host_mac, lease))
            await _blocking(self._save, req.container_id, state)
        except BaseException as exc:
            await self._rollback(req, ipam_conf, host_if, hooked)
            if isinstance(exc, CniError) or not isinstance(exc, Exception):
                raise  # CniError as is; cancellation after cleaning up
            raise CniError(ERR_INTERNAL, f"ADD of container {req.container_id} (Pod {namespace}/{name}) "
                           "failed", f"{type(exc).__name__}: {exc}") from exc
        log.info("ADD %s: Pod %s/%s at %s on %s (ofport %d)", req.container_id, namespace, name,
                 info.ip, host_if, ofport)
        return versioned(state["result"], req.cni_version)

    async def _rollback(self, req: CniRequest, ipam_conf: dict[str, Any], host_if: str,
                        hooked: PodInterfaceInfo | None) -> None:
        """Undo a failed ADD: flows, port, veth, address, state; log what could not be undone."""
        problems: list[str] = []
        if hooked is not None:
            try:
                await self._hooks.pod_deleted(hooked)
            except Exception as exc:
                problems.append(f"pod_deleted hook: {type(exc).__name__}: {exc}")
        problems += await _blocking(self._teardown, host_if)
        try:
            await _blocking(self._ipam, "DEL", ipam_conf, req.container_id, req.netns, req.ifname)
        except CniError as exc:
            problems.append(str(exc))
        await _blocking(self._remove_state, req.container_id)
        if problems:
            log.error("rollback of ADD %s left work undone: %s", req.container_id, "; ".join(problems))

    async def _delete_known(self, state: dict[str, Any], netns: str) -> None:
        info = PodInterfaceInfo(**state["info"])
        problems: list[str] = []
        try:
            await self._hooks.pod_deleted(info)  # flows go before the port they point at
        except Exception as exc:
            log.exception("DEL %s: pod_deleted hook failed", info.container_id)
            problems.append(f"pod_deleted hook: {type(exc).__name__}: {exc}")
        problems += await _blocking(self._teardown, info.host_ifname)
        try:
            await _blocking(self._ipam, "DEL", state["ipam_netconf"], info.container_id,
                                    netns, info.ifname)
        except CniError as exc:
            problems.append(str(exc))
        if problems:
            # The state stays, so the runtime's retried DEL runs the hook and teardown again.
            raise CniError(ERR_INTERNAL, f"DEL of container {info.container_id} incomplete", "; ".join(problems))
        await _blocking(self._remove_state, info.container_id)
        log.info("DEL %s: Pod %s/%s released %s", info.container_id, info.namespace, info.name, info.ip)

    async def _forget_unknown(self, req: CniRequest) -> None:
        """No state: an ADD may still have died before recording any; remove what it could have left."""
        problems = await _blocking(self._teardown, host_ifname(req.container_id))
        try:
            ipam_conf = self._ipam_netconf(req.netconf)
            await _blocking(self._ipam, "DEL", ipam_conf, req.container_id, req.netns, req.ifname)
        except CniError as exc:
            problems.append(str(exc))
        if problems:
            log.info("DEL of unknown container %s: %s", req.container_id, "; ".join(problems))

    # ---- blocking work (run in threads) ----

    def _plumb(self, req: CniRequest, lease: IpamLease, host_if: str) -> tuple[str, int]:
        """veth with the Pod end configured, host end up next to vswitchd, port on the bridge."""
        ip, prefix = str(lease.address.ip), lease.address.network.prefixlen
        try:
            with self._ovs_ns() as hns, IPRoute(netns=req.netns, flags=0) as cns:
                stale = hns.link_lookup(ifname=host_if)
                if stale:  # left by an ADD of this container that died before recording state
                    log.warning("ADD %s: removing stale %s", req.container_id, host_if)
                    hns.link("del", index=stale[0])
                # Created from the OVS namespace with the peer straight in the Pod's, so neither
                # name ever appears in (or collides with) the host namespace.
                hns.link("add", ifname=host_if, kind="veth",
                         peer={"ifname": req.ifname, "net_ns_fd": req.netns})
                hidx = hns.link_lookup(ifname=host_if)[0]
                hns.link("set", index=hidx, state="up")
                host_mac = str(hns.link("get", index=hidx)[0].get("address"))
                cidx = cns.link_lookup(ifname=req.ifname)[0]
                cns.link("set", index=cidx, address=mac_for_ip(ip))
                cns.addr("add", index=cidx, address=ip, prefixlen=prefix)
                cns.link("set", index=cidx, state="up")
                for route in lease.routes:
                    cns.route("add", dst=route["dst"], gateway=route.get("gw"), oif=cidx)
        except (NetlinkError, OSError, IndexError) as exc:
            raise CniError(ERR_INTERNAL, f"creating {host_if} / {req.ifname} in {req.netns} failed",
                           f"{type(exc).__name__}: {exc}") from exc
        # The userspace datapath forwards frames as read from AF_PACKET: with tx
        # checksum offload on, the Pod's TCP/UDP checksums would stay partial.
        self._tx_off(self._ovs_netns_path(), host_if)
        self._tx_off(req.netns, req.ifname)
        try:
            ofport = self._ovsdb.add_port(self._bridge, host_if)
        except OvsError as exc:
            raise CniError(ERR_INTERNAL, f"attaching {host_if} to {self._bridge} failed", str(exc)) from exc
        return host_mac, ofport

    def _teardown(self, host_if: str) -> list[str]:
        """Port off the bridge, veth gone (deleting the host end removes both); missing is fine."""
        problems: list[str] = []
        try:
            self._ovsdb.del_port(self._bridge, host_if)
        except OvsError as exc:
            problems.append(str(exc))
        try:
            with self._ovs_ns() as hns:
                for idx in hns.link_lookup(ifname=host_if):
                    hns.link("del", index=idx)
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:
                problems.append(f"deleting {host_if}: {exc}")
        except OSError as exc:
            problems.append(f"deleting {host_if}: {exc}")
        return problems

    def _inspect(self, info: PodInterfaceInfo) -> list[str]:
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

    def _ipam_netconf(self, netconf: Mapping[str, Any]) -> dict[str, Any]:
        """The netconf for the IPAM plugin: ours verbatim, dataDir under state_dir unless given."""
        ipam = netconf.get("ipam")
        kind = ipam.get("type") if isinstance(ipam, dict) else None
        # The type names a binary we execute: a plain file name inside ipam_bin_dir only.
        if not isinstance(kind, str) or not _SAFE_NAME.match(kind):
            raise CniError(ERR_INVALID_CONFIG, "network configuration needs ipam.type naming an IPAM plugin")
        conf = copy.deepcopy(dict(netconf))
        conf["ipam"].setdefault("dataDir", str(self.ipam_data_dir))
        return conf

    def _ipam(self, command: str, netconf: Mapping[str, Any], container_id: str, netns: str,
              ifname: str) -> dict[str, Any] | None:
        kind = netconf["ipam"]["type"]
        binary = self._ipam_bin_dir / kind
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
               "CNI_IFNAME": ifname, "CNI_PATH": str(self._ipam_bin_dir), "PATH": _CHILD_PATH}
        what = f"IPAM {kind} {command} for {container_id}"
        try:
            proc = subprocess.run([str(binary)], input=json.dumps(netconf).encode(), env=env,
                                  capture_output=True, timeout=_IPAM_TIMEOUT)
        except FileNotFoundError as exc:
            raise CniError(ERR_INVALID_CONFIG, f"IPAM plugin {kind} not found in {self._ipam_bin_dir}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CniError(ERR_INTERNAL, f"{what} failed", str(exc)) from exc
        if proc.returncode != 0:
            try:
                err = json.loads(proc.stdout)
                code, msg = int(err["code"]), str(err["msg"])
                details = str(err.get("details", ""))
            except (ValueError, KeyError, TypeError):
                code, msg = ERR_INTERNAL, (proc.stdout or proc.stderr).decode(errors="replace")[:500]
                details = ""
            raise CniError(code, f"{what} failed: {msg}", details)
        if command != "ADD":
            return None
        try:
            result = json.loads(proc.stdout)
        except ValueError as exc:
            raise CniError(ERR_INTERNAL, f"{what} printed no JSON result", str(exc)) from exc
        if not isinstance(result, dict):
            raise CniError(ERR_INTERNAL, f"{what} printed no JSON object")
        return result

    @staticmethod
    def _tx_off(netns_path: str, ifname: str) -> None:
        # nsenter takes the namespace as a path, which is what CNI_NETNS is
        # (e.g. /proc/<pid>/ns/net); `ip netns exec` only knows /run/netns names.
        cmd = ["ethtool", "-K", ifname, "tx", "off"]
        if netns_path:
            cmd = ["nsenter", f"--net={netns_path}", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10,
                              env={"PATH": _CHILD_PATH})
        if proc.returncode != 0:
            raise CniError(ERR_INTERNAL, f"disabling tx checksum offload on {ifname} failed",
                           proc.stderr.strip()[:500])

    def _ovs_netns_path(self) -> str:
        ns = self._ovs_netns
        return ns if not ns or "/" in ns else f"/run/netns/{ns}"

    @contextlib.contextmanager
    def _ovs_ns(self) -> Iterator[IPRoute]:
        ipr = IPRoute(netns=self._ovs_netns, flags=0) if self._ovs_netns else IPRoute()
        try:
            yield ipr
        finally:
            ipr.close()

    # ---- state files ----

    @property
    def _containers_dir(self) -> Path:
        return self._state_dir / "containers"

    def _state_path(self, container_id: str) -> Path:
        problem = container_id_problem(container_id)
        if problem:  # the id becomes a file name
            raise CniError(ERR_INVALID_ENV, problem)
        return self._containers_dir / f"{container_id}.json"

    def _load(self, container_id: str) -> dict[str, Any] | None:
        path = self._state_path(container_id)
        try:
            state = json.loads(path.read_text())
            PodInterfaceInfo(**state["info"])
            if state["phase"] not in (_ATTACHED, _READY) or not isinstance(state["ipam_netconf"], dict):
                raise ValueError(f"phase {state['phase']!r}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Kept aside for a human; the container is then treated as unknown, whose
            # DEL still removes its veth, port and address.
            aside = path.with_suffix(".corrupt")
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            log.error("state of container %s unreadable (%s); moved to %s", container_id, exc, aside)
            return None
        return state

    def _save(self, container_id: str, state: Mapping[str, Any]) -> None:
        """Write-to-temp, fsync, rename, fsync the directory: a crash leaves the old or the new file."""
        path = self._state_path(container_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{container_id}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(state, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fsync_dir(path.parent)

    def _remove_state(self, container_id: str) -> None:
        path = self._state_path(container_id)
        if path.exists():
            path.unlink()
            self._fsync_dir(path.parent)

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
