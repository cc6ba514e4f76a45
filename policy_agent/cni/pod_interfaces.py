"""CNI ADD, DEL and CHECK of Pod interfaces: IPAM, netdev plumbing and the agent's hooks, in order, undone on failure."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import weakref
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from policy_agent.cni.ipam import Ipam, IpamLease, build_result, parse_ipam_result, versioned
from policy_agent.cni.netdev import Netdevs, host_ifname, mac_for_ip
from policy_agent.cni.state import ATTACHED, READY, ContainerState, ContainerStates, PodInterfaceInfo
from policy_agent.cni.wire import ERR_INTERNAL, ERR_INVALID_ENV, ERR_UNKNOWN_CONTAINER, CniError, CniRequest
from policy_agent.ovs.bridge import Ovsdb

__all__ = ["PodHooks", "PodInterfaceInfo", "PodInterfaces"]

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")


class PodHooks(Protocol):
    """The agent side. pod_added realises every policy selecting the Pod, then its forwarding flows;
    pod_deleted removes them and must tolerate a Pod whose pod_added failed half-way."""

    async def pod_added(self, info: PodInterfaceInfo) -> None: ...

    async def pod_deleted(self, info: PodInterfaceInfo) -> None: ...


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


async def _both(a: Awaitable[T], b: Awaitable[U]) -> tuple[T, U]:
    """Both results; on a failure, only once both have finished (the rollback must not race
    either), then the first failure."""
    got = await asyncio.gather(a, b, return_exceptions=True)
    for x in got:
        if isinstance(x, BaseException):
            raise x
    return got[0], got[1]  # type: ignore[return-value]


class _Phases:
    """Where one ADD's time went, for its log line: "ipam+port 5.1, configure+intent 2.0, ..."."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._ms: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self._ms.append((name, (now - self._last) * 1000))
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {ms:.1f}" for name, ms in self._ms)


