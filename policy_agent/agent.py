"""The composition root: builds OVS, the OpenFlow channel, the demux, the audit trail, policy and its sources,
and runs them in order."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from prometheus_client import CollectorRegistry

from auditlog.pipeline import AuditPipeline
from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.process import ProcessForwarder
from auditlog.syslog.status import SyslogStatus
from auditlog.writer import AuditWriter
from meters.ovs import MeterLimits, desired_meters
from packetin.channel import ChannelSettings, OpenFlowChannel
from packetin.demux import INLINE_MAX, Demux, Handler, chain_handlers
from packetin.gctune import settle_heap
from packetin.model import Category
from packetin.reader import InputPressure
from packetin.tasks import forget, within
from policy_agent import status
from policy_agent.state_dir import make_state_dir
from policy_agent.audit_trail import AuditTrail
from policy_agent.cluster.node_routes import NodeRoutes, NodeRoutesCollector, config_peers
from policy_agent.cluster.peer_nodes import NO_ADDRESS, KnownNodes, KnownNodesCollector
from policy_agent.cni.subnet import NodeSubnet, SubnetCollector
from policy_agent.config.loader import AgentConfig
from policy_agent.engine import PolicyEngine
from policy_agent.errors import AgentError, one_line
from policy_agent.limits import admission
from policy_agent.limits.losses import LossAccounting
from policy_agent.limits.meter_sync import build_rule_meters
from policy_agent.limits.rule_losses import describe_rule
from policy_agent.limits.offload_cache import DropOffload, OffloadCollector, OffloadPodHooks
from policy_agent.metrics import MeterCollector, OvsSupervisorCollector, build_registry, category_name
from policy_agent.ovs import tables
from policy_agent.ovs.coverage import DATAPATH_DROP_COUNTERS, CoverageReader
from policy_agent.ovs.port_stats import PortDropReader
from policy_agent.ovs.gateway import NodeGateway
from policy_agent.ovs.megaflows import MegaflowCache
from policy_agent.ovs.rounds import next_round
from policy_agent.ovs.switch import NodeSwitch
from policy_agent.ovs.tunnel import NodeUnderlay
from policy_agent.policy.gateway_flows import gateway_flows
from policy_agent.policy.manifests import load_text
from policy_agent.policy.rules import RuleRegistry
from policy_agent.policy_packetins import PolicyPacketIns
from policy_agent.sources.apply_intent import Settlement, StoreGeneration, settled_store
from policy_agent.sources.local_api import LocalApi
from policy_agent.sources.manifest_dir import ManifestDirectory
from policy_agent.sources import kubernetes_own_node as own_node
from policy_agent.traceflow.collector import TraceCollector
from policy_agent.traceflow.crossnode import CrossNode
from policy_agent.traceflow.flows import tunnel_flows as trace_tunnel_flows
from policy_agent.traceflow.service import TraceService

if TYPE_CHECKING:  # imported where they start: `npaudit` without CNI or Kubernetes never loads them
    from policy_agent.http.endpoints import HttpListener

    from kubernetes.client import ApiClient

    from policy_agent.cni.server import CniServer
    from policy_agent.sources.kubernetes import KubernetesSource

log = logging.getLogger(__name__)


# Seconds: a stop that takes this long or more says where the time went. A stop's caller gives it a grace
# period (Kubernetes: terminationGracePeriodSeconds, 30 s by default) and then kills it: a slow stop is near
# the point where the last records and the loss note are not written.
SLOW_STOP = 5.0
# Seconds each step before the packet-in drain may take (sources, servers, routes, traceflow and the
# channel): one that hangs is left behind, so the audit trail is still closed within the grace period.
STEP_BOUND = 5.0


class StopSteps:
    """How long each step of a stop took (`done(name)` at the end of each), and `report`: a WARNING naming
    the slowest steps when the whole took SLOW_STOP seconds or more."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = self._last = clock()
        self.steps: list[tuple[str, float]] = []

    def done(self, name: str) -> None:
        now = self._clock()
        self.steps.append((name, now - self._last))
        self._last = now

    async def bounded(self, name: str, *works: Callable[[], Awaitable[None]], bound: float | None = None) -> None:
        """`works` one after the other, given `bound` seconds in all (STEP_BOUND), then `done(name)`. Past it they
        are cancelled and not waited for (an ERROR says so): the stop goes on to what must not be skipped,
        the audit trail's close."""
        async def run() -> None:
            for work in works:
                await work()
        bound = STEP_BOUND if bound is None else bound
        task = asyncio.ensure_future(run())
        finished, _ = await asyncio.wait({task}, timeout=bound)
        if not finished:
            task.cancel()
            forget(task)
            log.error("stopping: %s did not end within %g s; left behind, the stop goes on", name, bound)
        elif (exc := task.exception()) is not None:
            log.error("stopping: %s failed: %s", name, one_line(exc), exc_info=exc)
        self.done(name)

    def report(self, slow: float = SLOW_STOP) -> float:
        """The stop's whole time so far; said at WARNING with its three slowest steps when `slow` or more."""
        total = self._last - self._start
        if total >= slow:
            slowest = sorted(self.steps, key=lambda step: -step[1])[:3]
            log.warning("stopping took %.1f s; slowest steps: %s", total,
                        ", ".join(f"{name} {took:.1f} s" for name, took in slowest))
        return total


