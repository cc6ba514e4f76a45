"""CNI ADD, DEL and CHECK of Pod interfaces: IPAM, netdev plumbing and agent hooks, in order, undone on failure."""

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

from policy_agent.cni.subnet import NodeSubnet
from policy_agent.cni.ipam import Ipam, IpamLease, build_result, parse_ipam_result, versioned
from policy_agent.cni.netdev import Netdevs, host_ifname, mac_for_ip
from policy_agent.cni.ofports import OfportPool
from policy_agent.cni.state import ATTACHED, READY, ContainerState, ContainerStates, PodInterfaceInfo
from policy_agent.cni.wire import ERR_INTERNAL, ERR_INVALID_ENV, ERR_UNKNOWN_CONTAINER, CniError, CniRequest
from policy_agent.ovs.bridge import Ovsdb
from packetin.tasks import within

__all__ = ["PodHooks", "PodInterfaceInfo", "PodInterfaces"]

log = logging.getLogger(__name__)
T = TypeVar("T")


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


def _settle(fut: asyncio.Future[T], value: T) -> None:
    if not fut.done():
        fut.set_result(value)


async def _settled(task: asyncio.Future[Any]) -> None:
    """Once `task` has finished, however."""
    with contextlib.suppress(BaseException):
        await asyncio.shield(task)
    while not task.done():  # a second cancellation of ours interrupted the wait
        with contextlib.suppress(BaseException):
            await asyncio.shield(task)


async def _all(*steps: Awaitable[Any]) -> tuple[Any, ...]:
    """Every step's result; on a failure, only once all have finished (the rollback must not race
    any), then the first failure."""
    got = await asyncio.gather(*steps, return_exceptions=True)
    for x in got:
        if isinstance(x, BaseException):
            raise x
    return tuple(got)


class _Phases:
    """Where one ADD's time went, for its log line: "veth 5.1, ipam 4.2, ipam|veth 5.2, ...": steps
    running at once each with their own time, then the time until all of them were done ("a|b")."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._ms: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self._ms.append((name, (now - self._last) * 1000))
        self._last = now

    async def timed(self, name: str, step: Awaitable[T]) -> T:
        """`step`'s own time, among others running at once."""
        start = time.monotonic()
        try:
            return await step
        finally:
            self._ms.append((name, (time.monotonic() - start) * 1000))

    def __str__(self) -> str:
        return ", ".join(f"{name} {ms:.1f}" for name, ms in self._ms)


