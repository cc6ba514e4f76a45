"""Keeps OVS in line with the policy state: every change is a transaction, sent as one difference.

A change (apply, delete, a Pod coming or going) is validated, compiled off the
event loop (a small Pod change on it: the thread hop would cost more),
incrementally (only the rules the change can affect are rebuilt,
policy/incremental.py), its intent made durable by the caller's hook (`Durable`),
sent to the switch as one atomic bundle of the difference together with the
intent's generation marker (ovs/tables.py), kept by the hook, and only then becomes
the engine's state (so the switch never holds a change no intent names: a crash
in between is settled at the next start, sources/apply_intent.py). Any failure
leaves the engine, the switch and the store as they were, so one bad change can
neither wedge the engine nor be enforced after being refused.
Rules match Pods by class (policy/classes.py), and the classes of Pods known before
they run are matched already: a Pod's ADD usually adds just its own flows.

Ordering matters too: a new Pod's classifier and forwarding flows go in the
same atomic bundle as its policy flows, after them, so no packet of the Pod is
forwarded without policy (one bundle: two round trips to the switch, where
policy then forwarding took five).
After every committed change the switch's datapath flow cache
is purged, so that every new connection is translated against the new tables
(not after a Pod's ADD: its flows concern only its own traffic, which no cached
flow can forward before its forwarding flows exist);
connections already established stay up (as in Antrea): conntrack's +est
shortcut forwards them whatever the new policy says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from packetin import messages
from packetin.errors import PacketInError
from packetin.tasks import wait_event
from policy_agent.cni.state import PodInterfaceInfo
from policy_agent.errors import AgentError, ApplyFailed, PolicyRejected  # the engine's own two are raised here
from policy_agent.ovs import tables
from policy_agent.cluster.pod_directory import RemoteDirectory
from policy_agent.policy import incremental
from policy_agent.policy.validation import policy_name, tier_problems
from policy_agent.policy.compiler import ClusterState, Endpoint
from policy_agent.policy.model import STANDARD_TIERS, Namespace, Pod, Policy, Tier
from policy_agent.policy.rules import RuleRegistry
from policy_agent.policy.tunnel_flows import admission_next
from policy_agent.limits.meter_sync import RuleMeters

log = logging.getLogger(__name__)

FlowKey = tuple[Any, ...]
PodFlows = tuple[Sequence[messages.FlowSpec], Sequence[messages.FlowSpec]]  # (to install, to delete)

# A Pod change is compiled on the event loop when its estimated work, in Pods walked (a rule
# naming each Pod counts once per Pod; LOOP_RULES_PER_ITEM rules walked count as one), is at most
# LOOP_COMPILE_ITEMS: a few ms of CPU at most (agent_work_replay in bench/cni_latency.py measures it).
LOOP_COMPILE_ITEMS = 1_000
LOOP_RULES_PER_ITEM = 10


class PodUnknown(AgentError):
    """CNI ADD for a Pod whose object (labels) has not arrived."""


class Durable(Protocol):
    """Keeps a change (the applied store), in steps around the switch's commit; each runs in a thread."""

    def stage(self) -> int:
        """Before the commit: make the change's outcome durable as an intent and return its generation,
        which the switch takes in the same bundle as the flows (its generation marker)."""
        ...

    def commit(self) -> None:
        """The switch took the change: the intent becomes what is kept."""
        ...

    def abandon(self) -> None:
        """The change did not go in, or was taken back: the intent goes."""
        ...


class DatapathCache(Protocol):
    """The switch's cache of translated flows (OVS megaflows): `purge` (blocking) returns once
    the cache is empty, so no packet is forwarded by a translation of the old tables."""

    def purge(self) -> None: ...


class VerdictCache(Protocol):
    """Verdicts cached outside OVS (the XDP drop offload): `invalidate` returns once none is left
    that the change about to go in could contradict."""

    async def invalidate(self) -> None: ...


class FlowProgrammer(Protocol):
    """What the engine needs of the switch (the OpenFlow channel): each call returns once the
    switch has confirmed it, which is what makes the engine's ordering hold."""

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    async def commit_flows(self, install: Sequence[messages.FlowSpec],
                           delete: Sequence[messages.FlowSpec]) -> None: ...

    async def install_meters(self, meters: Sequence[messages.MeterSpec]) -> None: ...


