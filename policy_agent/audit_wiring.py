"""Builds the audit pipeline from the config (the agent's composition root delegates here)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from auditlog.aggregate import Aggregator
from auditlog.pipeline import AuditPipeline
from auditlog.record import RecordContext
from auditlog.writer import AuditWriter
from policy_agent.config import AgentConfig
from policy_agent.policy.rules import RuleRegistry


class LateDirectory:
    """PodDirectory over whatever `source()` returns once the engine exists."""

    def __init__(self, source: Callable[[], object]) -> None:
        self._source = source

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        engine = self._source()
        return None if engine is None else engine.by_ip(ip)  # type: ignore[attr-defined]


def build_audit(config: AgentConfig, rules: RuleRegistry, engine: Callable[[], object]
                ) -> tuple[AuditPipeline, AuditWriter]:
    ac = config.audit
    node_fields = {"observer": {"hostname": config.node, "type": "switch", "vendor": "Open vSwitch"},
                   "orchestrator": {"type": "kubernetes",
                                    **({"cluster": {"name": config.cluster_name}} if config.cluster_name else {})}}
    writer = AuditWriter(Path(ac.path), max_bytes=ac.max_size_mb << 20, backup_count=ac.backups,
                         max_age_days=ac.max_age_days, queue_size=ac.queue_size, state_fields=node_fields)
    ctx = RecordContext(node=config.node, cluster=config.cluster_name, rules=rules, pods=LateDirectory(engine))
    return AuditPipeline(ctx, writer, Aggregator(window=ac.window)), writer