class PodInterfaces:
    """The CniHandler: ADD, DEL and CHECK of Pod interfaces on `bridge`, state under `state_dir`."""

    def __init__(self, ovsdb: Ovsdb, bridge: str, ovs_netns: str, state_dir: Path, hooks: PodHooks,
                 ipam_bin_dir: Path = Path("/usr/lib/cni"), subnet: NodeSubnet | None = None, mtu: int = 0) -> None:
        state_dir = Path(state_dir)
        self._netdevs = Netdevs(ovsdb, bridge, ovs_netns, mtu)
        # host-local's dataDir unless the network configuration names one.
        self._ipam = Ipam(ipam_bin_dir, state_dir / "ipam", subnet)
        self._states = ContainerStates(state_dir / "containers")
        # Numbers held: every recorded Pod's (READY or ATTACHED) and whatever OVSDB shows.
        self._ofports = OfportPool(lambda: self._recorded_ofports() | self._netdevs.ofports_in_use())
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

    def _recorded_ofports(self) -> set[int]:
        out = set()
        for container_id in self._states.container_ids():
            state = self._states.load(container_id)
            if state is not None:
                out.add(state.info.ofport)
        return out

    # ---- ADD / DEL steps ----

    async def _add_new(self, req: CniRequest, namespace: str, name: str) -> dict[str, Any]:
        ipam_conf = self._ipam.netconf(req.netconf)
        # One stat of a /run path: cheaper on the loop than a hop to a thread.
        if not os.path.exists(req.netns):
            raise CniError(ERR_INVALID_ENV, f"CNI_NETNS {req.netns} does not exist")
        host_if = host_ifname(req.container_id)
        hooked: list[PodInterfaceInfo] = []  # the info pod_added last ran with
        owned: list[int] = []  # OpenFlow port numbers this ADD holds in the pool
        loop = asyncio.get_running_loop()
        numbered: asyncio.Future[int] = loop.create_future()
        # Everything from IPAM ADD on is undone on any failure; each undo step
        # tolerates "was never done", so there is no bookkeeping of how far we got.
        phases = _Phases()
        try:
            with self._netdevs.watch_ofport(host_if, lambda n: loop.call_soon_threadsafe(_settle, numbered, n)):
                def veth() -> tuple[str, int]:
                    # The port number is ours to choose, so the Pod's flows need not wait for vswitchd.
                    owned.append(self._ofports.take())
                    return self._netdevs.make_veth(req, host_if)

                def address() -> IpamLease:
                    return parse_ipam_result(
                        self._ipam.run("ADD", ipam_conf, req.container_id, req.netns, req.ifname), req.netconf)

                made = asyncio.ensure_future(phases.timed("veth", _blocking(veth)))

                async def port() -> int:
                    await made
                    await _blocking(self._netdevs.attach_port, host_if, owned[0])
                    return await self._assigned(numbered, host_if)

                # The address while the veth is made and put on the bridge (IPAM ~5 ms, veth ~3 ms,
                # port ~5 ms): a port before its flows meets table 0's drop.
                attached = asyncio.ensure_future(phases.timed("port", port()))
                try:
                    (host_mac, pod_index), lease = await _all(made, phases.timed("ipam", _blocking(address)))
                    phases.mark("ipam|veth")
                    if self._ipam.subnet is not None:
                        self._ipam.subnet.check_address(f"{namespace}/{name}", str(lease.address.ip))
                    info = PodInterfaceInfo(
                        namespace=namespace, name=name, container_id=req.container_id, netns=req.netns,
                        ifname=req.ifname, ip=str(lease.address.ip), prefix_len=lease.address.network.prefixlen,
                        mac=mac_for_ip(str(lease.address.ip)), gateway=lease.gateway, host_ifname=host_if,
                        ofport=owned[0])
                    state = ContainerState(phase=ATTACHED, info=info, host_mac=host_mac, ipam_netconf=ipam_conf)
                    result = build_result(info, host_mac, lease)
                    ready = dataclasses.replace(state, phase=READY, result=result)

                    async def hook() -> None:
                        # Recorded before the hook runs, so a DEL after an agent crash in it still
                        # calls pod_deleted. Not fsynced: it only matters while the flows it stands
                        # for exist, and they do not survive a power loss (nor do the netns and veth);
                        # the port and the lease that do are removed by the runtime's DEL of the dead
                        # sandbox without a record (_forget_unknown).
                        await _blocking(self._states.save, state, False)
                        hooked.append(info)
                        await self._hooks.pod_added(info)

                    # Policy first, forwarding flows last (inside the hook), answer after both and
                    # after vswitchd numbered the port as asked: the Pod's first packet already meets
                    # its policy (Antrea issue #197). Flows naming a port that does not exist yet
                    # are fine. Meanwhile the Pod end gets its address, and the final record's bytes
                    # go to the disk (an fsync): it takes effect only once the hook succeeded.
                    _, _, staged, got = await _all(
                        phases.timed("intent+hook", hook()),
                        phases.timed("configure", _blocking(self._netdevs.configure, req, lease, pod_index)),
                        phases.timed("stage", _blocking(self._states.stage, ready)), attached)
                    phases.mark("hook|configure|stage|port")
                except BaseException:
                    await _settled(attached)  # the rollback must not race the port's attach
                    raise
            if got != info.ofport:
                info, staged = await self._renumbered(ready, staged, got, owned, hooked)
            # The one fsync left waiting for: the directory, so the record survives a power loss
            # before the runtime hears of the Pod.
            await _blocking(self._states.commit, req.container_id, staged)
            phases.mark("commit")
        except BaseException as exc:
            await self._rollback(req, ipam_conf, host_if, hooked, owned)
            if isinstance(exc, CniError) or not isinstance(exc, Exception):
                raise  # CniError as is; cancellation after cleaning up
            raise CniError(ERR_INTERNAL, f"ADD of container {req.container_id} (Pod {namespace}/{name}) "
                           "failed", f"{type(exc).__name__}: {exc}") from exc
        log.info("ADD %s: Pod %s/%s at %s on %s (ofport %d); ms %s", req.container_id, namespace, name,
                 info.ip, host_if, info.ofport, phases)
        return versioned(result, req.cni_version)

    async def _assigned(self, numbered: asyncio.Future[int], host_if: str, timeout: float = 10.0) -> int:
        """The number vswitchd gave the port, from the OVSDB update (watch_ofport) that says so.
        OVSDB is read as well every 0.5 s, in case that update came before the watch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                return await within(asyncio.shield(numbered), min(0.5, max(0.0, deadline - loop.time())))
            except asyncio.TimeoutError:
                pass
            now = await _blocking(self._netdevs.ofport, host_if)
            if now is not None:
                return now
            if loop.time() > deadline:
                raise await _blocking(self._netdevs.no_ofport, host_if, timeout)

    async def _renumbered(self, ready: ContainerState, staged: Path, got: int, owned: list[int],
                          hooked: list[PodInterfaceInfo]) -> tuple[PodInterfaceInfo, Path]:
        """vswitchd gave the port `got`, not the number asked for (someone else's port has that):
        the Pod's flows move to `got` before the runtime hears of it. Returns the info and the
        staged record with the new number."""
        old = ready.info
        log.warning("ADD %s: OpenFlow port %d was taken, vswitchd gave %s port %d: realising the Pod again",
                    old.container_id, old.ofport, old.host_ifname, got)
        self._ofports.hold(got)
        owned[:] = [got]  # the one asked for stays held: it belongs to another port
        info = dataclasses.replace(old, ofport=got)
        await _blocking(self._netdevs.keep_ofport, old.host_ifname)
        # The flows naming the other port go before the Pod's flows come for its own.
        await self._hooks.pod_deleted(old)
        state = dataclasses.replace(ready, phase=ATTACHED, info=info, result=None)

        def record() -> None:
            staged.unlink(missing_ok=True)  # the final record with `old`, never to be in force
            self._states.save(state, False)

        await _blocking(record)
        hooked.append(info)
        await self._hooks.pod_added(info)
        return info, await _blocking(self._states.stage, dataclasses.replace(ready, info=info))

    async def _rollback(self, req: CniRequest, ipam_conf: dict[str, Any], host_if: str,
                        hooked: list[PodInterfaceInfo], owned: list[int]) -> None:
        """Undo a failed ADD: flows, port, veth, address, state; log what could not be undone."""
        problems: list[str] = []
        if hooked:
            try:
                await self._hooks.pod_deleted(hooked[-1])
            except Exception as exc:
                problems.append(f"pod_deleted hook: {type(exc).__name__}: {exc}")
        problems += await _blocking(self._netdevs.teardown, host_if)
        try:
            await _blocking(self._ipam.run, "DEL", ipam_conf, req.container_id, req.netns, req.ifname)
        except CniError as exc:
            problems.append(str(exc))
        await _blocking(self._states.remove, req.container_id)
        if not problems:  # else the port may still be there with its number
            for n in owned:
                self._ofports.release(n)
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
        self._ofports.release(info.ofport)
        log.info("DEL %s: Pod %s/%s released %s", info.container_id, info.namespace, info.name, info.ip)

    async def _forget_unknown(self, req: CniRequest) -> None:
        """No state: an ADD may still have died before recording any; remove what it could have left."""
        problems = await _blocking(self._netdevs.teardown, host_ifname(req.container_id))
        try:
            ipam_conf = self._ipam.netconf(req.netconf)
            await _blocking(self._ipam.run, "DEL", ipam_conf, req.container_id, req.netns, req.ifname)
        except CniError as exc:
            problems.append(str(exc))
        # The final record is staged beside the hook, so an ADD killed before its intent record
        # can still have left the staged bytes (a ".<id>.*.tmp" file): remove them too.
        await _blocking(self._states.remove, req.container_id)
        if problems:
            log.info("DEL of unknown container %s: %s", req.container_id, "; ".join(problems))