@dataclass(frozen=True)
class _Objects:
    """The engine's inputs; a change builds a new one and swaps it in only once it is applied."""

    namespaces: dict[str, Namespace] = field(default_factory=dict)
    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    tiers: dict[str, Tier] = field(default_factory=dict)
    policies: dict[tuple[str, str, str], Policy] = field(default_factory=dict)
    endpoints: dict[tuple[str, str], Endpoint] = field(default_factory=dict)
    remote: RemoteDirectory = field(default_factory=RemoteDirectory)  # of pods and endpoints, kept per change

    def changed(self, touched: Iterable[tuple[str, str]], **fields: Any) -> "_Objects":
        """The next state: `fields` replaced, its directory updated for the Pods `touched` alone."""
        nxt = replace(self, **fields)
        return replace(nxt, remote=self.remote.update(nxt.endpoints, nxt.pods, touched))


@dataclass(frozen=True)
class _Plan:
    compiled: incremental.Snapshot
    put: dict[FlowKey, messages.FlowSpec]  # the desired flows: the current ones without `gone`, with `put`
    gone: list[FlowKey]
    add: list[messages.FlowSpec]  # new or changed flows
    stale: list[messages.FlowSpec]  # flows of the current state that are no longer desired


def _plan(state: ClusterState, previous: incremental.Snapshot | None,
          current: dict[FlowKey, messages.FlowSpec], hint: incremental.Hint | None = None) -> _Plan:
    """Compile what the change affects and diff it against the current flows (pure: runs in
    a worker thread). `current` is what `previous` installed; it is only looked up, never
    copied (a Pod's ADD touches a few of thousands)."""
    compiled, delta = incremental.update(previous, state, hint)
    put = {f.key: f for f in delta.added}
    gone_keys = {f.key for f in delta.removed if f.key not in put and current.get(f.key) == f}
    add = [f for f in delta.added if current.get(f.key) != f and put[f.key] is f]
    stale = [f for f in delta.removed if f.key not in put and (f.key in gone_keys or f.key not in current)]
    return _Plan(compiled, put, list(gone_keys), add, stale)


