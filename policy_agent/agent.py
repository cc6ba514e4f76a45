"""The composition root: builds OVS, the OpenFlow channel, the demux and metrics, and runs them."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CollectorRegistry

from auditlog.aggregate import Aggregator
from auditlog.overload import Overload
from auditlog.pipeline import AuditPipeline
from auditlog.record import OBSERVER, RecordContext
from auditlog.syslog.forwarder import Forwarder, checkpoint_name
from auditlog.syslog.process import ProcessForwarder
from auditlog.syslog.status import SyslogStatus
from auditlog.writer import INLINE_GAP, AuditWriter
from auditlog.writer_dir import inline_writes_allowed
from meters.ovs import MeterLimits, desired_meters
from packetin.channel import ChannelSettings, OpenFlowChannel
from packetin.demux import Demux, FairShareSettings, Handler
from packetin.fair_key import applied_to_key
from packetin.gctune import settle_heap
from packetin.model import Category
from packetin.reader import InputPressure
from policy_agent.ovs import tables
from policy_agent.sources.apply_intent import Settlement, StoreGeneration, settled_store
from policy_agent.config import AgentConfig, CategoryLimits, syslog_destination
from policy_agent.engine import PolicyEngine
from policy_agent.errors import AgentError, printable
from policy_agent.sources.local_api import LocalApi
from policy_agent.sources.manifest_dir import ManifestDirectory
from policy_agent.loss_accounting import LossAccounting
from policy_agent.rule_meters import build_rule_meters
from policy_agent.metrics import (AuditCollector, MeterCollector, OvsSupervisorCollector, SyslogCollector,
                                  build_registry, build_versions, category_name)
from policy_agent.offload import DropOffload, OffloadCollector, OffloadPodHooks
from policy_agent.policy.manifests import load_text
from policy_agent.policy_packetins import PolicyPacketIns
from policy_agent.policy.rules import RuleRegistry
from policy_agent.ovs.embedded import EmbeddedOvs, OvsPidFiles
from policy_agent.ovs.supervisor import OvsSupervisor
from policy_agent.ovs.coverage import CoverageReader, vswitchd_ctl_path
from policy_agent.ovs.megaflows import MegaflowCache
from policy_agent.ovs.bridge import Ovsdb
from policy_agent.traceflow.collector import TraceCollector
from policy_agent.traceflow.service import TraceService

log = logging.getLogger(__name__)


class RecentProblems(logging.Handler):
    """The last `size` WARNING and ERROR lines logged in this process, for `npaudit status`."""

    def __init__(self, size: int = 20) -> None:
        super().__init__(logging.WARNING)
        # Bounded: a flood of warnings keeps the newest `size`.
        self._lines: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append({"time": record.created, "level": record.levelname, "logger": record.name,
                                "message": printable(record.getMessage())[:500]})
        except Exception:  # a bad format argument: reported as logging reports it, never raised into the caller
            self.handleError(record)

    def snapshot(self) -> list[dict[str, Any]]:
        """Oldest first."""
        return list(self._lines)


class Agent:
    """One node agent. `handlers` maps a packet-in category to its subscriber."""

    def __init__(self, config: AgentConfig, handlers: dict[int, Handler] | None = None,
                 rules: RuleRegistry | None = None) -> None:
        self.config = config
        self._handlers = dict(handlers or {})
        self.embedded: EmbeddedOvs | None = None
        if config.ovs.mode == "embedded":
            self.embedded = EmbeddedOvs(Path(config.ovs.run_dir), config.ovs.netns)
        self.ovsdb: Ovsdb | None = None
        self.demux = Demux()
        self.channel = OpenFlowChannel(
            ChannelSettings(target=config.openflow_target, netns=config.openflow_netns,
                            echo_interval=config.openflow.echo_interval,
                            echo_timeout=config.openflow.echo_timeout,
                            reconnect_max=config.openflow.reconnect_max),
            self.demux.dispatch,
            on_malformed=self.demux.count_malformed,
            # In audit overload, packet-ins a coarse record cannot tell apart come in groups.
            on_groups=self.demux.dispatch_groups,
            coarse=lambda: self.audit is not None and self.audit.coarse,
        )
        self.ovs_counters = CoverageReader(config.ovs.ovs_rundir)
        self.registry: CollectorRegistry = build_registry(self.demux, self.channel, self.ovs_counters.read)
        self._metrics_server: Any = None
        # Embedded: restarts a dead daemon; external: reports it (the channel reconnects when it returns).
        self.ovs_supervisor = OvsSupervisor(
            self.embedded if self.embedded is not None else OvsPidFiles(config.ovs.ovs_rundir),
            config.ovs.supervise_interval, restarting=self.embedded is not None,
            after_restart=self._ensure_bridge)
        self.registry.register(OvsSupervisorCollector(self.ovs_supervisor))
        self.datapath_type: str | None = None
        self.rules = rules if rules is not None else RuleRegistry()
        self.round_ = 0
        self.engine: PolicyEngine | None = None
        # Category 0: Rejects answered, LOG-flagged packet-ins audited (and shown on the
        # debug tap when the caller passed one in as the policy handler).
        self.audit: AuditPipeline | None = None
        self.audit_writer: AuditWriter | None = None
        if config.audit.enabled:
            pressure = InputPressure(self.channel.input_pressed, lambda: self.demux.admission_drops(Category.POLICY))
            self.audit, self.audit_writer = _build_audit(config, self.rules, lambda: self.engine,
                                                         lambda: self.demux.queue_fill(Category.POLICY), pressure)
            self.registry.register(AuditCollector(self.audit, self.audit_writer))
        # One forwarder per syslog destination (a child process unless syslog.process: false), reading the
        # audit files (never the packet-in path).
        self.syslog: list[Forwarder | ProcessForwarder] = _build_syslog(config) if config.audit.enabled else []
        if self.syslog:
            self.registry.register(SyslogCollector(self.syslog))
        # Meter statistics and the loss records stating what never became a record.
        audit, writer = self.audit, self.audit_writer
        self.losses = LossAccounting(
            self.channel, interval=config.meters.stats_interval, ovs_losses=self.ovs_counters.read,
            admission=lambda: {category_name(c): n for c, n in self.demux.stats().items()},
            writer_full=(lambda: audit.snapshot().writer_full) if audit is not None else lambda: 0,
            submit=writer.submit if writer is not None else None,
            context=writer.state_fields if writer is not None else None)
        self.registry.register(MeterCollector(self.losses))
        # Category 1: copies of running traces (`npaudit trace`); their packets are neither
        # audited nor answered by the category-0 dispatcher.
        meter, bucket = config.meters.traceflow, config.packetin.traceflow
        self.traceflow = TraceService(self.channel, lambda: self.engine, self.rules.get,
                                      round_=lambda: self.round_, meters=self._meters_supported,
                                      budget=(min(meter.rate, bucket.rate), min(meter.burst, bucket.burst)),
                                      purge=MegaflowCache(config.ovs.ovs_rundir).purge)
        self.registry.register(TraceCollector(self.traceflow.stats))
        # Tier 3: XDP on the Pods' veths (loaded in start(); a no-op when disabled or unavailable).
        self.offload = DropOffload(config.offload, self.audit, ovs_netns=config.ovs.netns if config.ovs.mode ==
                                   "embedded" else "", busy=lambda: self.engine is not None and self.engine.changing)
        self.registry.register(OffloadCollector(self.offload))
        self.policy_packetins = PolicyPacketIns(self.channel.send_nowait, audit=self.audit,
                                                tap=self._handlers.get(Category.POLICY), offload=self.offload,
                                                suppress=self.traceflow.suppress,
                                                may_suppress=self.traceflow.may_suppress)
        self._handlers[Category.POLICY] = self.policy_packetins
        self._handlers[Category.TRACEFLOW] = _chain(self.traceflow, self._handlers.get(Category.TRACEFLOW))
        self.api: LocalApi | None = None
        self.cni: Any = None
        self.manifests: ManifestDirectory | None = None
        self.k8s: Any = None
        self._k8s_api: Any = None
        self.problems = RecentProblems()
        self._started: tuple[float, float] | None = None  # (time.time(), time.monotonic()) at start
        self._policy_ready = False  # the first policy is in OVS and every source of Pods and policy is served
        self.settlement: Settlement | None = None  # of an apply a crash interrupted, at start (apply_intent.py)

    def _rule_direction(self, rule_id: int) -> str | None:
        """"ingress" or "egress" for a known rule id (the fair-share key asks once per rule)."""
        rule = self.rules.get(rule_id)
        return None if rule is None else str(getattr(rule.direction, "value", rule.direction)).lower()

    async def start(self, ready_timeout: float = 30.0) -> None:
        """Bring up OVS (when embedded), the bridge, the channel and the subscribers."""
        cfg = self.config
        self._started = (time.time(), time.monotonic())
        await asyncio.to_thread(_make_state_dir, Path(cfg.state_dir))  # before OVS: a bad one fails at once
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.up)
        self.ovsdb = await asyncio.to_thread(Ovsdb, cfg.ovs.db_remote)
        self.datapath_type = await asyncio.to_thread(self.ovsdb.choose_datapath_type, cfg.ovs.datapath_type)
        await self._ensure_bridge()
        controller = cfg.controller_target
        if controller is not None and not controller.startswith("punix:") and cfg.ovs.mode == "external":
            log.warning("OpenFlow controller %s listens on the host's loopback: any local process "
                        "can connect to it; openflow.transport: unix avoids that", controller)
        now = time.monotonic()
        limits: dict[int, CategoryLimits] = {
            Category.POLICY: cfg.packetin.policy, Category.TRACEFLOW: cfg.packetin.traceflow}
        for category, handler in self._handlers.items():
            lim = limits.get(category, cfg.packetin.traceflow)
            fair = cfg.packetin.fair_share
            self.demux.subscribe(category, handler, rate=lim.rate, burst=lim.burst,
                                 queue_size=lim.queue_size, now=now,
                                 fair=FairShareSettings(applied_to_key(self._rule_direction), fair.key_rate,
                                                        fair.key_burst, fair.max_keys)
                                 if category == Category.POLICY and fair.enabled else None)
        if self.audit is not None and self.audit_writer is not None:
            await asyncio.to_thread(self.audit_writer.start)
            self.audit.start()
            for forwarder in self.syslog:
                forwarder.start()
        self.demux.start()
        self.channel.start()
        if cfg.metrics.listen:
            self._start_metrics(cfg.metrics.listen)
        await self.channel.wait_ready(ready_timeout)
        support = self.channel.meter_support
        meters_ok = support is not None and support.supported
        if not meters_ok:
            log.warning("datapath of bridge %s has NO meter support: packet-ins are limited only by "
                        "the agent's token buckets (npaudit_datapath_meters_supported=0)", cfg.ovs.bridge)
        await asyncio.to_thread(self.offload.load)
        self.offload.start()
        await self._start_policy(meters_ok)
        self.losses.start()
        await self.traceflow.warm_up()
        self.ovs_supervisor.start()
        settle_heap()

    async def _ensure_bridge(self) -> None:
        """The bridge and our controller on it, as configured; at start and after an OVS restart."""
        cfg = self.config
        if self.ovsdb is None or self.datapath_type is None:
            raise AgentError("the bridge is ensured only after start() connected to OVSDB")
        await asyncio.to_thread(self.ovsdb.ensure_bridge, cfg.ovs.bridge, self.datapath_type)
        controller = cfg.controller_target
        if controller is not None:
            # Our own controller on the bridge, so the packet-in queue size is ours.
            await asyncio.to_thread(self.ovsdb.ensure_controller, cfg.ovs.bridge, controller,
                                    cfg.ovs.controller_queue_size)
            if controller.startswith("punix:"):
                await asyncio.to_thread(self.ovsdb.wait_socket, Path(cfg.openflow_target))

    async def _start_policy(self, meters_ok: bool) -> None:
        """Pipeline, policy, then the ways Pods and policy arrive (CNI, local API, directory)."""
        cfg = self.config
        state_dir = Path(cfg.state_dir)
        previous = _read_round(state_dir)
        self.round_ = previous % 0xFFFFFFFF + 1
        _write_round(state_dir, self.round_)
        store, self.settlement = await settled_store(state_dir, self.channel)  # before anything is installed
        mc = cfg.meters
        limits = MeterLimits(policy_allow=(mc.policy_allow.rate, mc.policy_allow.burst),
                             policy_deny=(mc.policy_deny.rate, mc.policy_deny.burst),
                             traceflow=(mc.traceflow.rate, mc.traceflow.burst))
        per_rule = build_rule_meters(mc.per_rule.enabled, mc.per_rule.id_base, mc.per_rule.max, channel=self.channel,
                                     limits=limits, support=self.channel.meter_support, losses=self.losses,
                                     registry=self.registry)
        self.engine = PolicyEngine(self.channel, self.rules, round_=self.round_, meters=lambda: meters_ok,
                                   meter_specs=desired_meters(limits, meters_ok), rule_meters=per_rule,
                                   pod_wait=cfg.kubernetes.pod_wait if cfg.kubernetes.enabled else None,
                                   datapath=MegaflowCache(cfg.ovs.ovs_rundir), verdicts=self.offload)
        await self.engine.start()
        # What `npaudit apply` set up before a restart, back in force first, with the store's generation marker.
        objs = load_text(store.text(), str(store.path))
        await self.engine.apply(objs.namespaces, objs.pods, objs.tiers, objs.policies, persist=StoreGeneration(store))
        log.info("re-applied %d objects from %s", len(store), store.path)
        if cfg.kubernetes.enabled:
            await self._start_kubernetes()
        if cfg.policy.manifest_dir:
            self.manifests = ManifestDirectory(Path(cfg.policy.manifest_dir), self.engine, cfg.policy.poll_interval)
            await self.manifests.sync()
        if cfg.cni.enabled:
            from policy_agent.cni.pod_interfaces import PodInterfaces
            from policy_agent.cni.server import CniServer

            if self.ovsdb is None:
                raise RuntimeError("CNI needs the OVSDB connection made in start()")
            hooks = OffloadPodHooks(self.engine, self.offload)
            pods = PodInterfaces(self.ovsdb, cfg.ovs.bridge, cfg.ovs.netns if cfg.ovs.mode == "embedded" else "",
                                 state_dir / "cni", hooks)
            # Pods from before a restart: their policy and forwarding flows again, in this round.
            for info in await asyncio.to_thread(pods.pods):
                await hooks.pod_added(info)
            self.cni = CniServer(cfg.cni_socket, pods)
        if previous:
            # Flows of the previous run that this run did not rewrite: gone only now,
            # after the new round's flows are in, so enforcement has no gap.
            await self.channel.delete_flows_by_cookie(previous << tables.COOKIE_ROUND_SHIFT, tables.ROUND_MASK)
        if self.cni is not None:
            await self.cni.start()
        self.api = LocalApi(cfg.api_socket, self.engine, store, syslog_status=self.syslog_status, status=self.status,
                            trace=self.traceflow.trace)
        await self.api.start()
        if self.manifests is not None:
            self.manifests.start()
        self._policy_ready = True

    async def _start_kubernetes(self) -> None:
        from policy_agent.sources.kubernetes import KubernetesSource, api_client_from_config

        kc = self.config.kubernetes
        self._k8s_api = await asyncio.to_thread(api_client_from_config, kc.kubeconfig or None)
        self.k8s = KubernetesSource(self._k8s_api, self.engine, node_name=self.config.node)
        self.k8s.start()
        try:
            await asyncio.wait_for(self.k8s.synced.wait(), kc.sync_timeout)
        except asyncio.TimeoutError:
            log.warning("Kubernetes API not fully listed after %.0fs (%s); serving CNI anyway: "
                        "Pods wait up to %.0fs for their labels", kc.sync_timeout, self.k8s.stats, kc.pod_wait)

    def _meters_supported(self) -> bool:
        support = self.channel.meter_support
        return support is not None and support.supported

    def syslog_status(self) -> SyslogStatus:
        """The forwarders' snapshots and the writer's newest seq, for `npaudit syslog status`."""
        writer_seq = self.audit_writer.head[0] if self.audit_writer is not None else None
        return SyslogStatus(writer_seq, tuple(forwarder.stats() for forwarder in self.syslog))

    async def status(self) -> dict[str, Any]:
        """For `npaudit status|stats`: the snapshot, with what OVS says read off the event loop."""
        rundir = self.config.ovs.ovs_rundir
        ovs_version = await asyncio.to_thread(vswitchd_version, rundir)
        ovs_losses = await asyncio.to_thread(self.ovs_counters.read)
        syslog = await asyncio.to_thread(self.syslog_status)  # forwarder children answer over a pipe
        return self.status_snapshot(now=(time.time(), time.monotonic()), ovs_version=ovs_version,
                                    ovs_losses=ovs_losses, syslog=syslog)

    def status_snapshot(self, *, now: tuple[float, float], ovs_version: str | None,
                        ovs_losses: dict[str, int | None], syslog: SyslogStatus | None = None) -> dict[str, Any]:
        """The agent's state as JSON: process, OpenFlow, OVS, meters, eBPF, traces, policy, audit, syslog,
        packet-in counters since start, and the last problems logged. `now` is (time.time(), time.monotonic())."""
        cfg, engine, writer = self.config, self.engine, self.audit_writer
        support = self.channel.meter_support
        started = self._started or now
        demux = {category_name(cat): counts for cat, counts in sorted(self.demux.stats().items())}
        return {
            "agent": {"pid": os.getpid(), "version": build_versions()["version"], "node": cfg.node,
                      "started": started[0], "uptime_seconds": round(now[1] - started[1], 3)},
            "openflow": {"connected": self.channel.ready, "target": cfg.openflow_target,
                         "connects": self.channel.connects},
            "ovs": {"mode": cfg.ovs.mode, "bridge": cfg.ovs.bridge, "version": ovs_version,
                    "datapath_type": self.datapath_type},
            "meters": {"supported": None if support is None else support.supported},
            "ebpf": self.offload.status(),
            "traceflow": self.traceflow.stats.to_json(),
            "policy": None if engine is None else {
                "tiers": len(engine.tiers), "policies": len(engine.policies), "rules": len(self.rules),
                "namespaces": len(engine.namespaces), "pods": len(engine.pods)},
            "audit": {"enabled": writer is not None, "path": cfg.audit.path,
                      "head": None if writer is None else dict(zip(("seq", "chain"), writer.head))},
            "syslog": (syslog or self.syslog_status()).to_json(),
            "packetin": {"by_category": demux, "ovs_lost": ovs_losses,
                         "meter_drops": self.losses.dropped_json()},
            "problems": self.problems.snapshot(),
            "apply_settlement": None if self.settlement is None else self.settlement.to_json(),
        }

    def readiness(self) -> list[str]:
        """What keeps the node from taking Pods with their policy (/readyz); empty when ready."""
        waiting = []
        if not self.channel.ready:
            waiting.append("OpenFlow not connected")
        if not self._policy_ready:
            waiting.append("policy flows not installed yet")
        if self.config.cni.enabled and (self.cni is None or not self.cni.listening):
            waiting.append("CNI server not listening")
        return waiting

    def _start_metrics(self, listen: str) -> None:
        from policy_agent.http_endpoints import serve

        host, _, port = listen.rpartition(":")
        try:
            self._metrics_server = serve(host, int(port), self.registry, self.readiness)
        except OSError as exc:  # a port in use, an address not on this host
            raise AgentError(f"metrics.listen {listen}: cannot listen ({exc.strerror or exc})") from exc
        log.info("metrics on http://%s/metrics, probes on /readyz and /healthz", listen)

    async def stop(self) -> None:
        """Stop the agent. OVS keeps running with its flows (fail_mode=secure)."""
        await self.ovs_supervisor.close()  # first: no OVS restart while the agent goes
        if self.manifests is not None:
            await self.manifests.close()
        if self.k8s is not None:
            await self.k8s.close()
            await asyncio.to_thread(self._k8s_api.close)
        if self.api is not None:
            await self.api.close()
        if self.cni is not None:
            await self.cni.close()
        await self.losses.close()  # a last loss window, read while the channel is still up
        await self.traceflow.close()  # flows of finished traces out before the channel goes
        await self.channel.close()
        await self.demux.stop(drain=True)
        await self.offload.close()  # the last offloaded counts go into records before those close
        if self.audit is not None and self.audit_writer is not None:
            await self.audit.close()  # what the open aggregation windows hold, written now
            await asyncio.to_thread(self.audit_writer.close)
        for forwarder in self.syslog:  # a batch in flight is sent again from the checkpoint next time
            await asyncio.to_thread(forwarder.stop)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        if self.ovsdb is not None:
            await asyncio.to_thread(self.ovsdb.close)
            self.ovsdb = None

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


_OVS_VERSION = re.compile(r"\(Open vSwitch\) (\S+)")


def vswitchd_version(ovs_rundir: Path) -> str | None:
    """The running ovs-vswitchd's version (its unixctl `version`), None if it does not answer."""
    from ovs.unixctl.client import UnixctlClient

    error, client = UnixctlClient.create(str(vswitchd_ctl_path(Path(ovs_rundir))))
    if error:
        return None
    try:
        code, err, result = client.transact("version", [])
    finally:
        client.close()
    if code or err or not result:
        return None
    found = _OVS_VERSION.search(result)
    return found[1] if found else result.strip()


