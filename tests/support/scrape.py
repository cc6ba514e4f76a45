"""The agent's Prometheus registry, filled the way the agent fills it, and scraped as a scraper
sees it."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from auditlog.aggregate import Aggregator
from auditlog.overload import Overload
from auditlog.pipeline import AuditPipeline
from auditlog.record import RecordContext
from auditlog.syslog.forwarder import ForwarderStats
from auditlog.writer import AuditWriter
from meters.ovs import MeterLimits
from meters.rule_meters import RuleMeterRange
from meters.stats import Dropped
from packetin.channel import ChannelSettings, OpenFlowChannel
from packetin.demux import Demux, FairShareSettings
from packetin.model import Category
from policy_agent.cluster.peer_nodes import KnownNodes, KnownNodesCollector
from policy_agent.config.offload import OffloadConfig
from policy_agent.http.endpoints import ListenerStats
from policy_agent.limits.offload_cache import DropOffload, OffloadCollector
from policy_agent.metrics import (AuditCollector, HttpListenerCollector, MeterCollector, OvsSupervisorCollector,
                                  SyslogCollector, build_registry)
from policy_agent.ovs.supervisor import SupervisorStats
from policy_agent.policy.rules import RuleRegistry
from policy_agent.limits.meter_sync import RuleMeters, RuleMetersCollector
from policy_agent.traceflow.collector import TraceCollector
from policy_agent.cni.subnet import NodeSubnet, SubnetCollector
from policy_agent.traceflow.service import TraceStats


class _NoPods:
    def by_ip(self, ip: str) -> None:
        return None


class _Forwarder:
    def stats(self) -> ForwarderStats:
        return ForwarderStats(destination="tcp://siem:514", connected=True, last_seq_sent=7, backlog_bytes=0,
                              last_error=None, sent=7, lost=0, truncated=0, skipped=0, errors=0)


class _Meters:
    def dropped(self) -> dict[str, Dropped]:
        return {"policy_deny": Dropped(packets=301, bytes=30100)}


class _Listener:
    def snapshot(self) -> ListenerStats:
        return ListenerStats(open=1, cap=64, closed={"evicted": 3}, accept_errors={"EMFILE": 2})


class _Supervisor:
    def snapshot(self) -> SupervisorStats:
        return SupervisorStats(up={"ovsdb-server": True, "ovs-vswitchd": True},
                               restarts={"ovs-vswitchd": 1}, capped=False, restarting=True,
                               checks_failed={"ovsdb-server": 0, "ovs-vswitchd": 2})


@pytest.fixture
def scrape(tmp_path: Path) -> dict[str, tuple[str, set[str], list[tuple[str, dict[str, str]]]]]:
    """Every family of a registry built as the agent builds it: name -> (type, label names, samples)."""
    demux = Demux()
    demux.subscribe(Category.POLICY, lambda pin: None, rate=1, burst=1, queue_size=4, now=0.0,
                    fair=FairShareSettings(lambda pin: pin.rule_id, key_rate=1, key_burst=1, max_keys=4))
    channel = OpenFlowChannel(ChannelSettings(target="/nonexistent"), demux.dispatch)
    registry = build_registry(demux, channel, lambda: {"rconn_overflow": 0, "packet_in_overflow": 0})
    writer = AuditWriter(tmp_path / "audit.jsonl", queue_size=4)
    pipeline = AuditPipeline(RecordContext(node="n", rules=RuleRegistry(), pods=_NoPods()), writer,
                             Aggregator(window=0),
                             overload=Overload(lambda: 0.0, high_mark=0.5, peers_mark=0.8, low_mark=0.1))
    registry.register(AuditCollector(pipeline, writer))
    registry.register(SyslogCollector([_Forwarder()]))
    registry.register(MeterCollector(_Meters()))
    # The agent registers this one only when it supervises OVS (policy_agent/agent.py).
    registry.register(OvsSupervisorCollector(_Supervisor()))  # type: ignore[arg-type]
    registry.register(TraceCollector(TraceStats()))
    registry.register(SubnetCollector(NodeSubnet("10.244.0.0/24")))
    registry.register(KnownNodesCollector(KnownNodes(lambda: "10.244.0.0/24")))
    # Registered by the listener itself when metrics.listen is set (policy_agent/http/endpoints.py).
    registry.register(HttpListenerCollector(_Listener()))  # type: ignore[arg-type]
    registry.register(OffloadCollector(DropOffload(OffloadConfig(), pipeline, ovs_netns="")))
    # Only with meters.per_rule on (policy_agent/limits/meter_sync.py).
    registry.register(RuleMetersCollector(RuleMeters(None, RuleMeterRange(4096, 8),  # type: ignore[arg-type]
                                                     MeterLimits((1, 1), (1, 1), (1, 1)))))
    families = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        labels = {key for sample in family.samples for key in sample.labels}
        families[family.name] = (family.type, labels, [(s.name, s.labels) for s in family.samples])
    return families
