"""The CNI hooks on a (fake) switch: a Pod's policy and forwarding flows change in one atomic
bundle, policy first, and a small Pod change takes no thread hop while a big one stays off the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import Any, Callable

import pytest
from os_ken.ofproto import ofproto_v1_5 as ofp

from policy_agent import engine as engine_module
from policy_agent.ovs import tables
from policy_agent.policy.model import Namespace, Pod
from tests.support.engine_doubles import Info, drop_web
from tests.support.policy_node import node, state_dir  # noqa: F401 (fixtures)
from tests.support.channel_rig import run, sock_path  # noqa: F401 (fixtures)

POD = Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5)
PEER = Info("x", "b", "10.0.0.3", "02:00:0a:00:00:03", 6)


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (asyncio.to_thread's): counts the calls handed to a thread."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.calls: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        # to_thread submits partial(context.run, the function, *its args)
        target = fn.args[0] if isinstance(fn, functools.partial) and fn.args else fn
        self.calls.append(getattr(target, "__name__", repr(target)))
        return super().submit(fn, *args, **kwargs)


def fwd_key(info: Info) -> Any:
    """The switch's key of the Pod's forwarding flow (table, priority, match)."""
    flow, = [f for f in tables.pod_flows(1, ip=info.ip, mac=info.mac, ofport=info.ofport)
             if f.table == tables.T_FORWARD]
    return flow.key


def test_a_pod_never_forwards_before_its_policy_is_in(sock_path: str, state_dir) -> None:  # noqa: F811
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            fake = n.r.fake
            await n.engine.apply([Namespace("x")], [Pod("x", "a", (("app", "web"),))], policies=[drop_web()])
            before, commits, received = set(fake.flows), fake.commits, len(fake.received)
            fake.tables = []  # the table after every message from here on
            await n.engine.pod_added(POD)
            sent = [t for t, _ in fake.received[received:]]
            assert fake.commits == commits + 1 and ofp.OFPT_FLOW_MOD not in sent  # one bundle, nothing outside
            pod_keys = {f.key for f in tables.pod_flows(1, ip=POD.ip, mac=POD.mac, ofport=POD.ofport)}
            new = set(fake.flows) - before
            policy_keys = new - pod_keys
            assert pod_keys <= new and any(("ipv4_dst", POD.ip) in dict(k[2]).items() for k in policy_keys)
            # In the bundle, every policy flow comes before the first forwarding flow...
            order = [m.ident for m in fake.mods if m.ident in new]
            assert max(order.index(k) for k in policy_keys) < min(order.index(k) for k in pod_keys)
            # ...and no table the switch held meanwhile forwarded to the Pod without its policy.
            for table in fake.tables:
                keys = {k for k, _ in table}
                assert fwd_key(POD) not in keys or policy_keys <= keys
            assert {k for k, _ in fake.tables[-1]} == set(fake.flows)
    run(main(), timeout=20)


def test_a_deleted_pod_stops_forwarding_with_its_policy_in_one_bundle(sock_path: str, state_dir) -> None:  # noqa: F811
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            fake = n.r.fake
            await n.engine.apply([Namespace("x")], [Pod("x", "a", (("app", "web"),))], policies=[drop_web()])
            before = set(fake.flows)
            await n.engine.pod_added(POD)
            commits, received = fake.commits, len(fake.received)
            await n.engine.pod_deleted(POD)
            assert fake.commits == commits + 1
            assert ofp.OFPT_FLOW_MOD not in [t for t, _ in fake.received[received:]]
            assert set(fake.flows) == before == {f.key for f in n.r.chan.desired_flows}
            await n.engine.pod_deleted(POD)  # again (a retried DEL): nothing left to remove, no error
    run(main(), timeout=20)


def test_a_small_pod_change_takes_no_thread_hop_and_a_big_one_compiles_off_the_loop(
        sock_path: str, state_dir, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    async def main() -> None:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        async with node(sock_path, state_dir) as n:
            await n.engine.apply([Namespace("x")], [Pod("x", "a", (("app", "web"),))], policies=[drop_web()])
            executor.calls.clear()
            await n.engine.pod_added(POD)  # known Pod, tiny state: compiled and encoded on the loop
            await n.engine.pod_deleted(POD)
            assert executor.calls == []
            await n.engine.pod_added(PEER)  # no Pod object: its class may be new, so a thread
            assert "_plan" in executor.calls
            executor.calls.clear()
            monkeypatch.setattr(engine_module, "LOOP_COMPILE_ITEMS", 0)  # the state outgrows the budget
            await n.engine.pod_added(POD)
            assert "_plan" in executor.calls
            assert fwd_key(POD) in n.r.fake.flows and fwd_key(PEER) in n.r.fake.flows
        executor.shutdown()
    run(main(), timeout=20)
