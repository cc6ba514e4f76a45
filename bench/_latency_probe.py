"""The hand-offs of one packet-in on its way to the audit file, stamped in the bench only.

The latency consumer runs the agent's path (channel -> demux -> AuditPipeline with the
agent's overload mode -> AuditWriter thread -> file) and stamps each packet-in (wall
clock, time.time(), so that the sender's and the file reader's stamps compare):

  read     the channel decoded it off the socket (PacketIn.received_at)
  handler  the demux consumer handed it to the pipeline
  submit   the pipeline gave its record to the writer (decode, aggregate, encode done)
  take     the writer thread took the record off its queue
  emit     its sealed line went to the file handler (lock, rotation check, write(2))
  written  the write of the batch holding it returned (readable in the file from then)

Stamps are keyed by UDP destination port (the latency sender gives every packet its own
port). `breakdown` turns them, with the sender's and the file reader's times, into
per-hand-off p50/p99 in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _bridge import consumer_path, until_sigterm

from auditlog.aggregate import Aggregator
from auditlog.chain import RecordText
from auditlog.overload import Overload
from auditlog.pipeline import AuditPipeline
from auditlog.record import RecordContext
from auditlog.writer import AuditWriter
from packetin.model import Category, PacketIn

# (name, from stamp, to stamp): the hand-offs, in path order.
HANDOFFS = (("socket_read", "sent", "read"),          # sender -> kernel -> OVS upcall -> agent read
            ("demux_queue", "read", "handler"),       # dispatch, channel, consumer task wake-up
            ("aggregation", "handler", "submit"),     # decode, aggregate, encode
            ("writer_thread", "submit", "take"),      # writer thread wake-up
            ("seal", "take", "emit"),                 # hash chain
            ("write", "emit", "written"),             # the file handler: flock, rotation check, write(2)
            ("file_reader", "written", "seen"))       # the bench's reader noticing (polling)


class StampingWriter(AuditWriter):
    """An AuditWriter that stamps when a record is submitted, taken and written."""

    def __init__(self, *args: Any, stamps: dict[int, dict[str, float]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stamps = stamps
        self.current: int | None = None  # the port of the packet-in the pipeline is handling
        self._ports: dict[int, int] = {}  # id(record) -> port, until taken
        self._taken: list[int] = []

    def submit(self, record: RecordText) -> bool:
        port = self.current
        if port is not None and "submit" not in self.stamps[port]:
            self.stamps[port]["submit"] = time.time()
            self._ports[id(record)] = port
        return super().submit(record)

    def _take(self) -> tuple[list[RecordText], list[Any]]:
        records, done = super()._take()
        now = time.time()
        taken = self._taken = []
        for record in records:
            port = self._ports.pop(id(record), None)
            if port is not None:
                self.stamps[port]["take"] = now
                taken.append(port)
        return records, done

    def _emit(self, text: str) -> None:
        now = time.time()
        for port in self._taken:
            self.stamps[port].setdefault("emit", now)
        super()._emit(text)

    def _emit_records(self, records: list[RecordText]) -> None:
        super()._emit_records(records)
        now = time.time()
        for port in self._taken:
            self.stamps[port]["written"] = now
        self._taken = []


def udp_dst_port(frame: bytes) -> int | None:
    """The UDP destination port of an untagged IPv4 frame without options (the bench's)."""
    if len(frame) >= 38 and frame[12:14] == b"\x08\x00" and frame[23] == 17 and frame[14] == 0x45:
        return int.from_bytes(frame[36:38], "big")
    return None


def consume_latency(target: str, netns: str, audit_path: str, context: RecordContext) -> None:
    """The agent's audit path with stamps; prints {"stamps": {port: {stage: time}}, ...} at SIGTERM."""
    stamps: dict[int, dict[str, float]] = {}

    async def main() -> None:
        writer = StampingWriter(Path(audit_path), backup_count=50, stamps=stamps)
        writer.start()
        demux_fill: list[Any] = []
        overload = Overload(lambda: max(demux_fill[0].queue_fill(Category.POLICY) if demux_fill else 0.0,
                                        writer.queue_fill()),
                            high_mark=0.05, peers_mark=0.25, low_mark=0.01)  # the agent's defaults
        pipeline = AuditPipeline(context, writer, Aggregator(window=1.0), overload=overload)

        def handler(pin: PacketIn) -> None:
            port = udp_dst_port(pin.packet)
            if port is not None:
                stamps[port] = {"read": pin.received_at, "handler": time.time()}
            writer.current = port
            try:
                pipeline(pin)
            finally:
                writer.current = None

        # The agent's policy channel size (packetin.policy.queue_size default).
        async with consumer_path(target, netns, handler, queue_size=65536) as (channel, demux):
            demux_fill.append(demux)
            pipeline.start()
            stats = await until_sigterm(demux)
        await asyncio.to_thread(writer.flush_wait, 30)
        await pipeline.close()
        await asyncio.to_thread(writer.close)
        print(json.dumps({"delivered": stats["delivered"], "decoded": channel.packet_ins,
                          "stamps": stamps}), flush=True)

    asyncio.run(main())


def _quantiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    q = statistics.quantiles(values, n=100) if len(values) >= 2 else [values[0]] * 99
    return {"p50_ms": round(q[49], 3), "p99_ms": round(q[98], 3), "max_ms": round(values[-1], 3)}


def breakdown(sent: dict[int, float], seen: dict[int, float], stamps: dict[str, dict[str, float]]) -> dict:
    """Per hand-off p50/p99/max (ms) over the packets that have every stamp, plus end to end."""
    rows = []
    for port, t in sent.items():
        s = stamps.get(str(port))
        if s is None or port not in seen:
            continue
        row = {**s, "sent": t, "seen": seen[port]}
        if all(k in row for _, a, b in HANDOFFS for k in (a, b)):
            rows.append(row)
    if not rows:
        return {"complete_packets": 0}
    out: dict[str, Any] = {"complete_packets": len(rows)}
    for name, a, b in HANDOFFS:
        out[name] = _quantiles([(r[b] - r[a]) * 1000 for r in rows])
    out["agent_read_to_written"] = _quantiles([(r["written"] - r["read"]) * 1000 for r in rows])
    out["sent_to_written"] = _quantiles([(r["written"] - r["sent"]) * 1000 for r in rows])
    return out