class PodInterfaces:
    """The CniHandler: ADD, DEL and CHECK of Pod interfaces on `bridge`, state under `state_dir`."""

    def __init__(self, ovsdb: Ovsdb, bridge: str, ovs_netns: str, state_dir: Path, hooks: PodHooks,
                 ipam_bin_dir: Path = Path("/usr/lib/cni")) -> None:
        state_dir = Path(state_dir)
        self._netdevs = Netdevs(ovsdb, bridge, ovs_netns)
        # host-local's dataDir unless the network configuration names one.
        self._ipam = Ipam(ipam_bin_dir, state_dir / "ipam")
        self._states = ContainerStates(state_dir / "containers")
        self._hooks = hooks
        # One lock per container serialises its ADD/DEL/CHECK; weak values let a lock
        # vanish once no call holds or waits for it, so the map never grows with churn.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, container_id: str) -> asyncio.Lock:
        lock = self._locks.get(container_id)
        if lock is None:
            lock = self._locks[container_id] = asyncio.Lock()
        return lock

    # ---- CniHandler ----

    async def add(self, req: CniRequest) -> dict[str, Any]:
        namespace, name = req.args.get("K8S_POD_NAMESPACE", ""), req.args.get("K8S_POD_NAME", "")
        if not namespace or not name:
            raise CniError(ERR_INVALID_ENV, "CNI_ARGS must carry K8S_POD_NAMESPACE and K8S_POD_NAME")
        async with self._lock(req.container_id):
            state = await _blocking(self._states.load, req.container_id)
            if state is not None and state.result is not None:  # only a READY state has a result
                info = state.info
                if (info.ifname, info.netns) != (req.ifname, req.netns):
                    raise CniError(ERR_INVALID_ENV, f"container {req.container_id} already has "
                                   f"{info.ifname} in {info.netns}")
                log.info("ADD %s again: returning the recorded result", req.container_id)
                return versioned(state.result, req.cni_version)
            if state is not None:
                # The agent died inside an earlier ADD: undo that one, then start afresh.
                log.warning("ADD %s: undoing an unfinished earlier ADD", req.container_id)
                await self._delete_known(state, req.netns)
            return await self._add_new(req, namespace, name)

    async def delete(self, req: CniRequest) -> None:
        async with self._lock(req.container_id):
            state = await _blocking(self._states.load, req.container_id)
            if state is None:
                await self._forget_unknown(req)
                raise CniError(ERR_UNKNOWN_CONTAINER, f"container {req.container_id} is not known to npaudit")
            await self._delete_known(state, req.netns)

    async def check(self, req: CniRequest) -> None:
        async with self._lock(req.container_id):
            state = await _blocking(self._states.load, req.container_id)
            if state is None:
                raise CniError(ERR_UNKNOWN_CONTAINER, f"container {req.container_id} is not known to npaudit")
            if state.phase != READY:
                raise CniError(ERR_INTERNAL, f"ADD of container {req.container_id} has not completed")
            info = state.info
            if (info.ifname, info.netns) != (req.ifname, req.netns):
                raise CniError(ERR_INVALID_ENV, f"container {req.container_id} has {info.ifname} in "
                               f"{info.netns}, not {req.ifname} in {req.netns}")
            problems = await _blocking(self._netdevs.inspect, info)
            try:
                await _blocking(self._ipam.run, "CHECK", state.ipam_netconf, info.container_id,
                                info.netns, info.ifname)
            except CniError as exc:
                problems.append(str(exc))
            if problems:
                raise CniError(ERR_INTERNAL, f"CHECK of container {info.container_id} failed",
                               "; ".join(problems))

    def pods(self) -> list[PodInterfaceInfo]:
        """Pods whose ADD completed, from the state directory (for re-realising policy after a restart)."""
        out = []
        for container_id in self._states.container_ids():
            state = self._states.load(container_id)
            if state is not None and state.phase == READY:
                out.append(state.info)
        return out

    # ---- ADD / DEL steps ----

    async def _add_new(self, req: CniRequest, namespace: str, name: str) -> dict[str, Any]:
        ipam_conf = self._ipam.netconf(req.netconf)
        if not await _blocking(os.path.exists, req.netns):
            raise CniError(ERR_INVALID_ENV, f"CNI_NETNS {req.netns} does not exist")
        host_if = host_ifname(req.container_id)
        hooked: PodInterfaceInfo | None = None
        # Everything from IPAM ADD on is undone on any failure; each undo step
        # tolerates "was never done", so there is no bookkeeping of how far we got.
        phases = _Phases()
        try:
            # The address while the veth is made, then the Pod end's address while the port is
            # added: only `configure` needs both the lease and the veth (~5 ms each step).
            veth = asyncio.ensure_future(_blocking(self._netdevs.make_veth, req, host_if))

            async def port() -> tuple[str, int]:
                host_mac = await veth
                return host_mac, await _blocking(self._netdevs.add_port, host_if)

            async def pod_end() -> IpamLease:
                raw = await _blocking(self._ipam.run, "ADD", ipam_conf, req.container_id, req.netns, req.ifname)
                lease = parse_ipam_result(raw, req.netconf)
                await veth
                phases.mark("ipam+veth")
                await _blocking(self._netdevs.configure, req, lease)
                return lease

            (host_mac, ofport), lease = await _both(port(), pod_end())
            phases.mark("port+configure")
            info = PodInterfaceInfo(
                namespace=namespace, name=name, container_id=req.container_id, netns=req.netns,
                ifname=req.ifname, ip=str(lease.address.ip), prefix_len=lease.address.network.prefixlen,
                mac=mac_for_ip(str(lease.address.ip)), gateway=lease.gateway, host_ifname=host_if,
                ofport=ofport)
            state = ContainerState(phase=ATTACHED, info=info, host_mac=host_mac, ipam_netconf=ipam_conf)
            # Recorded before the hook runs, so a DEL after an agent crash in it still calls
            # pod_deleted. Not fsynced: it only matters while the flows it stands for exist, and
            # they do not survive a power loss (nor do the netns and veth); the port and the lease
            # that do are removed by the runtime's DEL of the dead sandbox without a record
            # (_forget_unknown).
            await _blocking(self._states.save, state, False)
            phases.mark("intent")
            hooked = info
            result = build_result(info, host_mac, lease)
            # Policy first, forwarding flows last (inside the hook), answer after both: the Pod's
            # first packet already meets its policy (Antrea issue #197). The final record's bytes
            # go to the disk meanwhile; it takes effect only once the hook succeeded.
            _, staged = await _both(
                self._hooks.pod_added(info),
                _blocking(self._states.stage, dataclasses.replace(state, phase=READY, result=result)))
            phases.mark("hook+stage")
            # The one fsync left waiting for: the directory, so the record survives a power loss
            # before the runtime hears of the Pod.
            await _blocking(self._states.commit, req.container_id, staged)
            phases.mark("commit")
        except BaseException as exc:
            await self._rollback(req, ipam_conf, host_if, hooked)
            if isinstance(exc, CniError) or not isinstance(exc, Exception):
                raise  # CniError as is; cancellation after cleaning up
            raise CniError(ERR_INTERNAL, f"ADD of container {req.container_id} (Pod {namespace}/{name}) "
                           "failed", f"{type(exc).__name__}: {exc}") from exc
        log.info("ADD %s: Pod %s/%s at %s on %s (ofport %d); ms %s", req.container_id, namespace, name,
                 info.ip, host_if, ofport, phases)
        return versioned(result, req.cni_version)

    async def _rollback(self, req: CniRequest, ipam_conf: dict[str, Any], host_if: str,
                        hooked: PodInterfaceInfo | None) -> None:
        """Undo a failed ADD: flows, port, veth, address, state; log what could not be undone."""
        problems: list[str] = []
        if hooked is not None:
            try:
                await self._hooks.pod_deleted(hooked)
            except Exception as exc:
                problems.append(f"pod_deleted hook: {type(exc).__name__}: {exc}")
        problems += await _blocking(self._netdevs.teardown, host_if)
        try:
            await _blocking(self._ipam.run, "DEL", ipam_conf, req.container_id, req.netns, req.ifname)
        except CniError as exc:
            problems.append(str(exc))
        await _blocking(self._states.remove, req.container_id)
        if problems:
            log.error("rollback of ADD %s left work undone: %s", req.container_id, "; ".join(problems))

    async def _delete_known(self, state: ContainerState, netns: str) -> None:
        info = state.info
        problems: list[str] = []
        try:
            await self._hooks.pod_deleted(info)  # flows go before the port they point at
        except Exception as exc:
            log.exception("DEL %s: pod_deleted hook failed", info.container_id)
            problems.append(f"pod_deleted hook: {type(exc).__name__}: {exc}")
        problems += await _blocking(self._netdevs.teardown, info.host_ifname)
        try:
            await _blocking(self._ipam.run, "DEL", state.ipam_netconf, info.container_id, netns, info.ifname)
        except CniError as exc:
            problems.append(str(exc))
        if problems:
            # The state stays, so the runtime's retried DEL runs the hook and teardown again.
            raise CniError(ERR_INTERNAL, f"DEL of container {info.container_id} incomplete", "; ".join(problems))
        await _blocking(self._states.remove, info.container_id)
        log.info("DEL %s: Pod %s/%s released %s", info.container_id, info.namespace, info.name, info.ip)

    async def _forget_unknown(self, req: CniRequest) -> None:
        """No state: an ADD may still have died before recording any; remove what it could have left."""
        problems = await _blocking(self._netdevs.teardown, host_ifname(req.container_id))
        try:
            ipam_conf = self._ipam.netconf(req.netconf)
            await _blocking(self._ipam.run, "DEL", ipam_conf, req.container_id, req.netns, req.ifname)
        except CniError as exc:
            problems.append(str(exc))
        if problems:
            log.info("DEL of unknown container %s: %s", req.container_id, "; ".join(problems))
