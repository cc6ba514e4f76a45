"""Emissions -> records -> the writer: the audit pipeline's last step (auditlog/pipeline.py).

Each Emission (a window's "first", "immediate" or "aggregate" record of packets) becomes one record, in order.
Runs of full-detail emissions are encoded in one C call where the C encoder is built (encode_run: its records are
the ones made one by one, byte for byte) and handed to the writer together while it holds a read's batch
(submit_many); coarse keys (overload) and everything where the C encoder is not built go one by one. A record the
writer has no room for is counted per rule (rule_refused) and said in the log.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, cast

from auditlog.aggregate import Emission
from auditlog.chain import RecordText
from auditlog.packet import PacketSummary
from packetin.model import Flags, PacketIn
from packetin.registers import USERDATA_VERSION
from packetin.ratelimited_log import RateLimitedLog

log = logging.getLogger("auditlog.pipeline")
LOG, REJECT = int(Flags.LOG), int(Flags.REJECT)


class RecordSink(Protocol):
    """Where the pipeline's records go (AuditWriter): never blocks, False when it refuses one."""

    def submit(self, record: RecordText) -> bool: ...


class BatchingSink(RecordSink, Protocol):
    """A sink that can take the records of one batch of packet-ins as one hand-over (AuditWriter)."""

    def hold(self) -> None: ...

    def release(self) -> int: ...


