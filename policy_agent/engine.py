"""Keeps OVS in line with the policy state: recompiles on every change, sends only the difference.

Ordering is the point of this module. A new Pod's policy flows are confirmed
(barrier) before its classifier and forwarding flows exist, so no packet of
the Pod is forwarded without policy. On changes, new flows go in before stale
ones are deleted, so enforcement never has a gap.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Protocol, Sequence

from packetin import messages
from policy_agent.cni.state import PodInterfaceInfo
from policy_agent.errors import AgentError
from policy_agent.ovs import tables
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies
from policy_agent.policy.model import STANDARD_TIERS, Namespace, Pod, Policy, Tier
from policy_agent.policy.rules import RuleRegistry

log = logging.getLogger(__name__)

FlowKey = tuple[Any, ...]


class PodUnknown(AgentError):
    """CNI ADD for a Pod whose object (labels) has not arrived."""


class FlowProgrammer(Protocol):
    """What the engine needs of the switch (the OpenFlow channel): each call returns once the
    switch has confirmed it, which is what makes the engine's ordering hold."""

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    async def install_meters(self, meters: Sequence[messages.MeterSpec]) -> None: ...


class PolicyEngine:
    """Owns the policy state and the policy/Pod flows on one bridge."""

    def __init__(self, channel: FlowProgrammer, registry: RuleRegistry, *, round_: int,
                 meters: Callable[[], bool], meter_specs: Iterable[messages.MeterSpec] = (),
                 pod_wait: float | None = None) -> None:
        self._channel = channel
        self.registry = registry
        self.round_ = round_
        self._meters = meters
        self._meter_specs = list(meter_specs)
        self.namespaces: dict[str, Namespace] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.policies: dict[tuple[str, str, str], Policy] = {}
        self.tiers: dict[str, Tier] = {}
        self.endpoints: dict[tuple[str, str], Endpoint] = {}
        self._by_ip: dict[str, tuple[str, str]] = {}
        self._priorities: dict[int, dict[str, int]] = {}
        self._policy_flows: dict[FlowKey, messages.FlowSpec] = {}
        self._lock = asyncio.Lock()
        self.syncs = 0
        # With a Kubernetes source, a Pod's labels arrive by watch and may trail its
        # CNI ADD: wait this long for them rather than realise policy without them.
        self._pod_wait = pod_wait
        self._pods_changed = asyncio.Event()

    async def start(self) -> None:
        """Meters and the fixed pipeline (idempotent: flows are ADDs, meters add-or-modify)."""
        if self._meters() and self._meter_specs:
            await self._channel.install_meters(self._meter_specs)
        await self._channel.install_flows(tables.fixed_flows(self.round_))

    # --- objects ---------------------------------------------------------------------

    async def apply(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                    tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None:
        async with self._lock:
            for ns in namespaces:
                self.namespaces[ns.name] = ns
            for pod in pods:
                self.pods[pod.key] = pod
                self._pods_changed.set()
                ep = self.endpoints.get(pod.key)
                if ep is not None:  # labels of a running Pod changed
                    self.endpoints[pod.key] = Endpoint(pod, ep.ip, ep.mac, ep.ofport)
            for tier in tiers:
                self.tiers[tier.name] = tier
            for policy in policies:
                self.policies[policy.key] = policy
            await self._sync()

    async def delete(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                     tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None:
        async with self._lock:
            for ns in namespaces:
                self.namespaces.pop(ns.name, None)
            for pod in pods:
                self.pods.pop(pod.key, None)
            for tier in tiers:
                self.tiers.pop(tier.name, None)
            for policy in policies:
                self.policies.pop(policy.key, None)
            await self._sync()

    # --- Pods (the CNI server's hooks) -----------------------------------------------

    async def pod_added(self, info: PodInterfaceInfo) -> None:
        """Realise every policy that selects the Pod or names it, then let it forward."""
        key = (info.namespace, info.name)
        if self._pod_wait is not None and key not in self.pods:
            await self._wait_for_pod(key, self._pod_wait)
        pod = self.pods.get(key) or Pod(namespace=info.namespace, name=info.name)
        async with self._lock:
            self.endpoints[key] = Endpoint(pod, info.ip, info.mac, info.ofport)
            self._by_ip[info.ip] = key
            await self._sync()
            await self._channel.install_flows(tables.pod_flows(self.round_, ip=info.ip, mac=info.mac,
                                                          ofport=info.ofport))

    async def _wait_for_pod(self, key: tuple[str, str], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while key not in self.pods:
            left = deadline - loop.time()
            if left <= 0:
                raise PodUnknown(f"Pod {key[0]}/{key[1]} is not known to the agent after {timeout:.0f}s: "
                                 "its labels decide its policy, so it gets no network yet (CNI will retry)")
            self._pods_changed.clear()
            try:
                await asyncio.wait_for(self._pods_changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def pod_deleted(self, info: PodInterfaceInfo) -> None:
        """Stop forwarding first, then drop the Pod from policy."""
        key = (info.namespace, info.name)
        async with self._lock:
            ep = self.endpoints.pop(key, None)
            if ep is not None:
                self._by_ip.pop(ep.ip, None)
                await self._channel.delete_flows(tables.pod_flows(self.round_, ip=ep.ip, mac=ep.mac, ofport=ep.ofport))
            await self._sync()

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        """(namespace, name) of the running Pod with this address (auditlog's PodDirectory)."""
        return self._by_ip.get(ip)

    # --- sync ------------------------------------------------------------------------

    def state(self) -> ClusterState:
        tiers = dict(STANDARD_TIERS)
        tiers.update({t.name: t.priority for t in self.tiers.values()})
        return ClusterState(namespaces=dict(self.namespaces), endpoints=tuple(self.endpoints.values()),
                            policies=tuple(self.policies.values()), tiers=tiers, meters=self._meters(),
                            round_=self.round_)

    async def _sync(self) -> None:
        compiled = compile_policies(self.state(), self._priorities)
        desired = {f.key: f for f in compiled.flows}
        current = self._policy_flows
        add = [f for k, f in desired.items() if current.get(k) != f]
        stale = [f for k, f in current.items() if k not in desired]
        # Records for packet-ins of old and new rules stay enrichable during the switch-over.
        self.registry.replace({**{r.rule_id: r for r in self.registry.all()}, **compiled.rules})
        if add:
            await self._channel.install_flows(add)
        if stale:
            await self._channel.delete_flows(stale)
        self._policy_flows = desired
        self._priorities = compiled.priorities
        self.registry.replace(compiled.rules)
        self.syncs += 1
        log.debug("policy sync #%d: %d flows (+%d -%d), %d rules", self.syncs, len(desired), len(add),
                  len(stale), len(compiled.rules))
