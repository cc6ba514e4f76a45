"""Prometheus exposition of demux/channel counters, and the JSON debug tap."""

from __future__ import annotations

import asyncio
import io
import json

from prometheus_client import generate_latest

from packetin.channel import ChannelSettings, MeterSupport, OpenFlowChannel
from packetin.demux import Demux
from packetin.model import Category, Disposition, Flags, PacketIn, Userdata
from policy_agent.metrics import build_registry
from policy_agent.policy_packetins import JsonTap


def pin(category: int, rule: int = 5) -> PacketIn:
    ud = Userdata(category=category, flags=int(Flags.LOG), rule_id=rule).encode()
    return PacketIn(reason=0, table_id=3, cookie=0xAB, in_port=2, rule_id=rule, reg7=int(Disposition.DROP),
                    userdata=ud, packet=b"\x00" * 60, total_len=60, received_at=1700000000.25)


def test_exposition_counts_outcomes_per_category() -> None:
    async def main() -> bytes:
        demux = Demux()
        demux.subscribe(Category.POLICY, lambda p: None, rate=1, burst=2, queue_size=100, now=0.0)
        channel = OpenFlowChannel(ChannelSettings(target="/nonexistent"), demux.dispatch)
        registry = build_registry(demux, channel)
        before = generate_latest(registry).decode()
        assert "npaudit_datapath_meters_supported -1.0" in before
        demux.start()
        demux.dispatch([pin(Category.POLICY)] * 5 + [pin(Category.TRACEFLOW)] + [pin(9)], now=0.0)
        await demux.wait_idle()
        channel.meter_support = MeterSupport(max_meter=0, band_types=0, max_bands=0)
        text = generate_latest(registry)
        await demux.stop()
        return text

    text = asyncio.run(main()).decode()
    assert 'npaudit_packetin_total{category="policy",outcome="received"} 5.0' in text
    assert 'npaudit_packetin_total{category="policy",outcome="delivered"} 2.0' in text
    assert 'npaudit_packetin_total{category="policy",outcome="dropped_rate_limit"} 3.0' in text
    assert 'npaudit_packetin_unroutable_total{reason="no_subscriber"} 1.0' in text
    assert 'npaudit_packetin_unroutable_total{reason="unknown_category"} 1.0' in text
    assert 'npaudit_packetin_queue_depth{category="policy"} 0.0' in text
    assert "npaudit_openflow_connected 0.0" in text
    # A datapath without meters is visible, not silent.
    assert "npaudit_datapath_meters_supported 0.0" in text


def test_tap_writes_one_json_line_per_packet_in() -> None:
    out = io.StringIO()
    tap = JsonTap(out)
    tap(pin(Category.POLICY, rule=0xFFFFFFFF))
    tap(pin(Category.TRACEFLOW))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["rule_id"] == 0xFFFFFFFF and first["disposition"] == int(Disposition.DROP)
    assert first["userdata"] == {"version": 1, "category": 0, "flags": 1, "rule_id": 0xFFFFFFFF}
    assert first["cookie"] == "0xab" and first["in_port"] == 2 and first["table_id"] == 3
    assert json.loads(lines[1])["category"] == 1


def test_audit_losses_are_exported_and_logged(tmp_path, caplog) -> None:
    from prometheus_client import CollectorRegistry

    from auditlog.aggregate import Aggregator
    from auditlog.pipeline import AuditPipeline
    from auditlog.record import RecordContext
    from auditlog.writer import AuditWriter
    from policy_agent.metrics import AuditCollector
    from policy_agent.policy.rules import RuleRegistry

    class NoPods:
        def by_ip(self, ip: str) -> None:
            return None

    writer = AuditWriter(tmp_path / "audit.jsonl", queue_size=3)  # not started: the queue fills
    pipeline = AuditPipeline(RecordContext(node="n", rules=RuleRegistry(), pods=NoPods()), writer,
                             Aggregator(window=0))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AuditCollector(pipeline, writer))
    with caplog.at_level("ERROR", logger="auditlog.pipeline"):
        for _ in range(5):
            pipeline(pin(Category.POLICY))
    text = generate_latest(registry).decode()
    assert "npaudit_audit_packet_ins_total 5.0" in text
    assert 'npaudit_audit_records_total{outcome="queued"} 3.0' in text
    assert 'npaudit_audit_records_total{outcome="dropped_writer_full"} 2.0' in text
    assert 'npaudit_audit_writer_total{event="dropped_queue_full"} 2.0' in text
    assert "npaudit_audit_writer_queue_depth 3.0" in text and "npaudit_audit_chain_seq 0.0" in text
    assert "npaudit_audit_writer_queue_capacity 3.0" in text  # depth / capacity: the fill ratio alerts use
    # Once per interval, not once per record.
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "audit writer queue full" in caplog.records[0].getMessage()