class RecordOut:
    """`encoder` (record_fast.fast_encoder's), `writer` (a RecordSink); `stats`, `rule_refused` and `distinct` are
    the pipeline's own dicts, updated in place (records, writer_full and coarsened; packets refused per rule; the
    full-detail keys each coarse key's window holds)."""

    def __init__(self, encoder: Any, writer: RecordSink, stats: dict[str, int], rule_refused: dict[int, int],
                 distinct: dict[tuple, set[tuple]],
                 lone_texts: tuple[Callable[[], Any] | None, Callable[[], Any] | None] = (None, None)) -> None:
        self._encode = encoder.encode
        self._run: Callable[[list[Emission], int, list[RecordText]], int] | None = getattr(encoder, "encode_run",
                                                                                          None)
        self._writer = writer
        self._write_now: Callable[[list[RecordText]], bool] | None = getattr(writer, "write_now", None)
        self._submit_many: Callable[[list[RecordText]], int] | None = getattr(writer, "submit_many", None)
        self.stats, self.rule_refused, self._distinct = stats, rule_refused, distinct
        self._drops = RateLimitedLog(log, 10.0)
        # early(): the C encoder's encode_raw, what says whether the texts it keeps are still right (the rules'
        # mapping and the Pod table now), and the record early made for first() to find: (record, written).
        rules, table = lone_texts
        raw = getattr(encoder, "encode_raw", None)
        self._raw = (raw, rules, table) if raw is not None and rules is not None and table is not None else None
        self._early: tuple[RecordText, bool] | None = None
        self.early_records = 0  # records early() made

    def emit(self, emissions: list[Emission]) -> None:
        """The records of `emissions`, in order, to the writer: runs of full-detail ones encoded in one call where
        the C encoder is built (encode_run) and handed over together (the writer's submit_many, when it holds a
        batch), the rest (coarse keys, and all where there is no C encoder) one by one."""
        if self._early is not None and emissions:  # lone() takes what early() made: not expected here
            if (early := self._take_early(emissions[0])) is not None:
                if early[1]:
                    self.stats["records"] += 1
                else:
                    self._submit_run(emissions, 0, [early[0]])
                emissions = emissions[1:]
        run = self._run
        if run is None:
            self._emit_each(emissions)
            return
        i, n = 0, len(emissions)
        while i < n:
            records: list[RecordText] = []
            try:
                j = run(emissions, i, records)
            finally:  # the records made before an encoder error go out, as one by one they would have
                if records:
                    self._submit_run(emissions, i, records)
            if j < n:
                self._emit_each(emissions[j:j + 1])
            i = j + 1

    def early(self, raw: bytes, wall: float, aggregator: Any) -> None:
        """A lone packet-in's record made from its NXT_PACKET_IN2 bytes (received `wall`) before it is decoded,
        and written now where the writer can (encode_raw: the C encoder, from texts it keeps in one block, with
        the aggregator's word that this packet-in makes its key's "first" and nothing else), for first() to find:
        after a quiet spell the decode, the aggregator and the encoder's caches cost the record's latency tens of
        µs each. Nothing done where encode_raw cannot say (it then draws no event id)."""
        if self._raw is None or self._early is not None:
            return
        encode_raw, rules, table = self._raw
        record = encode_raw(raw, wall, None, rules(), table(), aggregator, USERDATA_VERSION, LOG, REJECT)
        if record is not None:
            self.early_records += 1
            self._early = (record, self._write_now is not None and self._write_now([record]))

    def early_arm(self, aggregator: Any) -> tuple[Any, ...] | None:
        """What the event loop's quiet wait needs to make a lone packet-in's record as early makes it, and write it
        (packetin/quiet.py): (took_early, encode_raw, the rules' mapping, the Pod table, `aggregator`, the userdata
        version and bits, the writer's lone_arm), None where early would do nothing."""
        if self._raw is None or self._early is not None:
            return None
        encode_raw, rules, table = self._raw
        lone_arm = getattr(self._writer, "lone_arm", None) if self._write_now is not None else None
        return (self.took_early, encode_raw, rules(), table(), aggregator, USERDATA_VERSION, LOG, REJECT,
                lone_arm() if lone_arm is not None else None)

    def took_early(self, early: tuple[Any, ...]) -> None:
        """The record the quiet wait made (packetin/_quiet_fast.c), for first() to find as early's: its write
        finished by the writer where the wait began it (the writer's lock, which it then holds, let go)."""
        record, locked, line, written, errno = early[3:8]
        done = bool(locked) and self._writer.lone_written([record], line, written, errno)  # type: ignore[attr-defined]
        self.early_records += 1
        self._early = (record, done)

    def _take_early(self, e: Emission | None) -> tuple[RecordText, bool] | None:
        """The early record, when `e` is the emission it was made for (a "first" or "immediate" of one packet,
        received when the record says); else None, and an early record (not expected) is said."""
        early, self._early = self._early, None
        if early is None:
            return None
        if e is not None and e.packets == 1 and not e.offloaded_packets and e.first == early[0].received \
                and e.kind != "aggregate":
            return early
        self._drops.log(logging.ERROR, "early", "a record made early (%s) was not the pipeline's next: %s",
                        "written" if early[1] else "not written", early[0].head[:200])
        return None

    def first(self, emissions: list[Emission]) -> bool:
        """emit(emissions) for a lone packet-in's one emission, its record written now where the writer can write
        it now (write_now), not in its read's batch (auditlog/pipeline.py AuditPipeline.lone): True once handled,
        written or else submitted as emit submits it; False, nothing done, unless it is one full-detail emission
        the C encoder takes. An encoder error raises as in emit, nothing made."""
        run, write_now = self._run, self._write_now
        early = self._take_early(emissions[0] if len(emissions) == 1 else None) if self._early is not None else None
        if early is not None:
            if early[1] or (write_now is not None and write_now([early[0]])):
                self.stats["records"] += 1
            else:
                self._submit_run(emissions, 0, [early[0]])
            return True
        if run is None or write_now is None or len(emissions) != 1:
            return False
        records: list[RecordText] = []
        if run(emissions, 0, records) != 1:
            return False
        if write_now(records):
            self.stats["records"] += 1
        else:
            self._submit_run(emissions, 0, records)
        return True

    def _submit_run(self, emissions: list[Emission], start: int, records: list[RecordText]) -> None:
        """records[k] is emissions[start + k]'s (a full-detail key)."""
        stats = self.stats
        taken = self._submit_many(records) if self._submit_many is not None else 0
        stats["records"] += taken
        submit = self._writer.submit
        for k in range(taken, len(records)):
            if submit(records[k]):
                stats["records"] += 1
            else:
                e = emissions[start + k]
                self._refused(cast(int, e.key[0]), e.packets)

    def _refused(self, rule_id: int, packets: int) -> None:
        stats = self.stats
        stats["writer_full"] += 1
        self.rule_refused[rule_id] = self.rule_refused.get(rule_id, 0) + packets
        self._drops.log(logging.ERROR, "writer-full",
                        "audit writer queue full: a record of %d packet(s) was dropped "
                        "(%d so far; npaudit_audit_records_total{outcome=\"dropped_writer_full\"})",
                        packets, stats["writer_full"])

    def _emit_each(self, emissions: list[Emission]) -> None:
        encode, submit, stats = self._encode, self._writer.submit, self.stats
        for e in emissions:
            # One unpacking, not an attribute read per field; every sample added here is (PacketIn, summary).
            key, sample, packets, bytes_, first, last, off_packets, off_bytes, kind = e
            pin: PacketIn
            summary: PacketSummary
            pin, summary = sample  # type: ignore[misc]
            level = key[0]
            if isinstance(level, str):  # a coarse key (see _coarse): no ports, maybe no peer
                _, _, _, src, dst, _ = cast("tuple[str, int, int, str | None, str | None, int]", key)
                keys = 1 if kind == "first" else len(self._distinct.pop(key, ())) or 1
                coarse = summary._replace(src_ip=src, dst_ip=dst, src_port=None, dst_port=None,
                                          icmp_type=None, icmp_code=None)
                record = encode(pin, coarse, packets + off_packets, bytes_ + off_bytes,
                                first, last, off_packets, level, keys)
                stats["coarsened"] += 1
            else:
                # A record's packets are what the Pod sent: OVS-seen plus offloaded (a subset, said as such).
                record = encode(pin, summary, packets + off_packets, bytes_ + off_bytes, first, last, off_packets)
            if kind != "aggregate":  # written at once: its packet-in's latency is the record's
                record.received = pin.received_at
            if submit(record):
                stats["records"] += 1
            else:
                self._refused(cast(int, key[1] if isinstance(level, str) else key[0]), packets)  # both hold the rule id