class Agent:
    """One node agent. `handlers` maps a packet-in category to its subscriber."""

    def __init__(self, config: AgentConfig, handlers: dict[int, Handler] | None = None,
                 rules: RuleRegistry | None = None) -> None:
        self.config = config
        self._handlers = dict(handlers or {})
        self.gateway = NodeGateway.of(config.node_network, config.ovs)  # None without a Pod subnet
        self.subnet = NodeSubnet(config.node_network.pod_cidr, config.node_network.gateway)  # CNI IPAM's range
        self.underlay = NodeUnderlay.of(config.cluster, config.node_network, config.ovs)  # None: one node
        self.switch = NodeSwitch(config.ovs, controller=config.controller_target,
                                 openflow_target=config.openflow_target, gateway=self.gateway,
                                 underlay=self.underlay)
        # A read of a few packet-ins into an empty channel is handled at once, without a task wake-up.
        self.demux = Demux(inline_max=INLINE_MAX)
        self.channel = OpenFlowChannel(
            ChannelSettings(target=config.openflow_target, netns=config.openflow_netns,
                            echo_interval=config.openflow.echo_interval,
                            echo_timeout=config.openflow.echo_timeout,
                            reconnect_max=config.openflow.reconnect_max,
                            read_pace_max=config.openflow.read_pace_max),
            self.demux.dispatch,
            on_malformed=self.demux.count_malformed,
            # Overload: a read's packet-ins in groups; a lone one: its record first (Demux.lone); no pacing in a trace.
            on_groups=self.demux.dispatch_groups, on_lone=self.demux.lone, on_early=self.demux,
            coarse=lambda: self.audit is not None and self.audit.coarse, read_urgent=lambda: self.traceflow.waiting(),
        )
        self.ovs_counters = CoverageReader(config.ovs.ovs_rundir)
        self.registry: CollectorRegistry = build_registry(self.demux, self.channel, self.ovs_counters.read)
        self.registry.register(OvsSupervisorCollector(self.switch.supervisor))
        self.registry.register(SubnetCollector(self.subnet))
        # The node routes (a PeerSink; None for one node) take the other nodes as KnownNodes merges
        # and judges them: the config's peers (source "config") and the Node objects (Kubernetes mode).
        gateway = self.gateway
        self.routes = NodeRoutes(self.underlay, self.channel, lambda: self.round_,
                                 masquerade=gateway.exclude_from_masquerade if gateway is not None else None,
                                 refresh=config.cluster.underlay_refresh) if self.underlay is not None else None
        self.nodes = KnownNodes(lambda: self.subnet.cidr, downstream=self.routes)
        if own_node.wanted(config):  # still: its Node gave no address at start (a warning line said so)
            self.nodes.problems[NO_ADDRESS] += 1
        self.subnet.subscribe(lambda _cidr: self.nodes.refresh())
        self.registry.register(KnownNodesCollector(self.nodes))
        if self.routes is not None:
            self.registry.register(NodeRoutesCollector(self.routes, lambda: self.losses.unknown_source_drops(),
                                                       lambda: self.losses.unknown_vni_drops()))
        if config.cluster.peers:  # a source, once set, says the node subnets are all known
            self.nodes.set_peers("config", config_peers(config.cluster))
        self._gateway_task: asyncio.Task[None] | None = None
        self._metrics_server: HttpListener | None = None
        self.rules = rules if rules is not None else RuleRegistry()
        self.round_ = 0
        self.engine: PolicyEngine | None = None
        # Category 0: Rejects answered, LOG-flagged packet-ins audited (and shown on the
        # debug tap when the caller passed one in as the policy handler).
        pressure = InputPressure(self.channel.input_pressed, lambda: self.demux.admission_drops(Category.POLICY))
        self.trail = AuditTrail(config, self.rules, self.registry, engine=lambda: self.engine,
                                packetin_fill=lambda: self.demux.queue_fill(Category.POLICY),
                                pressed=pressure) if config.audit.enabled else None
        self.audit: AuditPipeline | None = self.trail.pipeline if self.trail is not None else None
        self.audit_writer: AuditWriter | None = self.trail.writer if self.trail is not None else None
        self.syslog: list[Forwarder | ProcessForwarder] = self.trail.forwarders if self.trail is not None else []
        # Meter statistics and the loss records stating what never became a record.
        audit, writer = self.audit, self.audit_writer
        self.port_drops = PortDropReader(self.switch.netns or None)  # its sockets kept open between windows
        self.losses = LossAccounting(
            self.channel, interval=config.meters.stats_interval, ovs_losses=self.ovs_counters.read,
            admission=lambda: {category_name(c): n for c, n in self.demux.stats().items()},
            writer_full=(lambda: audit.snapshot().writer_full) if audit is not None else lambda: 0,
            submit=writer.submit if writer is not None else None,
            context=writer.state_fields if writer is not None else None,
            rule_seen=audit.rule_seen if audit is not None else None,
            describe=lambda rule_id: describe_rule(rule_id, self.rules.get(rule_id)),
            port_drops=self.port_drops.read,
            datapath_drops=CoverageReader(config.ovs.ovs_rundir, DATAPATH_DROP_COUNTERS,
                                          "datapath drops before the pipeline go unstated").read,
            unknown_sources=self.routes.unknown_source_request if self.routes is not None
            and self.routes.denies_unknown else None,
            unknown_via=self.routes.unknown_via if self.routes is not None else "tunnel",
            unknown_vnis=self.routes.unknown_vni_request if self.routes is not None
            and self.routes.underlay.plan.geneve else None)
        self.registry.register(MeterCollector(self.losses))
        # Category 1: copies of running traces (`npaudit trace`); their packets are neither
        # audited nor answered by the category-0 dispatcher.
        meter, bucket = config.meters.traceflow, config.packetin.traceflow
        self.traceflow = TraceService(self.channel, lambda: self.engine, self.rules.get,
                                      round_=lambda: self.round_, meters=self._meters_supported,
                                      budget=(min(meter.rate, bucket.rate), min(meter.burst, bucket.burst)),
                                      purge=MegaflowCache(config.ovs.ovs_rundir).purge,
                                      gateway=self.gateway.plan if self.gateway is not None else None,
                                      cross=self._cross_node())
        self.registry.register(TraceCollector(self.traceflow.stats))
        # Tier 3: XDP on the Pods' veths (loaded in start(); a no-op when disabled or unavailable).
        self.offload = DropOffload(config.offload, self.audit, ovs_netns=self.switch.netns,
                                   busy=lambda: self.engine is not None and self.engine.changing)
        self.registry.register(OffloadCollector(self.offload))
        self.policy_packetins = PolicyPacketIns(self.channel.send_nowait, audit=self.audit,
                                                tap=self._handlers.get(Category.POLICY), offload=self.offload,
                                                suppress=self.traceflow.suppress,
                                                may_suppress=self.traceflow.may_suppress,
                                                answer_out=self.routes.answer_out if self.routes else None)
        self._handlers[Category.POLICY] = self.policy_packetins
        self._handlers[Category.TRACEFLOW] = chain_handlers(self.traceflow, self._handlers.get(Category.TRACEFLOW))
        # The ways Pods and policy arrive, made in start().
        self.api: LocalApi | None = None
        self.cni: CniServer | None = None
        self.manifests: ManifestDirectory | None = None
        self.k8s: KubernetesSource | None = None
        self._k8s_api: ApiClient | None = None
        self.problems = status.RecentProblems()
        self.started: tuple[float, float] | None = None  # (time.time(), time.monotonic()) at start
        self.policy_ready = False  # the first policy is in OVS and every source of Pods and policy is served
        self.settlement: Settlement | None = None  # of an apply a crash interrupted, at start (apply_intent.py)

    async def start(self, ready_timeout: float = 30.0) -> None:
        """OVS (when embedded), the bridge, the channel, the subscribers, then policy; a failed start stops what
        it started, the OVS daemons and namespace it brought up included."""
        try:
            await self._start(ready_timeout)
        except BaseException:
            await self._abort_start()
            raise

    async def _abort_start(self) -> None:
        try:
            await self.stop()
        except Exception as exc:  # a part that never started may not stop cleanly: OVS is undone regardless
            log.warning("stopping after a failed start: %s", one_line(exc), exc_info=log.isEnabledFor(logging.DEBUG))
        await self.switch.undo_start()

    async def _start(self, ready_timeout: float) -> None:
        cfg = self.config
        self.started = (time.time(), time.monotonic())
        await asyncio.to_thread(make_state_dir, Path(cfg.state_dir))  # before OVS: a bad one fails at once
        await self.switch.start()
        admission.subscribe(self.demux, self._handlers, cfg.packetin, direction=self.rules.direction,
                            now=time.monotonic())
        if self.trail is not None:
            await self.trail.start()
        self.demux.start()
        self.channel.start()
        if cfg.metrics.listen:
            self._metrics_server = status.serve_endpoints(cfg.metrics.listen, self.registry, self.readiness,
                                                              cfg.metrics)
        await self.channel.wait_ready(ready_timeout)
        meters_ok = self._meters_supported()
        if not meters_ok:
            log.warning("datapath of bridge %s has NO meter support: packet-ins are limited only by "
                        "the agent's token buckets (npaudit_datapath_meters_supported=0)", cfg.ovs.bridge)
        await asyncio.to_thread(self.offload.load)
        self.offload.start()
        await self.losses.baseline()  # before the policy's flows are in
        await self._start_policy(meters_ok)
        self.losses.start()
        await self.traceflow.warm_up()
        self.switch.supervisor.start()
        settle_heap()

    async def _start_policy(self, meters_ok: bool) -> None:
        """Pipeline, policy, then the ways Pods and policy arrive (CNI, local API, directory)."""
        cfg, mc = self.config, self.config.meters
        state_dir = Path(cfg.state_dir)
        previous, self.round_ = next_round(state_dir)
        store, self.settlement = await settled_store(state_dir, self.channel)  # before anything is installed
        limits = MeterLimits(policy_allow=(mc.policy_allow.rate, mc.policy_allow.burst),
                             policy_deny=(mc.policy_deny.rate, mc.policy_deny.burst),
                             traceflow=(mc.traceflow.rate, mc.traceflow.burst))
        per_rule = build_rule_meters(mc.per_rule.enabled, mc.per_rule.id_base, mc.per_rule.max, channel=self.channel,
                                     limits=limits, support=self.channel.meter_support, losses=self.losses,
                                     registry=self.registry)
        self.engine = PolicyEngine(self.channel, self.rules, round_=self.round_, meters=lambda: meters_ok,
                                   meter_specs=desired_meters(limits, meters_ok), rule_meters=per_rule,
                                   pod_wait=cfg.kubernetes.pod_wait if cfg.kubernetes.enabled else None,
                                   datapath=MegaflowCache(cfg.ovs.ovs_rundir), verdicts=self.offload,
                                   admission=self.routes.admission() if self.routes is not None else None)
        await self.engine.start()
        if self.gateway is not None:
            await self.channel.install_flows(gateway_flows(self.round_, self.gateway.plan))
        if self.routes is not None:
            await self.routes.start()
            plan = self.routes.underlay.plan
            if plan.geneve:  # other nodes' trace packets and reports, to the traceflow service
                await self.channel.install_flows(trace_tunnel_flows(self.round_, plan.tunnel_ofport, meters=meters_ok))
        # What `npaudit apply` set up before a restart, back in force first, with the store's generation marker.
        objs = load_text(store.text(), str(store.path))
        await self.engine.apply(objs.namespaces, objs.pods, objs.tiers, objs.policies, persist=StoreGeneration(store))
        log.info("re-applied %d objects from %s", len(store), store.path)
        if cfg.kubernetes.enabled:
            await self._start_kubernetes(self.engine)
        if cfg.policy.manifest_dir:
            self.manifests = ManifestDirectory(Path(cfg.policy.manifest_dir), self.engine, cfg.policy.poll_interval)
            await self.manifests.sync()
        if cfg.cni.enabled:
            self.cni = await self._cni_server(self.engine, state_dir / "cni")
        if previous:
            # Flows of the previous run that this run did not rewrite: gone only now,
            # after the new round's flows are in, so enforcement has no gap.
            await self.channel.delete_flows_by_cookie(previous << tables.COOKIE_ROUND_SHIFT, tables.ROUND_MASK)
        if self.cni is not None:
            await self.cni.start()
        self.api = LocalApi(cfg.api_socket, self.engine, store, syslog_status=self.syslog_status,
                            status=lambda: status.read(self), trace=self.traceflow.trace)
        await self.api.start()
        if self.manifests is not None:
            self.manifests.start()
        self.policy_ready = True

    async def _cni_server(self, engine: PolicyEngine, state_dir: Path) -> CniServer:
        """The CNI server over the Pod interfaces, after the Pods from before a restart have their flows again."""
        from policy_agent.cni.pod_interfaces import PodInterfaces
        from policy_agent.cni.server import CniServer

        if self.switch.ovsdb is None:
            raise AgentError("CNI needs the OVSDB connection made in start()")
        hooks = OffloadPodHooks(engine, self.offload)
        cluster = self.config.cluster
        pods = PodInterfaces(self.switch.ovsdb, self.config.ovs.bridge, self.switch.netns, state_dir, hooks,
                             subnet=self.subnet, mtu=cluster.pod_mtu if cluster.enabled else 0)
        for info in await asyncio.to_thread(pods.pods):  # their policy and forwarding flows, in this round
            await hooks.pod_added(info)
        return CniServer(self.config.cni_socket, pods)

    async def _start_kubernetes(self, engine: PolicyEngine) -> None:
        from policy_agent.sources.kubernetes import KubernetesSource, api_client_from_config

        kc = self.config.kubernetes
        self._k8s_api = await asyncio.to_thread(api_client_from_config, kc.kubeconfig or None)
        self.k8s = KubernetesSource(self._k8s_api, engine, node_name=self.config.node, subnet=self.subnet,
                                    peers=self.nodes)
        if self.gateway is None:  # no node_network.pod_cidr: the gateway comes with the Node's podCIDR
            self.subnet.subscribe(self._gateway_for)
        self.k8s.start()
        try:
            await within(self.k8s.synced.wait(), kc.sync_timeout)
        except asyncio.TimeoutError:
            log.warning("Kubernetes API not fully listed after %.0fs (%s); serving CNI anyway: "
                        "Pods wait up to %.0fs for their labels", kc.sync_timeout, self.k8s.stats, kc.pod_wait)
        if self._gateway_task is not None:
            await asyncio.shield(self._gateway_task)  # Pods then start with their gateway there

    def _gateway_for(self, cidr: str) -> None:
        """The subnet became known (once: NodeSubnet refuses a change): bring the gateway up for it."""
        if self.gateway is None and self._gateway_task is None:
            self._gateway_task = asyncio.get_running_loop().create_task(self._node_gateway(cidr), name="gateway")

    async def _node_gateway(self, cidr: str) -> None:
        """The gateway port, address, masquerade and flows for the Node's Pod subnet `cidr`."""
        cfg = self.config
        gateway = NodeGateway.of(dataclasses.replace(cfg.node_network, pod_cidr=cidr), cfg.ovs)
        if gateway is None or self.switch.ovsdb is None:
            return
        self.switch.gateway = gateway  # from now on ensured again after an OVS restart
        try:
            await asyncio.to_thread(gateway.ensure, self.switch.ovsdb)
            await self.channel.install_flows(gateway_flows(self.round_, gateway.plan))
        except Exception as exc:  # the agent runs on; the switch tries again after an OVS restart
            log.error("node gateway for Pod subnet %s (from the Node object) failed: %s; Pods reach only "
                      "the Pods of this node", cidr, one_line(exc))
            return
        self.gateway = gateway
        self.traceflow.set_gateway(gateway.plan)

    def _cross_node(self) -> CrossNode | None:
        """Traces to other nodes' Pods (None for one node)."""
        if self.underlay is None or self.routes is None:
            return None
        plan = self.underlay.plan
        return CrossNode(node=self.config.node, address=plan.node_ip, tunnel_ofport=plan.tunnel_ofport,
                         geneve=plan.geneve, peer_for=self.routes.peer_for)

    def _meters_supported(self) -> bool:
        support = self.channel.meter_support
        return support is not None and support.supported

    def syslog_status(self) -> SyslogStatus:
        return status.syslog_status(self)

    def readiness(self) -> list[str]:
        return status.readiness(self)

    async def stop(self) -> None:
        """Stop the agent. OVS keeps running with its flows (fail_mode=secure). A stop that takes
        SLOW_STOP seconds or more says which steps took the time (StopSteps)."""
        steps = StopSteps()
        await steps.bounded("supervisor and sources", self._stop_sources)
        servers = (part for part in (self.api, self.cni, self.routes) if part is not None)
        await steps.bounded("servers and routes", *(server.close for server in servers))
        await self.losses.close()  # a last loss window, read while the channel is still up (bounded itself)
        self.port_drops.close()
        steps.done("last loss window")
        await steps.bounded("traceflow and channel", self.traceflow.close, self.channel.close)  # traces' flows first
        await self.demux.stop(drain=True)
        await self.offload.close()  # the last offloaded counts go into records before those close
        steps.done("packet-in drain and offload")
        if self.trail is not None:
            await self.trail.close()
        steps.done("audit trail")
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
        await self.switch.close()
        steps.done("switch")
        steps.report()

    async def _stop_sources(self) -> None:
        await self.switch.supervisor.close()  # first: no OVS restart while the agent goes
        if self._gateway_task is not None:
            self._gateway_task.cancel()
            await asyncio.gather(self._gateway_task, return_exceptions=True)
        for source in (self.manifests, self.k8s):
            if source is not None:
                await source.close()
        if self._k8s_api is not None:
            await asyncio.to_thread(self._k8s_api.close)

    async def run(self, stop: asyncio.Event) -> None:
        root = logging.getLogger()
        root.addHandler(self.problems)  # for `npaudit status`: what went wrong lately, start-up included
        try:
            await self.start()
            try:
                await stop.wait()
            finally:
                await self.stop()
        finally:
            root.removeHandler(self.problems)

