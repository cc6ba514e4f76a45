"""The policy-audit subscriber: packet-in -> decode -> aggregate -> ECS record -> writer.

Runs on the event loop (the demux calls it per admitted packet-in, or through PolicyPacketIns.handle_run
per run of a read's plain logged packet-ins: take_run, the same records and counts in one call into C);
everything blocking (file writes, rotation, gzip) happens in the writer's thread. Every
admitted packet-in ends up in exactly one record: Drop/Reject/Pass packets of
a key are written at once for the first packet and as one aggregate record
when the window closes; Allow (one packet-in per connection) at once. In overload (auditlog/overload.py)
every disposition is aggregated with a coarser key and its records say so
(npaudit.aggregate.coarsened, .keys): fewer records, the same packet counts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, cast

from auditlog.aggregate import AggregateKey, Aggregation, AggregatorStats, Emission
from auditlog.coarse_keys import CoarseKeys
from auditlog.overload import FULL, Overload, OverloadStats
from auditlog.packet import PacketSummary, decode_frame, flow_key, group_lasts
from auditlog.record import RecordContext, RecordEncoder
from auditlog.record_fast import fast_encoder, frame_decoder
from auditlog.record_out import BatchingSink, RecordOut, RecordSink
from packetin.groups import PacketInGroup
from packetin.model import Disposition, PacketIn
from packetin.registers import DISPOSITION_BITS
from packetin.tasks import cancel_and_wait
from packetin.wire import decode_packet_in2

log = logging.getLogger(__name__)
_ALLOW = int(Disposition.ALLOW)
# Packet-ins between two looks at the backlog while at full detail (in overload: every one).
_CHECK_EVERY = 64
# Where the aggregator's add_run finds what __call__ reads: (PacketIn's size, packet, rule_id, reg7, total_len,
# received_at, PacketSummary's size, truncated, src_ip, dst_ip, protocol, dst_port, icmp_type, the disposition's
# bits, Allow).
_RUN_LAYOUT = (len(PacketIn._fields), *(PacketIn._fields.index(f) for f in
                                        ("packet", "rule_id", "reg7", "total_len", "received_at")),
               len(PacketSummary._fields), *(PacketSummary._fields.index(f) for f in
                                             ("truncated", "src_ip", "dst_ip", "protocol", "dst_port", "icmp_type")),
               DISPOSITION_BITS, _ALLOW)
# Seconds between looks at the backlog while coarse and idle (no window open).
_RECHECK = 0.5
# Seconds the window timer waits at least between two ticks: with a new key every packet-in,
# a window closes every packet-in, and one tick per window would cost an event-loop wake-up
# each. A window's aggregate record is written at most this late; "first" records never wait.
_TICK_GRAIN = 0.01


@dataclass(frozen=True)
class PipelineStats:
    """A snapshot of the pipeline's counters and its aggregator's."""

    packet_ins: int
    records: int  # queued at the writer
    writer_full: int  # refused by the writer
    decode_truncated: int
    aggregator: AggregatorStats
    coarsened: int = 0  # of `records`, those written with a coarser key in overload
    overload: OverloadStats | None = None
    early: int = 0  # of `records`, those made from a lone packet-in's bytes before it was decoded (RecordOut.early)


def aggregate_key(pin: PacketIn, summary: PacketSummary) -> AggregateKey:
    """The aggregation key of a packet-in: (rule id, disposition, src, dst, protocol, dst port or ICMP type)."""
    return (pin.rule_id, pin.reg7 & DISPOSITION_BITS, *flow_key(summary))


def tick_delay(deadline: float, now: float, ticked: float) -> float:
    """Seconds the window timer waits before closing the windows due by `deadline`: until then, but
    not sooner than _TICK_GRAIN after its last tick at `ticked` (nor longer, should the clock step back)."""
    return max(deadline - now, min(_TICK_GRAIN, ticked + _TICK_GRAIN - now))


def _second(group: PacketInGroup) -> tuple[PacketIn, PacketSummary]:
    pin = decode_packet_in2(group.raws[1], group.sample.received_at)
    return pin, decode_frame(pin.packet)


class AuditPipeline(CoarseKeys):
    def __init__(self, ctx: RecordContext, writer: RecordSink, aggregator: Aggregation,
                 wall_clock: Callable[[], float] = time.time, overload: Overload | None = None,
                 window_slack: float = 0.0) -> None:
        # Windows due when a batch of packet-ins ends are closed in that batch (end_batch): their
        # records share its write, and the timer does not wake for them (in a flood, one sleep a
        # read instead of ~1.9; bench/agent_cpu.py, whose CPU figures it left unchanged). The timer,
        # for when no batch comes, sleeps `window_slack` past the deadline: the reader's longest
        # pause in a flood (openflow.read_pace_max), so while packet-ins flow a read always comes
        # first. A window's record is that much later.
        self._slack = window_slack
        # RecordEncoder.encode_positional and decode_frame, their common cases in C where auditlog._record_fast is built
        self.encoder, self._decode_frame = fast_encoder(RecordEncoder(ctx)), frame_decoder()
        # The C encoder's begin_batch / end_batch (None: the Python one, which asks per record)
        begin, end = getattr(self.encoder, "begin_batch", None), getattr(self.encoder, "end_batch", None)
        self._encoder_batch = (begin, end) if begin is not None and end is not None else None
        # __call__'s full-detail part for a run of packet-ins in one call (take_run), where the aggregator
        # has it (the C one); else None and every packet-in goes through __call__.
        self._add_run = getattr(aggregator, "add_run", None)
        self._rules = ctx.rules
        self._overload = overload
        self._level = FULL
        self._countdown = 1  # the first packet-in looks at the backlog
        # coarse key -> the full-detail keys its open window holds (besides its "first" packet).
        self._distinct: dict[tuple, set[tuple]] = {}
        self._directions: dict[int, str] = {}
        self._writer = writer
        # Records of one batch of packet-ins (begin_batch .. end_batch) go to the writer as one batch.
        self._batching = cast("BatchingSink", writer) if hasattr(writer, "hold") and hasattr(writer, "release") \
            else None
        self._agg, self._window = aggregator, aggregator.window
        self._clock = wall_clock
        # The packet-in just decoded: a later subscriber of the same packet-in (the eBPF offload)
        # reads it with decoded() instead of decoding the frame a second time.
        self._decoded: tuple[PacketIn, PacketSummary] | None = None
        self._wake: asyncio.Event | None = None
        # The deadline the window timer sleeps until (None: until woken). Only a window that closes
        # sooner moves its alarm (or wakes it): not every packet-in (a wake-up costs a loop turn).
        self._timer_until: float | None = None
        self._ticked = -float("inf")  # wall clock of the timer's last tick
        self._task: asyncio.Task[None] | None = None
        self._alarm: tuple[asyncio.TimerHandle, Callable[[], None], asyncio.AbstractEventLoop] | None = None
        self.stats = {"packet_ins": 0, "records": 0, "writer_full": 0, "decode_truncated": 0, "coarsened": 0}
        # Per rule id: packet-ins taken, and packets of records the writer refused (rule_seen).
        self.rule_packet_ins: dict[int, int] = {}
        self.rule_refused: dict[int, int] = {}
        # Emissions -> records -> the writer (auditlog/record_out.py): the same stats, refusals and coarse keys
        self._out = RecordOut(self.encoder, writer, self.stats, self.rule_refused, self._distinct,
                              lone_texts=(getattr(ctx.rules, "mapping", None), getattr(ctx.pods, "ip_table", None)))
        self._emit = self._out.emit

    def __call__(self, pin: PacketIn) -> None:
        overload = self._overload
        if overload is not None:
            # At full detail the backlog is looked at every _CHECK_EVERY packet-ins; once
            # coarsened, at every one, so full detail comes back as soon as it is below the mark.
            self._countdown -= 1
            if self._level or self._countdown <= 0:
                self._countdown = _CHECK_EVERY
                self._level = overload.update(pin.received_at)
            if self._level:
                self._coarse(pin)
                return
        summary = self._decode_frame(pin.packet)
        decoded = self._decoded = (pin, summary)  # also the aggregator's sample: one tuple for both
        stats = self.stats
        if summary.truncated:
            stats["decode_truncated"] += 1
        stats["packet_ins"] += 1
        rule_id = pin.rule_id
        by_rule = self.rule_packet_ins
        by_rule[rule_id] = by_rule.get(rule_id, 0) + 1
        disposition = pin.reg7 & DISPOSITION_BITS  # PacketIn.disposition, without the property call per packet
        # aggregate_key(pin, summary), spelled out: this runs once per packet-in.
        last = summary.dst_port if summary.dst_port is not None else summary.icmp_type
        key = (rule_id, disposition, summary.src_ip, summary.dst_ip, summary.protocol, last)
        aggregate = disposition != _ALLOW
        emissions = self._agg.add(key, decoded, pin.total_len, pin.received_at, aggregate)
        if emissions:  # nothing else opens or closes a window: no need to look at the timer otherwise
            self._emit(emissions)
            # A window opened now closes no sooner than the one the timer sleeps towards, unless the clock
            # stepped back (received_at shows it): poke the timer only then, or when it sleeps towards nothing.
            if (until := self._timer_until) is None or pin.received_at + self._window < until:
                self._poke_timer()

    def early(self, raw: bytes, wall: float) -> None:
        """Before a lone packet-in is decoded (received `wall`): its record made from the message's bytes and
        written now (RecordOut.early), when lone would take it; lone then finds it made."""
        if self._early_takes():
            self._out.early(raw, wall, self._agg)

    def early_arm(self) -> tuple[Any, ...] | None:
        """What early would use now (RecordOut.early_arm: the event loop's quiet wait), else None."""
        return self._out.early_arm(self._agg) if self._early_takes() else None

    def _early_takes(self) -> bool:
        # No look at the backlog due that could change the level (lone declines one: RecordOut.emit takes the record)
        overload = self._overload
        return not (self._add_run is None or self._batching is None or self._level
                    or (overload is not None and self._countdown <= 1 and not overload.stays_full()))

    def lone(self, pin: PacketIn) -> bool:
        """A read's only packet-in, as begin_batch, __call__ and end_batch take it (the same records, counts and
        window timer), its record written first: when it makes one record the writer can write now, that write
        begins before the bookkeeping (this pipeline's, and that of the demux and the reader, who call this). After
        a quiet spell every step before a lone packet-in's write costs its latency tens of µs (bench/agent_path.py
        --stages). False, nothing done, unless at full detail, with the C aggregator and a batching writer, and no
        look at the backlog due at this packet-in."""
        add_run, overload = self._add_run, self._overload
        if add_run is None or self._batching is None or self._level or (overload is not None and self._countdown <= 1):
            return False
        out: list[Emission] = []
        stop, truncated, last = add_run([pin], 0, 1, self._decode_frame, _RUN_LAYOUT, self.rule_packet_ins, out)
        if not stop:  # not taken (__call__ says what is wrong with it)
            self.begin_batch()
            try:
                self(pin)
            finally:
                self.end_batch()
            return True
        stats = self.stats
        stats["packet_ins"] += 1
        stats["decode_truncated"] += truncated
        if overload is not None:
            self._countdown -= 1
        if last is not None:
            self._decoded = last
        first: bool | None = None  # None: first() raised (as emit would have: not tried again)
        try:
            first = self._out.first(out)
        finally:
            self.begin_batch()
            try:
                if out and first is not None:
                    if not first:
                        self._emit(out)
                    if (until := self._timer_until) is None or pin.received_at + self._window < until:
                        self._poke_timer()
            finally:
                self.end_batch()
        return True

    @property
    def takes_runs(self) -> bool:
        """Whether take_run can take packet-ins now: the aggregator has add_run and the level is full detail."""
        return self._add_run is not None and not self._level

    def take_run(self, pins: list[PacketIn], start: int, end: int) -> int:
        """pins[start:end] as __call__ would take them one by one, the same records and counts, up to the index
        returned: the packet-ins before it are taken. The one at it (if any) is for __call__: the aggregator's
        add_run did not take it (__call__ says what is wrong with it), or it is the one on which __call__ looks
        at the backlog (every _CHECK_EVERY-th; should the level turn coarse there, takes_runs is then False).
        The run's records go to the writer together, in the order __call__ would have given them."""
        add_run = self._add_run
        if add_run is None or self._level:
            return start
        overload, stats, out = self._overload, self.stats, cast("list[Emission]", [])
        i = start
        try:
            while i < end:
                j = end if overload is None else min(end, i + self._countdown - 1)
                if j <= i:  # this packet-in is where __call__ looks at the backlog (countdown 1): its own
                    return i
                stop, truncated, last = add_run(pins, i, j, self._decode_frame, _RUN_LAYOUT, self.rule_packet_ins,
                                                out)
                taken = stop - i
                stats["packet_ins"] += taken
                stats["decode_truncated"] += truncated
                if overload is not None:
                    self._countdown -= taken
                if last is not None:
                    self._decoded = last
                if stop < j:
                    return stop
                i = j
            return end
        finally:
            if out:
                self._emit(out)
                self._poke_timer()  # once a run: it looks at whether the soonest window now closes sooner

    def handle_group(self, group: PacketInGroup) -> None:
        """Packet-ins the reader grouped in overload (packetin/groups.py): the same records and
        counts as one call per packet-in under the current coarse key, for one decoded frame.
        Back at full detail (or without windows) they are taken one by one."""
        sample = group.sample
        if self._overload is not None:
            self._countdown = _CHECK_EVERY
            self._level = self._overload.update(sample.received_at)
        if not self._level or not self._agg.window:
            for pin in group.packet_ins():
                self(pin)
            return
        summary = self._decode_frame(sample.packet)
        self._decoded = (sample, summary)
        lasts, truncated = group_lasts(group.raws, summary)
        stats = self.stats
        stats["decode_truncated"] += truncated
        stats["packet_ins"] += len(lasts)
        by_rule = self.rule_packet_ins
        by_rule[sample.rule_id] = by_rule.get(sample.rule_id, 0) + len(lasts)
        key, prefix = self._coarse_key(sample, summary)
        emissions = self._agg.add_many(key, (sample, summary), len(lasts), sample.total_len, sample.received_at,
                                       lambda: _second(group))
        self._coarse_counted(key, emissions, prefix, lasts)

    def begin_batch(self) -> None:
        """The packet-ins up to `end_batch` came in one read: their records go to the writer together, and the
        C encoder asks for the Pod table and each rule once for them, not per record (neither changes while a
        read is handled: the engine swaps them on the event loop, between reads)."""
        if self._batching is not None:
            self._batching.hold()
        if self._encoder_batch is not None:
            self._encoder_batch[0]()

    def end_batch(self) -> None:
        try:
            self._close_due()
        finally:
            if self._encoder_batch is not None:
                self._encoder_batch[1]()
            if self._batching is not None:
                self._batching.release()

    def _close_due(self) -> None:
        """Close the windows due by now, if any; then, if the window the timer sleeps towards is closed
        (here, or by a new key's packet-in: the aggregator closes what is due before it opens a window),
        have it sleep towards the next one instead of waking for nothing."""
        agg = self._agg
        deadline = agg.next_deadline()
        if deadline is not None and deadline <= (now := self._clock()):
            try:
                self._ticked = now
                self._emit(agg.tick(now))
            except Exception:  # the batch's own records must still be released
                log.exception("closing aggregation windows failed")
            deadline = agg.next_deadline()
        wake, until = self._wake, self._timer_until
        if wake is not None and until is not None and (deadline is None or deadline > until) and not wake.is_set() \
                and not self._move_alarm(deadline):
            wake.set()  # the timer recomputes in the next loop turn: no sleep, no wake-up of the process

    def decoded(self, pin: PacketIn) -> PacketSummary:
        """The frame of `pin` decoded: the pipeline's own decoding when it just took that packet-in."""
        last = self._decoded
        if last is not None and last[0] is pin:
            return last[1]
        return self._decode_frame(pin.packet)

    def add_offloaded(self, key: AggregateKey, packets: int, bytes_: int, sample: tuple[PacketIn, PacketSummary]
                      ) -> None:
        """Fold drops the eBPF offload counted for `key` (never seen by OVS) into its records;
        `sample` (a packet-in of the key and its summary) names the flow when no OVS packet does."""
        emissions = self._agg.add_offloaded(key, packets, bytes_, self._clock(), sample)
        if emissions:
            self._emit(emissions)
        self._poke_timer()  # a window may have opened without a record

    def _poke_timer(self) -> None:
        """Wake the window timer if the soonest window now closes before what it sleeps until."""
        wake = self._wake
        if wake is None or wake.is_set():
            return
        until = self._timer_until
        if until is None:
            if self._agg.next_deadline() is not None:
                wake.set()
            return
        deadline = self._agg.next_deadline()
        if deadline is not None and deadline < until and not self._move_alarm(deadline):
            wake.set()

    # --- window timer ----------------------------------------------------------------

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._timer(), name="audit-windows")

    async def _timer(self) -> None:
        wake = self._wake
        if wake is None:
            return
        while True:
            deadline = self._agg.next_deadline()
            if deadline is None and self._level and self._overload is not None:
                # Coarse with nothing open: look again later, so that full detail (and the
                # overload metrics) come back when the input stops, not at the next packet-in.
                deadline = self._clock() + _RECHECK
            self._timer_until = deadline
            if deadline is None:
                await wake.wait()
                wake.clear()
                continue
            delay = tick_delay(deadline + self._slack, self._clock(), self._ticked)
            if delay > 0 and not await self._sleep(wake, delay):
                continue  # woken: a new window may close sooner; recompute
            try:
                now = self._ticked = self._clock()
                if self._overload is not None:
                    self._level = self._overload.update(now)
                self._timer_until = None  # recomputed at the loop's top: end_batch need not wake this task
                self.begin_batch()
                try:
                    self._emit(self._agg.tick(now))
                finally:
                    self.end_batch()
            except Exception:  # keep closing windows whatever one record did
                log.exception("closing aggregation windows failed")

    async def _sleep(self, wake: asyncio.Event, delay: float) -> bool:
        """Sleep `delay` seconds unless `wake` is set first: True when the time ran out. The time
        running out sets `wake` too (a timer callback), so the common end, a window due, raises
        nothing: asyncio.timeout would cancel the task and turn that into TimeoutError, a few
        exceptions per tick, and the timer ticks up to 1/_TICK_GRAIN times a second."""
        timed_out = False

        def due() -> None:
            nonlocal timed_out
            timed_out = True
            wake.set()

        loop = asyncio.get_running_loop()
        self._alarm = (loop.call_later(delay, due), due, loop)
        try:
            await wake.wait()
        finally:
            if (alarm := self._alarm) is not None:
                alarm[0].cancel()
            self._alarm = None
        wake.clear()
        return timed_out

    def _move_alarm(self, deadline: float | None) -> bool:
        """Move the sleeping timer's alarm to `deadline`, its task left asleep: False if it has none (wake it)."""
        alarm = self._alarm
        if alarm is None or deadline is None:
            return False
        handle, due, loop = alarm
        handle.cancel()
        self._alarm = (loop.call_later(tick_delay(deadline + self._slack, self._clock(), self._ticked), due), due, loop)
        self._timer_until = deadline
        return True

    @property
    def coarse(self) -> bool:
        """True while in overload (the reader may hand packet-ins over in groups)."""
        return self._level != FULL

    @property
    def aggregator(self) -> Aggregation:
        return self._agg

    def rule_seen(self) -> dict[int, int]:
        """Per rule id: packet-ins taken less the OVS-seen packets of records the writer refused, since start."""
        refused = self.rule_refused
        return {rule_id: n - refused.get(rule_id, 0) for rule_id, n in self.rule_packet_ins.items()}

    def snapshot(self) -> PipelineStats:
        overload = self._overload.stats(self._clock()) if self._overload is not None else None
        return PipelineStats(**self.stats, aggregator=self._agg.snapshot(), overload=overload,
                             early=self._out.early_records)

    async def close(self) -> None:
        """Write what the open windows hold, then stop the timer."""
        await cancel_and_wait(self._task)
        self._task = None
        self._emit(self._agg.flush(self._clock()))
