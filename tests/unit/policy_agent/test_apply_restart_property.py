"""Property: after any sequence of applies (valid or not) and restarts, the switch holds exactly
compile(store) plus the store's generation marker, and the store holds exactly what the operator
was told succeeded.

Against the fake switch: the channel, engine, local API and applied store are the real ones; a
restart is a new channel and engine (next round) over the same state dir and the same switch,
brought up in the agent's order (tests/integration/test_apply_restart_ovs.py runs the Agent
itself against a real OVS, with fewer examples). The fake switch cannot read a logged K8s
isolation flow (os-ken cannot parse controller2 with a meter id) and refuses it: here that
stands in for a switch refusing a change, which must leave everything as it was.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings

from packetin import messages
from packetin.channel import ChannelSettings, OpenFlowChannel
from policy_agent.cni.state import PodInterfaceInfo
from policy_agent.engine import PolicyEngine
from policy_agent.ovs import tables
from policy_agent.policy.manifests import load_text
from policy_agent.policy.rules import RuleRegistry
from policy_agent.sources.applied_store import AppliedStore
from policy_agent.sources.apply_intent import StoreGeneration
from policy_agent.sources.local_api import LocalApi
from tests.support.apply_sequences import (
    REQUESTS, RESTART, RUNNING, RunningPod, Told, expected_flows, keyed, ranked, steps,
)
from tests.support.fake_switch import Flow, FakeSwitch
from tests.support.channel_rig import run


def pod_info(r: RunningPod) -> PodInterfaceInfo:
    return PodInterfaceInfo(namespace=r.namespace, name=r.name, container_id=f"c-{r.namespace}-{r.name}",
                            netns="/run/netns/none", ifname="eth0", ip=r.ip, prefix_len=24, mac=r.mac,
                            gateway=None, host_ifname=f"h{r.ofport}", ofport=r.ofport)


@dataclass
class Life:
    """One run of the agent's policy side."""

    channel: OpenFlowChannel
    engine: PolicyEngine
    api: LocalApi


async def start(sock: str, state: Path, round_: int) -> Life:
    """As Agent._start_policy: pipeline, the store re-applied, Pods re-realised, the previous
    round's leftovers deleted last."""
    channel = OpenFlowChannel(ChannelSettings(target=sock, request_timeout=10.0, reconnect_max=0.2),
                              lambda batch, now: None)
    channel.start()
    await channel.wait_ready(5.0)
    engine = PolicyEngine(channel, RuleRegistry(), round_=round_, meters=lambda: True)
    await engine.start()
    store = AppliedStore(state / "applied.yaml")
    objs = load_text(store.text(), str(store.path))  # with the store's generation marker, empty or not
    await engine.apply(objs.namespaces, objs.pods, objs.tiers, objs.policies, persist=StoreGeneration(store))
    for r in RUNNING:
        await engine.pod_added(pod_info(r))  # type: ignore[arg-type]
    if round_ > 1:
        await channel.delete_flows_by_cookie((round_ - 1) << tables.COOKIE_ROUND_SHIFT, tables.ROUND_MASK)
    return Life(channel, engine, LocalApi(state / "api.sock", engine, store))


def normalised(flows: dict[Any, Flow]) -> list[tuple[int, int, Any]]:
    return ranked((f.table, f.priority, (tuple(sorted(f.match.items())), tuple(map(str, f.actions)), f.goto, f.cookie))
                  for f in flows.values())


def as_switch_table(specs: list[messages.FlowSpec]) -> dict[Any, Flow]:
    """The table a switch holds after these flows are added to an empty one (the fake's own reading)."""
    reader = FakeSwitch("unused", refuse_out_port=None)
    table: dict[Any, Flow] = {}
    for f in specs:
        if reader._flow_mod(messages.serialize(messages.flow_add(f), 1), 1, table, []) is not None:
            raise AssertionError(f"the fake switch refuses {f.describe()}")
    return table


async def play(sequence: list[str], sock: str, state: Path) -> None:
    switch = FakeSwitch(sock)
    await switch.start()
    round_, told = 1, Told()
    life = await start(sock, state, round_)
    try:
        for step in sequence:
            if step == RESTART:
                await life.channel.close()
                round_ += 1
                life = await start(sock, state, round_)
            else:
                op, text = REQUESTS[step]
                reply = await life.api.handle({"op": op, "manifests": text, "source": step})
                if reply["ok"]:
                    told.succeeded(op, text)
            store = AppliedStore(state / "applied.yaml")
            stored = store.objects()
            assert keyed(stored) == told.objects, f"after {step}: the store differs from what the operator was told"
            marker = tables.generation_marker(round_, store.generation)  # the store's generation, in OVS too
            want = normalised(as_switch_table([*expected_flows(stored, RUNNING, round_), marker]))
            assert normalised(switch.flows) == want, (f"after {step}: the switch does not hold compile(store) "
                                                      "and the store's generation")
    finally:
        await life.channel.close()
        await switch.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
# Found by this test: a deleted Pod object's running Pod kept its labels until a restart dropped them.
@example(["base", "baseline-egress", "delete-pod-xb"])
def test_the_switch_holds_compile_of_the_store_and_the_store_what_the_operator_was_told(sequence: list[str]) -> None:
    d = Path(tempfile.mkdtemp(prefix="npa-prop-", dir="/tmp"))  # AF_UNIX paths are limited to 108 bytes
    try:
        run(play(sequence, str(d / "br-int.mgmt"), d / "state"), timeout=60)
    finally:
        shutil.rmtree(d, ignore_errors=True)