def _make_state_dir(state_dir: Path) -> None:
    try:
        state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise AgentError(f"state_dir {state_dir}: exists and is not a directory") from exc
    except OSError as exc:
        raise AgentError(f"state_dir {state_dir}: cannot create ({exc.strerror}: {exc.filename})") from exc


def _read_round(state_dir: Path) -> int:
    try:
        return int((state_dir / "round").read_text().strip())
    except (OSError, ValueError):
        return 0


def _write_round(state_dir: Path, round_: int) -> None:
    tmp = state_dir / "round.tmp"
    tmp.write_text(f"{round_}\n")
    tmp.replace(state_dir / "round")


def _chain(first: Handler, then: Handler | None) -> Handler:
    """`first`, then the debug tap when there is one."""
    if then is None:
        return first

    def both(pin: Any) -> None:
        first(pin)
        then(pin)
    return both


class _LateDirectory:
    """PodDirectory over the engine, which exists only once the agent has started."""

    def __init__(self, engine: Callable[[], PolicyEngine | None]) -> None:
        self._engine = engine

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        engine = self._engine()
        return None if engine is None else engine.by_ip(ip)


def _build_audit(config: AgentConfig, rules: RuleRegistry, engine: Callable[[], PolicyEngine | None],
                 packetin_fill: Callable[[], float], pressed: Callable[[], bool]
                 ) -> tuple[AuditPipeline, AuditWriter]:
    ac = config.audit
    node_fields = {"observer": {"hostname": config.node, **OBSERVER},
                   "orchestrator": {"type": "kubernetes",
                                    **({"cluster": {"name": config.cluster_name}} if config.cluster_name else {})}}
    writer = AuditWriter(Path(ac.path), max_bytes=ac.max_size_mb << 20, backup_count=ac.backups,
                         max_age_days=ac.max_age_days, queue_size=ac.queue_size, state_fields=node_fields,
                         inline_gap=INLINE_GAP if inline_writes_allowed(Path(ac.path), ac.inline_writes) else None)
    ctx = RecordContext(node=config.node, cluster=config.cluster_name, rules=rules, pods=_LateDirectory(engine))
    ov = ac.overload
    overload = Overload(lambda: max(packetin_fill(), writer.queue_fill()), high_mark=ov.high_mark,
                        peers_mark=ov.peers_mark, low_mark=ov.low_mark, pressed=pressed) if ov.enabled else None
    return AuditPipeline(ctx, writer, Aggregator(window=ac.window), overload=overload), writer


def _build_syslog(config: AgentConfig) -> list[Forwarder | ProcessForwarder]:
    forwarders: list[Forwarder | ProcessForwarder] = []
    kind = ProcessForwarder if config.syslog.process else Forwarder
    for dest_config in config.syslog.destinations:
        dest = syslog_destination(dest_config, config.node)  # checked at load: raises only on a race
        forwarders.append(kind(dest, live=Path(config.audit.path),
                               checkpoint=config.syslog_checkpoint_dir / checkpoint_name(dest.endpoint)))
    return forwarders
