"""Property, against a real OVS and the Agent itself: after any sequence of `npaudit apply|delete`
requests (valid or not) and agent restarts, br-int holds exactly compile(store) plus the store's
generation marker, and the store exactly what the operator was told succeeded.

A restart is a new Agent over the same state dir and the same OVS. The Pods are running ones
(CNI state from before, as the agent finds it after a restart; their ports need not exist).
"compile(store)" is installed on a second bridge of the same OVS through a plain channel, so
that both sides are read back by ovs-ofctl in the same normal form.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings

from meters.ovs import MeterLimits, desired_meters
from packetin import messages
from packetin.channel import ChannelSettings, OpenFlowChannel
from policy_agent.agent import Agent
from policy_agent.cni.state import READY, ContainerState, ContainerStates, PodInterfaceInfo
from policy_agent.config.loader import loads
from policy_agent.ovs import tables
from policy_agent.sources.applied_store import AppliedStore
from policy_agent.sources.local_api import call
from tests.support.apply_sequences import (
    REQUESTS, RESTART, RUNNING, RunningPod, Told, expected_flows, keyed, ranked, steps,
)
from tests.support.bridge import BRIDGE, PrivateBridge, private_bridge

REFERENCE = "br-ref"


@pytest.fixture(scope="module")
def ovs() -> Iterator[PrivateBridge]:
    with private_bridge("npap") as env:
        env.db.ensure_bridge(REFERENCE, "netdev")
        env.db.ensure_controller(REFERENCE, f"punix:{env.run_dir / (REFERENCE + '.npaudit')}", 512)
        env.db.wait_socket(env.run_dir / (REFERENCE + ".npaudit"))
        yield env


def ofctl(env: PrivateBridge, *args: str) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", *args], capture_output=True, text=True,
                          check=True, cwd=env.run_dir).stdout


def dump(env: PrivateBridge, bridge: str) -> list[tuple[int, int, Any]]:
    """A bridge's flows as ovs-ofctl prints them, priorities ranked within each table."""
    out = []
    for line in ofctl(env, "--no-stats", "--no-names", "dump-flows", f"unix:{env.run_dir / (bridge + '.mgmt')}"
                      ).splitlines():
        m = re.search(r"table=(\d+), priority=(\d+)", line)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), line.replace(m.group(0), "").strip()))
    return ranked(out)


def running_state(r: RunningPod) -> ContainerState:
    info = PodInterfaceInfo(namespace=r.namespace, name=r.name, container_id=f"c{r.ofport}", netns="/run/netns/gone",
                            ifname="eth0", ip=r.ip, prefix_len=24, mac=r.mac, gateway=None,
                            host_ifname=f"npap{r.ofport}", ofport=r.ofport)
    return ContainerState(phase=READY, info=info, host_mac=r.mac, ipam_netconf={}, result={"cniVersion": "1.0.0"})


class Reference:
    """compile(store) on the reference bridge, through a channel of its own."""

    def __init__(self, env: PrivateBridge) -> None:
        self.env = env
        self.channel = OpenFlowChannel(ChannelSettings(target=str(env.run_dir / (REFERENCE + ".npaudit"))),
                                       lambda batch, now: None)

    async def __aenter__(self) -> "Reference":
        self.channel.start()
        await self.channel.wait_ready(10)
        await self.channel.install_meters(desired_meters(MeterLimits((100, 10), (100, 10), (100, 10)), True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def holds(self, flows: list[messages.FlowSpec]) -> list[tuple[int, int, Any]]:
        keys = {f.key for f in flows}
        await self.channel.commit_flows(flows, [f for f in self.channel.desired_flows if f.key not in keys])
        return await asyncio.to_thread(dump, self.env, REFERENCE)


async def play(env: PrivateBridge, sequence: list[str], state: Path) -> None:
    for r in RUNNING:
        ContainerStates(state / "cni" / "containers").save(running_state(r))
    config = loads(f"state_dir: {state}\n"
                   f"ovs: {{run_dir: {env.run_dir}, netns: {env.netns}, bridge: {BRIDGE}}}\n"
                   "metrics: {listen: ''}\naudit: {enabled: false}\n")
    told = Told()
    agent = Agent(config)
    await agent.start()
    try:
        async with Reference(env) as reference:
            for step in sequence:
                if step == RESTART:
                    await agent.stop()
                    agent = Agent(config)
                    await agent.start()
                else:
                    op, text = REQUESTS[step]
                    reply = await asyncio.to_thread(call, config.api_socket,
                                                    {"op": op, "manifests": text, "source": step})
                    if reply["ok"]:
                        told.succeeded(op, text)
                store = AppliedStore(state / "applied.yaml")
                stored = store.objects()
                assert keyed(stored) == told.objects, f"after {step}: the store differs from what the operator was told"
                marker = tables.generation_marker(agent.round_, store.generation)  # the store's generation in OVS too
                want = await reference.holds([*expected_flows(stored, RUNNING, agent.round_), marker])
                got = await asyncio.to_thread(dump, env, BRIDGE)
                assert got == want, f"after {step}: br-int does not hold compile(store) and the store's generation"
    finally:
        await agent.stop()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sequence=steps)
@example(sequence=["base", "baseline-egress", "restart", "delete-pod-xb", "logging-x", "np-x", "restart"])
def test_ovs_holds_compile_of_the_store_and_the_store_what_the_operator_was_told(
        ovs: PrivateBridge, sequence: list[str]) -> None:
    state = Path(tempfile.mkdtemp(prefix="npap-", dir="/tmp"))
    try:
        for bridge in (BRIDGE, REFERENCE):  # what the previous example left: a fresh state dir starts at round 1
            ofctl(ovs, "del-flows", f"unix:{ovs.run_dir / (bridge + '.mgmt')}")
        asyncio.run(asyncio.wait_for(play(ovs, sequence, state), 120))
    finally:
        shutil.rmtree(state, ignore_errors=True)
