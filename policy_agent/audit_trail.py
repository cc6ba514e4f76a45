"""The agent's side of the audit trail: the record pipeline, its writer and the syslog forwarders, built from the
config, started and closed as one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from prometheus_client import CollectorRegistry

from auditlog.overload import Overload
from auditlog.pipeline import AuditPipeline
from auditlog.record import OBSERVER, RecordContext
from auditlog.record_fast import aggregator
from auditlog.syslog.destination import checkpoint_name
from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.process import ProcessForwarder
from auditlog.verdicts import VerdictTally
from auditlog.writer import INLINE_GAP, AuditWriter
from auditlog.writer_dir import inline_writes_allowed
from policy_agent.config.loader import AgentConfig, syslog_destination
from policy_agent.engine import PolicyEngine
from policy_agent.metrics import AuditCollector, SyslogCollector, VerdictCollector
from policy_agent.policy.rules import RuleRegistry

# Seconds past openflow.read_pace_max the window timer waits for a read that closes the windows due: a late
# event-loop turn, not a second wake-up, should decide.
WINDOW_SLACK_MARGIN = 0.005


class AuditTrail:
    """Category 0's records: aggregated, written to the hash-chained files, forwarded to syslog from those."""

    def __init__(self, config: AgentConfig, rules: RuleRegistry, registry: CollectorRegistry, *,
                 engine: Callable[[], PolicyEngine | None], packetin_fill: Callable[[], float],
                 pressed: Callable[[], bool]) -> None:
        self.verdicts = VerdictTally()
        self.pipeline, self.writer = build_audit(config, rules, engine, packetin_fill, pressed, self.verdicts)
        # The forwarders read the audit files, never the packet-in path.
        self.forwarders = build_syslog(config)
        registry.register(AuditCollector(self.pipeline, self.writer))
        registry.register(VerdictCollector(self.verdicts))
        if self.forwarders:
            registry.register(SyslogCollector(self.forwarders))

    async def start(self) -> None:
        await asyncio.to_thread(self.writer.start)
        self.pipeline.start()
        for forwarder in self.forwarders:
            forwarder.start()

    async def close(self) -> None:
        await self.pipeline.close()  # what the open aggregation windows hold, written now
        await asyncio.to_thread(self.writer.close)
        for forwarder in self.forwarders:  # a batch in flight is sent again from the checkpoint next time
            await asyncio.to_thread(forwarder.stop)


class _LateDirectory:
    """PodDirectory over the engine, which exists only once the agent has started."""

    def __init__(self, engine: Callable[[], PolicyEngine | None]) -> None:
        self._engine = engine

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        engine = self._engine()
        return None if engine is None else engine.by_ip(ip)

    def ip_table(self) -> Mapping[str, tuple[str, str]]:
        """The engine's address table (auditlog.record.PodTable): the records' encoder keeps the Pod texts
        it worked out while this is the same object."""
        engine = self._engine()
        return _NO_PODS if engine is None else engine.ip_table()


_NO_PODS: Mapping[str, tuple[str, str]] = MappingProxyType({})


def build_audit(config: AgentConfig, rules: RuleRegistry, engine: Callable[[], PolicyEngine | None],
                 packetin_fill: Callable[[], float], pressed: Callable[[], bool],
                 verdicts: VerdictTally | None = None) -> tuple[AuditPipeline, AuditWriter]:
    """The pipeline (aggregation, records, overload) and the writer it feeds; `engine` gives the Pods by IP
    once the agent has started, `packetin_fill` and `pressed` say how loaded the packet-in side is; `verdicts`
    counts what the writer has written."""
    ac = config.audit
    node_fields = {"observer": {"hostname": config.node, **OBSERVER},
                   "orchestrator": {"type": "kubernetes",
                                    **({"cluster": {"name": config.cluster_name}} if config.cluster_name else {})}}
    writer = AuditWriter(Path(ac.path), max_bytes=ac.max_size_mb << 20, backup_count=ac.backups,
                         max_age_days=ac.max_age_days, queue_size=ac.queue_size, state_fields=node_fields,
                         inline_gap=INLINE_GAP if inline_writes_allowed(Path(ac.path), ac.inline_writes) else None,
                         on_written=verdicts.written if verdicts is not None else None)
    ctx = RecordContext(node=config.node, cluster=config.cluster_name, rules=rules, pods=_LateDirectory(engine))
    ov = ac.overload
    overload = Overload(lambda: max(packetin_fill(), writer.queue_fill()), high_mark=ov.high_mark,
                        peers_mark=ov.peers_mark, low_mark=ov.low_mark, pressed=pressed) if ov.enabled else None
    # While packet-ins flow, a read comes at most openflow.read_pace_max after the last: windows close in it.
    slack = config.openflow.read_pace_max + WINDOW_SLACK_MARGIN
    return AuditPipeline(ctx, writer, aggregator(window=ac.window), overload=overload, window_slack=slack), writer


def build_syslog(config: AgentConfig) -> list[Forwarder | ProcessForwarder]:
    """One forwarder per syslog destination (a child process unless syslog.process: false), each tailing
    the audit files from its own checkpoint."""
    forwarders: list[Forwarder | ProcessForwarder] = []
    kind = ProcessForwarder if config.syslog.process else Forwarder
    for dest_config in config.syslog.destinations:
        dest = syslog_destination(dest_config, config.node)  # checked at load: raises only on a race
        forwarders.append(kind(dest, live=Path(config.audit.path),
                               checkpoint=config.syslog_checkpoint_dir / checkpoint_name(dest.endpoint)))
    return forwarders
