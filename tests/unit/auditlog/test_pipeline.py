"""auditlog.pipeline.AuditPipeline: keys, exact counts through windows and a full writer, Allow at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.layers.inet import ICMP, IP, TCP, UDP  # noqa: E402
from scapy.layers.l2 import ARP, Ether  # noqa: E402

from auditlog.aggregate import Aggregator  # noqa: E402
from auditlog.packet import decode_frame, flow_key  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from tests.support.audit_pipeline import MAC, RULE, Writer, context, pin, udp_to  # noqa: E402

FRAMES = [bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1000, dport=80)),
          bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1000, dport=53)),
          bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / ICMP(type=8)),
          bytes(Ether(**MAC) / ARP())]


class KeyRecorder(Aggregator):
    def __init__(self) -> None:
        super().__init__(window=1.0)
        self.keys: list[tuple] = []

    def add(self, key: Any, *args: Any) -> Any:
        self.keys.append(key)
        return super().add(key, *args)


def test_the_key_is_rule_disposition_and_the_flow_key_the_offload_shares() -> None:
    agg = KeyRecorder()
    pipeline = AuditPipeline(context(), Writer(), agg)
    for frame in FRAMES:
        pipeline(pin(frame, 1.0, disposition=0x12))  # bits above the disposition are not part of it
    assert agg.keys == [(RULE.rule_id, 2, *flow_key(decode_frame(f))) for f in FRAMES]


def test_every_admitted_packet_is_in_exactly_one_record_full_writer_counted() -> None:
    async def run() -> tuple[AuditPipeline, Writer, AuditPipeline, Writer]:
        writer = Writer()
        clock = [100.0]
        pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=lambda: clock[0])
        for i in range(1000):  # one dropped flow and 10 distinct ones, 10 ms apart
            frame = FRAMES[0] if i % 100 else udp_to(1000 + i // 100)
            pipeline(pin(frame, 100.0 + i * 0.01))
        for _ in range(5):
            pipeline(pin(FRAMES[2], 110.0, disposition=0))  # Allow: a record each, at once
        clock[0] = 120.0
        await pipeline.close()
        full = Writer(room=3)
        over = AuditPipeline(context(), full, Aggregator(window=0))
        for _ in range(5):
            over(pin(FRAMES[0], 1.0))
        return pipeline, writer, over, full

    pipeline, writer, over, full = asyncio.run(run())
    assert writer.packets() == 1005 == pipeline.stats["packet_ins"]
    assert pipeline.stats["records"] == len(writer.records) and pipeline.stats["writer_full"] == 0
    # 10 distinct UDP flows; the TCP flood spans 10 windows of 1 s, each a "first" record
    # and one aggregate of the rest; 5 Allows
    assert len(writer.records) == 10 + 10 * 2 + 5
    assert over.stats == {"packet_ins": 5, "records": 3, "writer_full": 2, "decode_truncated": 0, "coarsened": 0}


def test_a_later_subscriber_reads_the_pipelines_decoding_of_the_same_packet_in() -> None:
    # The eBPF offload runs right after the pipeline on each logged Drop: one decode, not two.
    calls: list[bytes] = []
    pipeline = AuditPipeline(context(), Writer(), Aggregator(), wall_clock=lambda: 100.0)
    real = pipeline._decode_frame  # decode_frame, its common case in C where the module is built
    pipeline._decode_frame = lambda frame: calls.append(frame) or real(frame)  # type: ignore[method-assign]
    first, other = pin(udp_to(53), 100.0), pin(udp_to(54), 100.0)
    pipeline(first)
    assert pipeline.decoded(first) == decode_frame(first.packet) and len(calls) == 1
    assert pipeline.decoded(other) == decode_frame(other.packet) and len(calls) == 2  # not the one it took
