"""The read path of the OpenFlow channel: whole messages in, packet-ins out to the demux.

Every NXT_PACKET_IN2 of a read is decoded (packetin/layouts.py: the walk of packetin/wire.py
once per layout, then one struct unpack per message) and the batch handed to the
packet-in sink on the event-loop thread; any other message goes to the channel's control
handler. While the consumer says it is coarse (the audit pipeline in overload), the
packet-ins a coarse record cannot tell apart are handed over as groups instead, only the
first of each decoded (packetin/groups.py). The reader also measures input pressure: reads
that keep bringing many messages at once mean OVS's queue towards us stays full. A read of one packet-in may go
to `lone` first (the stream offers it): its record is written before this read's counts.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol

from packetin import wire
from packetin.errors import DecodeError
from packetin.groups import PacketInGroup, split_read
from packetin.layouts import PacketIn2Decoder, fast_decoder, run_decoder
from packetin.model import PacketIn

log = logging.getLogger(__name__)

PacketInSink = Callable[[list[PacketIn], float], None]
# A read's only packet-in and the read's time: True once taken (output first, counts after: Demux.lone).
LoneSink = Callable[[PacketIn, float], bool]
GroupSink = Callable[[list[PacketInGroup], float], None]


class EarlySink(Protocol):
    """Before a lone read's message is decoded (the demux): its record made from the bytes (`early`), or what that
    would use now (`early_arm`: the event loop's quiet wait, packetin/quiet.py)."""

    def early(self, raw: bytes, now: float, wall: float) -> None: ...

    def early_arm(self, now: float) -> tuple[Any, ...] | None: ...

# Input pressure: full reads one after another, at least PRESSURE_READS of them over
# PRESSURE_SUSTAIN seconds or more, mean OVS's queue towards us (the socket, then its rconn queue
# of ovs.controller_queue_size) stays full: we are not keeping up. `input_pressed` says so until
# PRESSURE_HOLD seconds after the last such read. A read is full when it brought PRESSURE_MESSAGES
# messages or more and, over TCP, left the socket at least PRESSURE_BACKLOG full (how full a read
# left it: packetin/connect.py tcp_backlog; on a unix socket, or when the kernel will not say, the
# message count alone decides). A lone full read, or a few (the backlog of a while off the CPU on
# a busy node, read at once), is a catch-up, not overload. The message count alone is not enough:
# a 2-core VM keeping up at 42-48k/s, OVS losing nothing, brought 512+ in runs of up to 32 reads
# over 0.64 s, but those reads left the socket at most 0.46 full (p50 0.12); when OVS's queue
# overflowed they left it 0.75 full (p50; p90 0.82). At 256 messages, and later at 512 without the
# socket's fill, such an agent was taken for overloaded by the bursts of an ordinary flood.
PRESSURE_MESSAGES = 512
PRESSURE_READS = 8
PRESSURE_SUSTAIN = 0.1
PRESSURE_HOLD = 0.5
PRESSURE_BACKLOG = 0.5


class InputPressure:
    """Input pressure that should coarsen the audit: reads come back full (`pressed`) while the
    category's admission (`admission_drops`, a running count, looked at only while pressed) has
    turned nothing away for PRESSURE_HOLD seconds. While its token bucket drops the excess, the pipeline gets at most
    the bucket's rate, so coarsening would only cost the few admitted records their detail."""

    def __init__(self, pressed: Callable[[], bool], admission_drops: Callable[[], int],
                 mono_clock: Callable[[], float] = time.monotonic) -> None:
        self._pressed = pressed
        self._drops = admission_drops
        self._mono = mono_clock
        self._seen = admission_drops()
        self._limited_at = -float("inf")

    def quiet(self) -> bool:
        """True when __call__ now would say False without looking further (reads not coming back full): no side
        effects (auditlog/overload.py Overload.stays_full)."""
        return not self._pressed()

    def __call__(self) -> bool:
        # Called per packet-in while coarse: nothing more than the pressure check unless pressed.
        if not self._pressed():
            return False
        drops, now = self._drops(), self._mono()
        if drops != self._seen:
            self._seen, self._limited_at = drops, now
        return now - self._limited_at >= PRESSURE_HOLD


class PacketInReader:
    """`on_messages(msgs, backlog)` for each read; counters for the channel's metrics."""

    def __init__(self, sink: PacketInSink, on_control: Callable[[bytes], None], *,
                 on_malformed: Callable[[int], None] = lambda n: None,
                 mono_clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 on_groups: GroupSink | None = None, coarse: Callable[[], bool] = lambda: False,
                 lone_sink: LoneSink | None = None, early_sink: EarlySink | None = None
                 ) -> None:
        self._sink = sink
        self.lone_sink = lone_sink
        self.early_sink = early_sink
        self._on_control = on_control
        self._on_malformed = on_malformed
        self._mono = mono_clock
        self._wall = wall_clock
        self._group_sink = on_groups
        self._coarse = coarse
        self._pressed_at = -float("inf")
        self._full_since: float | None = None  # the first of the current run of full reads
        self._full_reads = 0  # reads in that run
        self.last_rx = 0.0
        self.packet_ins = 0
        self.malformed = 0
        self.reads = 0
        self.lone_reads = 0  # reads of one packet-in taken by `lone` (its record written before the read's counts)
        self.quiet_reads = 0  # of those, reads the event loop's quiet wait made, its record written there
        self.pressed_reads = 0  # full reads (PRESSURE_MESSAGES or more, the socket left PRESSURE_BACKLOG full)
        self.grouped = 0  # packet-ins handed over in groups
        self.decoder = PacketIn2Decoder()
        self._decode = fast_decoder(self.decoder)  # its learned layouts read in C where the module is built
        self._decode_run = run_decoder(self._decode)  # and a read's run of them in one call (None: one by one)

    def input_pressed(self) -> bool:
        """True while reads keep coming back full (PRESSURE_READS of them over PRESSURE_SUSTAIN), and
        PRESSURE_HOLD after."""
        return self._mono() - self._pressed_at < PRESSURE_HOLD

    def on_messages(self, msgs: list[bytes], backlog: float | None = None) -> None:
        """One read's messages; `backlog`: how full it left the socket (0..1), None when not known."""
        now = self._mono()
        self.last_rx = now
        self.reads += 1
        if len(msgs) >= PRESSURE_MESSAGES and (backlog is None or backlog >= PRESSURE_BACKLOG):
            self.pressed_reads += 1
            if self._full_since is None:
                self._full_since, self._full_reads = now, 0
            self._full_reads += 1
            if self._full_reads >= PRESSURE_READS and now - self._full_since >= PRESSURE_SUSTAIN:
                self._pressed_at = now
        else:
            self._full_since = None
        if self._group_sink is not None and len(msgs) > 1 and self._coarse():
            self._grouped(msgs, now)
            return
        batch = self._take(msgs, None)
        if batch:
            self.packet_ins += len(batch)
            self._sink(batch, now)

    def quiet_arm(self) -> tuple[Any, ...] | None:
        """What a lone read's early record would use now (the early sink's early_arm), for the event loop's quiet
        wait (packetin/quiet.py); None without a lone and an early sink."""
        early = self.early_sink
        return early.early_arm(self._mono()) if early is not None and self.lone_sink is not None else None

    def lone(self, raw: bytes, read_at: tuple[float, float] | None = None) -> bool:
        """on_messages([raw]) for a read whose one message `raw` is an NXT_PACKET_IN2: its packet-in handed to
        `lone_sink` (the demux's lone), which writes its record before the bookkeeping, this read's counts after
        it; one the lone sink declines goes to the batch sink as on_messages hands it, decoded once. False,
        nothing done, without a lone_sink, or when it is no packet-in decoded here (the read then goes to
        on_messages, which says why). `read_at`: (monotonic, wall) of a read the quiet wait made, its record made
        there (packetin/quiet.py), else now and the early sink first."""
        sink = self.lone_sink
        if sink is None or not wire.is_packet_in2(raw):
            return False
        if read_at is not None:
            now, wall = read_at
        else:
            now, wall = self._mono(), self._wall()
            if self.early_sink is not None:  # the record written from the bytes, before the decode (Demux.early)
                self.early_sink.early(raw, now, wall)
        try:
            pin = self._decode(raw, wall)
        except DecodeError:
            return False
        taken = sink(pin, now)
        self.last_rx = now
        self.reads += 1
        self._full_since = None
        self.packet_ins += 1
        if taken:
            self.lone_reads += 1
            self.quiet_reads += read_at is not None
        else:
            self._sink([pin], now)
        return True

    def _grouped(self, msgs: list[bytes], now: float) -> None:
        wall = self._wall()
        groups, rest = split_read(msgs, wall, self._malformed_group)
        batch = self._take(rest, wall) if rest else []
        if batch:
            self.packet_ins += len(batch)
            self._sink(batch, now)
        if groups and self._group_sink is not None:
            n = sum(len(g.raws) for g in groups)
            self.packet_ins += n
            self.grouped += n
            self._group_sink(groups, now)

    def _malformed_group(self, n: int, exc: DecodeError) -> None:
        self.malformed += n
        self._on_malformed(n)
        log.debug("%d malformed NXT_PACKET_IN2 skipped: %s", n, exc)

    def _take(self, msgs: list[bytes], wall: float | None) -> list[PacketIn]:
        """Decode the packet-ins of `msgs` (stamped `wall`, read now when None); hand the rest on."""
        batch: list[PacketIn] = []
        is_packet_in2 = wire.is_packet_in2
        decode = self._decode
        run = self._decode_run if type(msgs) is list else None
        i, n = 0, len(msgs)
        while i < n:
            raw = msgs[i]
            i += 1
            if is_packet_in2(raw):
                if wall is None:
                    wall = self._wall()
                if run is not None:  # this one and the packet-ins of learned layouts after it, in one call
                    j = run(msgs, i - 1, wall, batch)
                    if j >= i:
                        i = j
                        continue
                try:
                    batch.append(decode(raw, wall))
                except DecodeError as exc:
                    self.malformed += 1
                    self._on_malformed(1)
                    log.debug("malformed NXT_PACKET_IN2 skipped: %s", exc)
                continue
            try:
                self._on_control(raw)
            except Exception:  # a message we cannot parse must not kill the reader
                self.malformed += 1
                self._on_malformed(1)
                log.warning("could not handle OpenFlow message type %d", raw[1], exc_info=True)
        return batch