class PolicyEngine:
    """Owns the policy state and the policy/Pod flows on one bridge."""

    def __init__(self, channel: FlowProgrammer, registry: RuleRegistry, *, round_: int,
                 meters: Callable[[], bool], meter_specs: Iterable[messages.MeterSpec] = (),
                 pod_wait: float | None = None, datapath: DatapathCache | None = None,
                 clock: Callable[[], float] = time.monotonic, verdicts: VerdictCache | None = None,
                 rule_meters: RuleMeters | None = None,
                 admission: Callable[[str], messages.FlowSpec] | None = None) -> None:
        self._channel = channel
        # Per address of another node's Pod, the flow taking its packets from the tunnel (cluster.deny_unknown_sources)
        self._admission = admission
        self._admitted: dict[str, messages.FlowSpec] = {}
        self._admitted_of: Mapping[tuple[str, str], Endpoint] | None = None  # the endpoints `_admitted` is of
        self._rule_meters = rule_meters  # per-rule fair meters (meters.per_rule), None: off
        self._verdicts = verdicts
        self._datapath = datapath
        self.purge_failures = 0
        self._clock = clock
        self.registry = registry
        self.round_ = round_
        self._meters = meters
        self._meter_specs = list(meter_specs)
        self._objects = _Objects()
        self._by_ip: dict[str, tuple[str, str]] = {}
        self._compiled: incremental.Snapshot | None = None
        self._policy_flows: dict[FlowKey, messages.FlowSpec] = {}
        self._marker: messages.FlowSpec | None = None  # the generation marker the switch holds (tables.py)
        self._lock = asyncio.Lock()
        self.syncs = 0
        # With a Kubernetes source, a Pod's labels arrive by watch and may trail its
        # CNI ADD: wait this long for them rather than realise policy without them.
        self._pod_wait = pod_wait
        self._pods_changed = asyncio.Event()

    @property
    def changing(self) -> bool:
        """True while a change is being compiled or put in (verdicts judged meanwhile may be stale)."""
        return self._lock.locked()

    @property
    def namespaces(self) -> dict[str, Namespace]:
        return self._objects.namespaces

    @property
    def pods(self) -> dict[tuple[str, str], Pod]:
        return self._objects.pods

    @property
    def tiers(self) -> dict[str, Tier]:
        return self._objects.tiers

    @property
    def policies(self) -> dict[tuple[str, str, str], Policy]:
        return self._objects.policies

    @property
    def compiled(self) -> incremental.Snapshot | None:
        """The compiled state in force (None before the first sync): what `npaudit get` reads."""
        return self._compiled

    @property
    def endpoints(self) -> dict[tuple[str, str], Endpoint]:
        return self._objects.endpoints

    async def start(self) -> None:
        """Meters and the fixed pipeline (idempotent: flows are ADDs, meters add-or-modify)."""
        if self._meters() and self._meter_specs:
            await self._channel.install_meters(self._meter_specs)
        await self._channel.install_flows(tables.fixed_flows(self.round_))

    # --- objects ---------------------------------------------------------------------

    async def apply(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                    tiers: Iterable[Tier] = (), policies: Iterable[Policy] = (), *,
                    persist: Durable | None = None) -> None:
        """Add or replace objects, all or nothing. `persist` makes the change durable (Durable: its
        intent staged before the switch takes it, committed once it has, before the engine takes it);
        if a step raises, the switch is put back and ApplyFailed raised."""
        async with self._lock:
            cur = self._objects
            pods = list(pods)
            endpoints = dict(cur.endpoints)
            for pod in pods:
                ep = endpoints.get(pod.key)
                if ep is not None:  # labels of a running Pod changed
                    endpoints[pod.key] = Endpoint(pod, ep.ip, ep.mac, ep.ofport)
            named = {t.name: t for t in tiers}
            policies = list(policies)
            nxt = cur.changed([pod.key for pod in pods],
                              namespaces={**cur.namespaces, **{ns.name: ns for ns in namespaces}},
                              pods={**cur.pods, **{pod.key: pod for pod in pods}},
                              tiers={**cur.tiers, **named}, policies={**cur.policies, **{p.key: p for p in policies}},
                              endpoints=endpoints)
            problems = tier_problems(nxt.tiers, nxt.policies.values(), named, policies)
            await self._transact(nxt, persist, problems, policies, why="apply")
            if pods:
                self._pods_changed.set()

    async def delete(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                     tiers: Iterable[Tier] = (), policies: Iterable[Policy] = (), *,
                     persist: Durable | None = None) -> None:
        """Remove objects, all or nothing (see apply). Deleting a Tier that a policy left in
        place still uses is refused (PolicyRejected names those policies)."""
        async with self._lock:
            cur = self._objects
            gone_ns, gone_pods = {ns.name for ns in namespaces}, {pod.key for pod in pods}
            gone_tiers, gone_policies = {t.name for t in tiers}, {p.key for p in policies}
            # A running Pod whose object goes keeps no labels, as a restart would find it.
            endpoints = {k: Endpoint(Pod(*k), ep.ip, ep.mac, ep.ofport) if k in gone_pods else ep
                         for k, ep in cur.endpoints.items()}
            nxt = cur.changed(gone_pods,
                              namespaces={k: v for k, v in cur.namespaces.items() if k not in gone_ns},
                              pods={k: v for k, v in cur.pods.items() if k not in gone_pods},
                              tiers={k: v for k, v in cur.tiers.items() if k not in gone_tiers},
                              policies={k: v for k, v in cur.policies.items() if k not in gone_policies},
                              endpoints=endpoints)
            problems = tier_problems(nxt.tiers, nxt.policies.values(), deleted=gone_tiers)
            await self._transact(nxt, persist, problems, why="delete")

    # --- Pods (the CNI server's hooks) -----------------------------------------------

    async def pod_added(self, info: PodInterfaceInfo) -> None:
        """Realise every policy that selects the Pod or names it, and let it forward: one bundle,
        its forwarding flows after the policy flows, committed atomically (no moment where the Pod
        forwards without its policy). With no policy flow to change, a plain confirmed batch."""
        key = (info.namespace, info.name)
        if self._pod_wait is not None and key not in self.pods:
            await self._wait_for_pod(key, self._pod_wait)
        async with self._lock:
            cur = self._objects
            pod = cur.pods.get(key) or Pod(namespace=info.namespace, name=info.name)
            endpoints = {**cur.endpoints, key: Endpoint(pod, info.ip, info.mac, info.ofport)}
            forwarding = tables.pod_flows(self.round_, ip=info.ip, mac=info.mac, ofport=info.ofport)
            await self._transact(cur.changed([key], endpoints=endpoints), why="pod-added", purge=False,
                                 pod=(forwarding, ()), on_loop=self._small_pod_change(key))

    async def _wait_for_pod(self, key: tuple[str, str], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while key not in self.pods:
            left = deadline - loop.time()
            if left <= 0:
                raise PodUnknown(f"Pod {key[0]}/{key[1]} is not known to the agent after {timeout:.0f}s: "
                                 "its labels decide its policy, so it gets no network yet (CNI will retry)")
            self._pods_changed.clear()
            await wait_event(self._pods_changed, left)

    async def pod_deleted(self, info: PodInterfaceInfo) -> None:
        """Stop forwarding and drop the Pod from policy, in one bundle (atomic: the Pod never
        forwards without its policy either way)."""
        key = (info.namespace, info.name)
        async with self._lock:
            cur = self._objects
            ep = cur.endpoints.get(key)
            forwarding = [] if ep is None else tables.pod_flows(self.round_, ip=ep.ip, mac=ep.mac, ofport=ep.ofport)
            endpoints = {k: v for k, v in cur.endpoints.items() if k != key}
            await self._transact(cur.changed([key], endpoints=endpoints), why="pod-deleted",
                                 pod=((), forwarding), on_loop=self._small_pod_change(key))

    def _small_pod_change(self, key: tuple[str, str]) -> bool:
        """Whether a change of this Pod's interface compiles in well under a millisecond or so, so
        cheaply that the thread hop would cost more (several ms on a loaded node): a Pod whose
        object is known (its class exists already, so no rule naming classes is rebuilt), and a
        state small enough that walking its Pods and the rules naming each Pod stays cheap.
        Anything else compiles off the loop, which keeps answering echo and packet-ins."""
        snap = self._compiled
        if snap is None or key not in self._objects.pods:
            return False
        per_pod_rules = len(snap.placed) - len(snap.by_class)
        items = len(self._objects.endpoints) * (1 + per_pod_rules) + len(snap.placed) // LOOP_RULES_PER_ITEM
        return items <= LOOP_COMPILE_ITEMS

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        """(namespace, name) of the Pod with this address, on any node; None: unknown (auditlog's PodDirectory)."""
        return self._by_ip.get(ip)

    def ip_table(self) -> Mapping[str, tuple[str, str]]:
        """Address -> (namespace, name) of every Pod known: never changed once built (a change of Pods swaps
        in a new one), so a reader may keep what it worked out from it while it gets the same object."""
        return self._by_ip

    # --- the transaction ---------------------------------------------------------------

    def state(self) -> ClusterState:
        return self._cluster_state(self._objects)

    def _cluster_state(self, objs: _Objects) -> ClusterState:
        """The compiler's input for `objs`. When only the running Pods differ from the engine's
        state (a Pod's ADD or DEL), the rest is the last compiled state's, unchanged: no copy of
        every policy, and the compiler sees at once that none changed."""
        cur, last = self._objects, self._compiled.state if self._compiled is not None else None
        if last is not None and objs.namespaces is cur.namespaces and objs.policies is cur.policies \
                and objs.pods is cur.pods and objs.tiers is cur.tiers:
            return replace(last, endpoints=objs.remote.with_remote(),
                           meters=self._meters())
        tiers = dict(STANDARD_TIERS)
        tiers.update({t.name: t.priority for t in objs.tiers.values()})
        return ClusterState(namespaces=dict(objs.namespaces),
                            endpoints=objs.remote.with_remote(),
                            policies=tuple(objs.policies.values()), tiers=tiers, meters=self._meters(),
                            round_=self.round_, pods=tuple(objs.pods.values()),
                            rule_meters=self._rule_meters.range if self._rule_meters is not None else None)

    async def _transact(self, nxt: _Objects, persist: Durable | None = None, problems: Sequence[str] = (),
                        changed: Sequence[Policy] = (), *, why: str, purge: bool = True,
                        pod: PodFlows = ((), ()), on_loop: bool = False) -> None:
        try:
            await self._transact_flows(nxt, persist, problems, changed, why=why, purge=purge, pod=pod,
                                       on_loop=on_loop)
        finally:  # per-rule meters the plan in force does not name go, whichever way the change ended
            if self._rule_meters is not None:
                await self._rule_meters.settle(self._compiled.layout.meters if self._compiled else None)

    async def _transact_flows(self, nxt: _Objects, persist: Durable | None = None, problems: Sequence[str] = (),
                              changed: Sequence[Policy] = (), *, why: str, purge: bool = True,
                              pod: PodFlows = ((), ()), on_loop: bool = False) -> None:
        """validate -> compile (thread) -> stage intent (thread) -> one bundle with its marker -> (purge)
        -> commit intent (thread) -> swap. Call under the lock. `pod`: a Pod's forwarding flows
        installed after the policy flows / deleted in the same bundle (not with `persist`: an undo
        puts back policy flows only). `on_loop`: the change is small enough to compile without a
        thread hop."""
        started = self._clock()
        if problems:
            raise PolicyRejected(list(problems))
        try:
            directory = nxt.remote  # what changed since the state compiled last: the Pods it touched
            args = (self._cluster_state(nxt), self._compiled, self._policy_flows,
                    incremental.Hint(directory.by_key, nxt.pods, directory.touched, directory.base))
            # Off the loop unless small: the OpenFlow channel keeps answering echo and packet-ins.
            plan = _plan(*args) if on_loop else await asyncio.to_thread(_plan, *args)
        except Exception as exc:  # of any kind: a policy that cannot compile never becomes desired state
            names = ", ".join(policy_name(p) for p in changed[:3]) + (" ..." if len(changed) > 3 else "")
            raise PolicyRejected([f"{names or 'the policy state'}: cannot be compiled: "
                                  f"{type(exc).__name__}: {exc}"]) from exc
        # Records for packet-ins of old and new rules stay enrichable during the switch-over
        # (a Pod change keeps the rules as they were: nothing to merge then).
        same_rules = self._compiled is not None and plan.compiled.rules is self._compiled.rules
        old_rules = {} if same_rules else {r.rule_id: r for r in self.registry.all()}
        if not same_rules:
            self.registry.replace({**old_rules, **plan.compiled.rules})
        compiled = self._clock()
        if self._verdicts is not None and (plan.add or plan.stale):
            await self._verdicts.invalidate()  # before the new flows: a cached Drop never outlives its rule
        admit, unadmit, admitted = ([], [], self._admitted) if self._admission is None else admission_next(
            self._admitted, self._admitted_of, directory.base, directory.by_key, directory.touched, self._admission)
        marker: list[messages.FlowSpec] = []
        if persist is not None:  # the intent is durable before the switch can hold the change
            try:
                marker = [tables.generation_marker(self.round_, await asyncio.to_thread(persist.stage))]
            except Exception as exc:
                if not same_rules:
                    self.registry.replace(old_rules)
                raise ApplyFailed(f"could not save the change, nothing was applied: {exc}") from exc
        try:
            if self._rule_meters is not None:  # outside the bundle (OVS), before the flows that name them
                await self._rule_meters.prepare(plan.compiled.layout.meters)
            if plan.add or plan.stale or marker:
                await self._channel.commit_flows([*plan.add, *admit, *pod[0], *marker],
                                                 [*pod[1], *plan.stale, *unadmit])
            else:  # no policy flow changes, nothing to order a Pod's flows against: one round trip, not two
                for flows, send in ((unadmit, self._channel.delete_flows), (admit, self._channel.install_flows),
                                    (pod[0], self._channel.install_flows), (pod[1], self._channel.delete_flows)):
                    if flows:
                        await send(flows)
        except (PacketInError, asyncio.TimeoutError) as exc:
            if persist is not None:
                await asyncio.to_thread(persist.abandon)
            if not same_rules:
                self.registry.replace(old_rules)
            raise ApplyFailed(f"the switch did not take the change, nothing was applied: "
                              f"{exc or type(exc).__name__}") from exc
        previous_admitted, self._admitted = self._admitted, admitted
        previous_admitted_of, self._admitted_of = self._admitted_of, directory.by_key
        previous_marker = self._marker
        if marker:
            self._marker = marker[0]
        if purge:
            await self._purge_datapath(plan.add or plan.stale)
        switched = self._clock()
        if persist is not None:
            try:
                await asyncio.to_thread(persist.commit)
            except Exception as exc:
                await asyncio.to_thread(persist.abandon)
                if admit or unadmit:  # first: no address admitted that the policy put back does not know
                    await self._channel.commit_flows(unadmit, admit)
                self._admitted, self._admitted_of = previous_admitted, previous_admitted_of
                await self._undo(plan, nxt, exc, previous_marker)
                if not same_rules:
                    self.registry.replace(old_rules)
                raise ApplyFailed(f"could not save the change, nothing was applied: {exc}") from exc
        self._swap(nxt, plan)
        done = self._clock()
        # bench/cni_latency.py reads this line: the agent side of a policy change.
        log.info("policy sync #%d (%s): +%d -%d flows, %d in force; compile %.1f, switch %.1f, persist %.1f; "
                 "in %.1f ms%s", self.syncs, why, len(plan.add), len(plan.stale), len(self._policy_flows),
                 (compiled - started) * 1000, (switched - compiled) * 1000, (done - switched) * 1000,
                 (done - started) * 1000, " (compiled on the loop)" if on_loop else "")

    async def _undo(self, plan: _Plan, nxt: _Objects, cause: Exception, marker: messages.FlowSpec | None) -> None:
        """Put the switch back as it was before `plan` went in (after a failed persist), its
        generation `marker` too (None: it had none)."""
        current = self._policy_flows
        back = [current[f.key] for f in plan.add if f.key in current] + plan.stale
        extra = [f for f in plan.add if f.key not in current]
        if marker is not None:
            back.append(marker)
        elif self._marker is not None:
            extra.append(self._marker)
        try:
            await self._channel.commit_flows(back, extra)
            self._marker = marker
            await self._purge_datapath(back or extra)
        except (PacketInError, asyncio.TimeoutError) as exc:
            # The switch keeps the change (the channel replays it): so does the engine, and says so.
            self._swap(nxt, plan)
            raise ApplyFailed(f"could not save the change ({cause}) nor take it back from the switch ({exc}): "
                              "it is in force until the agent restarts") from exc

    async def _purge_datapath(self, changed: Sequence[messages.FlowSpec]) -> None:
        """After a committed change: a megaflow of the old tables must not admit new connections.
        A failure is logged and counted, not raised: the flows are in and the change stands."""
        if self._datapath is None or not changed:
            return
        try:
            await asyncio.to_thread(self._datapath.purge)
        except AgentError as exc:
            self.purge_failures += 1
            log.warning("policy sync #%d: %s; new connections may follow the old policy until OVS "
                        "revalidates its datapath flows", self.syncs + 1, exc)

    def _swap(self, nxt: _Objects, plan: _Plan) -> None:
        self._objects = nxt
        self._by_ip = nxt.remote.by_ip  # one swap: never a stale name (never changed once built)
        for key in plan.gone:  # in place: nothing else holds the dict (a plan only looks it up)
            del self._policy_flows[key]
        self._policy_flows.update(plan.put)
        if self._compiled is None or plan.compiled.rules is not self._compiled.rules:
            self.registry.replace(plan.compiled.rules)
        self._compiled = plan.compiled
        self.syncs += 1
