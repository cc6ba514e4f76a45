"""asyncio OpenFlow 1.5 connection to one bridge: handshake, keepalive, confirmed batches, replay.

The channel connects as a client (unix socket path, or tcp:HOST:PORT), switches
packet-ins to NXT_PACKET_IN2, and hands every decoded batch to `on_packet_ins`
on the event-loop thread (the read path: packetin/reader.py; in audit overload, groups).
Flow and meter changes go out in batches that
return only when a barrier confirms them; the switch's OFPT_ERRORs come back as
OpenFlowError naming the failing message; `commit_flows` (bundle_exchange.py) sends a change as one
atomic bundle instead (all or nothing). What the switch confirmed is kept as
the desired state and replayed (meters, then all flows as one bundle)
after every reconnect, e.g. when ovs-vswitchd restarts with an empty table.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Sequence

from os_ken.ofproto import ofproto_v1_5 as ofp

from meters.ovs import MeterSpec, MeterSupport
from packetin import messages
from packetin.bundle_exchange import BundleExchange
from packetin.connect import OpenFlowStream, open_target
from packetin.desired_state import DesiredState, settle
from packetin.errors import ChannelClosed, DecodeError, OpenFlowError
from packetin.read_pacing import READ_TRICKLE, ReadPacer, read_batch
from packetin.reader import EarlySink, GroupSink, LoneSink, PacketInReader, PacketInSink
from packetin.refusals import add_or_modify, meter_exists, raise_first, refusal
from packetin.tasks import cancel_and_wait, within

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChannelSettings:
    # unix socket path (or unix:PATH), or tcp:HOST:PORT
    target: str
    # For tcp targets: the network namespace to connect from ("" = ours). Lets the
    # agent reach a controller port on 127.0.0.1 of the embedded OVS's namespace.
    netns: str = ""
    echo_interval: float = 5.0
    echo_timeout: float = 15.0
    reconnect_min: float = 0.05
    reconnect_max: float = 2.0
    request_timeout: float = 10.0
    # The longest pause between reads in a flood (packetin/read_pacing.py); 0 = no pacing.
    read_pace_max: float = 0.0
    # Packet-ins this many seconds apart or more are read as they come, never paced.
    read_trickle: float = READ_TRICKLE


class OpenFlowChannel(BundleExchange):
    """One OpenFlow connection to one bridge, kept up until `close`.

    `mono_clock` is the only clock the keepalive reads (and the `now` handed to
    `on_packet_ins`); `wall_clock` stamps packet-ins. `sleep` is every wait the channel
    makes (keepalive interval, reconnect backoff) and `rng` the source of the backoff's
    jitter and of the first xid. Tests drive all four.
    """

    def __init__(self, settings: ChannelSettings, on_packet_ins: PacketInSink, *,
                 on_malformed: Callable[[int], None] = lambda n: None,
                 mono_clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 on_groups: GroupSink | None = None, coarse: Callable[[], bool] = lambda: False,
                 read_urgent: Callable[[], bool] = lambda: False,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None, on_lone: LoneSink | None = None,
                 on_early: EarlySink | None = None) -> None:
        """`on_lone`: a read's only packet-in, taken (True) with its output before the read's bookkeeping
        (PacketInReader.lone; the demux's lone). `on_groups` and `coarse`: while coarse() is True, the packet-ins
        of a read that a coarse record cannot tell apart go to on_groups as PacketInGroups (packetin/groups.py).
        `read_urgent`: while it is True no read is followed by a paced pause (somebody waits for packet-ins:
        packetin/read_pacing.py)."""
        self.settings = settings
        self._reader = PacketInReader(on_packet_ins, self._on_control, on_malformed=on_malformed,
                                      mono_clock=mono_clock, wall_clock=wall_clock, on_groups=on_groups,
                                      coarse=coarse, lone_sink=on_lone, early_sink=on_early)
        self._mono = mono_clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._proto: OpenFlowStream | None = None
        self._xid = self._rng.randrange(1 << 16, 1 << 24)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._multipart: dict[int, list[Any]] = {}
        self._errors: dict[int, Any] = {}
        self._hello: asyncio.Future[int] | None = None
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._desired = DesiredState()  # what the switch confirmed, replayed after reconnects
        self._bundle_id = 0
        self._bundle_lock = asyncio.Lock()
        self.datapath_id: int | None = None
        self.meter_support: MeterSupport | None = None
        self.connects = 0
        self._pacer: ReadPacer | None = None  # the current connection's (packetin/read_pacing.py)
        self._paced_before = 0  # paced reads of the connections before it
        self._urgent_before = 0  # and reads not paced because somebody waited for packet-ins
        # True while somebody waits for packet-ins (the agent: a trace for its copies): no read is paced then.
        self.read_urgent = read_urgent

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="openflow-channel")

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until connected, handshaken and replayed."""
        await within(self._ready.wait(), timeout)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def close(self) -> None:
        self._closing = True
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        await cancel_and_wait(self._task)
        self._fail_pending(ChannelClosed("channel closed"))

    async def _run(self) -> None:
        delay = self.settings.reconnect_min
        while not self._closing:
            try:
                await self._connect_once()
                delay = self.settings.reconnect_min
            except (OSError, asyncio.TimeoutError, ChannelClosed, OpenFlowError) as exc:
                log.warning("OpenFlow connection to %s: %s", self.settings.target,
                            str(exc) or type(exc).__name__)
            finally:
                self._ready.clear()
                self._fail_pending(ChannelClosed(f"connection to {self.settings.target} lost"))
                if self._proto is not None and self._proto.transport is not None:
                    self._proto.transport.abort()
                self._proto = None
            if self._closing:
                return
            # Jittered exponential backoff: many agents restarting together spread out.
            await self._sleep(delay * (0.5 + self._rng.random()))
            delay = min(self.settings.reconnect_max, delay * 2)

    async def _connect_once(self) -> None:
        # The switch sends its HELLO as soon as it accepts: be ready for it before connecting.
        self._hello = asyncio.get_running_loop().create_future()
        try:
            proto = await within(
                open_target(self.settings.target, self.settings.netns, self._new_stream),
                self.settings.request_timeout)
        except BaseException:
            self._hello.cancel()  # nobody will wait for it
            raise
        self._proto = proto
        self._reader.last_rx = self._mono()
        self._send(messages.hello())
        version = await within(self._hello, self.settings.request_timeout)
        if version < ofp.OFP_VERSION:
            raise ChannelClosed(f"switch offers OpenFlow version {version}; need 0x06 (1.5): "
                                "set protocols=OpenFlow15 on the bridge")
        features = await self.request(messages.features_request())
        self.datapath_id = features.datapath_id
        self._send(messages.set_config())
        self._send(messages.set_packet_in_format_nxt2())
        try:
            parts = await self.multipart(messages.meter_features_request())
            max_meter, band_types, max_bands = messages.parse_meter_features(parts[0])
        except OpenFlowError as exc:  # a datapath without meters may refuse the request
            log.debug("meter features request refused: %s", exc)
            max_meter = band_types = max_bands = 0
        self.meter_support = MeterSupport(max_meter=max_meter, band_types=band_types,
                                          max_bands=max_bands)
        await self._barrier()
        await self._replay()
        self.connects += 1
        log.info("OpenFlow connected to %s (dpid %016x, connect #%d, meters %s)",
                 self.settings.target, self.datapath_id or 0, self.connects,
                 "supported" if self.meter_support.supported else "NOT supported")
        self._ready.set()
        echo = asyncio.get_running_loop().create_task(self._keepalive(proto))
        try:
            await proto.closed
        finally:
            echo.cancel()

    def _new_stream(self) -> OpenFlowStream:
        pace = self.settings.read_pace_max
        if self._pacer is not None:
            self._paced_before += self._pacer.paced_reads
            self._urgent_before += self._pacer.urgent_reads
        self._pacer = ReadPacer(lambda: self._reader.packet_ins, batch=read_batch(self.settings.target), delay_max=pace,
                                trickle=self.settings.read_trickle, urgent=lambda: self.read_urgent()) \
            if pace > 0 else None
        return OpenFlowStream(self.settings.target, self._reader.on_messages, self._stream_lost, self._pacer,
                              self._reader.lone if self._reader.lone_sink is not None else None, self._reader)

    def _stream_lost(self, stream: OpenFlowStream) -> None:
        # Fail waiting requests now: a handshake or replay must not sit out its timeout.
        if self._proto in (stream, None):
            self._fail_pending(ChannelClosed(f"connection to {self.settings.target} lost"))

    async def _keepalive(self, proto: OpenFlowStream) -> None:
        """Every echo_interval: an echo request, or give up on a switch silent for echo_timeout."""
        interval = self.settings.echo_interval
        while True:
            await self._sleep(interval)
            if self._mono() - self._reader.last_rx > self.settings.echo_timeout:
                log.warning("no message from %s for %.1fs; reconnecting",
                            self.settings.target, self.settings.echo_timeout)
                if proto.transport is not None:
                    proto.transport.abort()
                return
            self._send(messages.echo_request())

    async def _replay(self) -> None:
        """Reinstall the desired state: meters (which change no forwarding until a flow
        names them), then every flow in one atomic bundle. A refused item is logged and forgotten,
        not retried forever: the switch that refused it will refuse it again on every reconnect."""
        desired = self._desired
        meters = list(desired.meters.values())
        for what, items, install in (
            ("meter", meters, lambda: self.install_meters(meters)),
        ):
            if not items:
                continue
            try:
                await install()
            except OpenFlowError as exc:
                log.error("replay to %s: %s was refused and is dropped from the desired state: %s",
                          self.settings.target, what, exc)
        async with self._bundle_lock:
            await self._replay_flows()
        if desired:
            log.info("replayed %s to %s", desired.describe(), self.settings.target)

    async def _replay_flows(self) -> None:
        """One bundle takes the switch from whatever it holds (nothing after a restart; maybe the
        flows of a commit whose answer was lost) to exactly the desired flows: no observer, and no
        packet, ever meets a half-replayed table. Without the refused flows if it refuses some."""
        desired = self._desired
        while True:
            install, delete = desired.replay_flows()
            refused = await self._bundle(install, delete) if install or delete else {}
            if not refused:
                break
            for exc in refused.values():
                log.error("replay to %s: flow was refused and is dropped from the desired state: %s",
                          self.settings.target, exc)
            desired.forget_refused(install, delete, refused)  # at least one each round: the loop ends
        desired.in_doubt.clear()

    # --- public requests -------------------------------------------------------------
    # Each returns once a barrier confirmed the whole batch. What the switch accepted
    # becomes desired state (replayed after reconnects) even when another item of the
    # same batch was refused; the first refusal is then raised as OpenFlowError.

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        """Add (or overwrite) flows."""
        refused = await self._batch([(messages.flow_add(f), f.describe()) for f in flows])
        settle(self._desired.flows, [f.key for f in flows], flows, refused)

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None:
        refused = await self._batch([(messages.flow_delete_strict(f), "delete " + f.describe()) for f in flows])
        settle(self._desired.flows, [f.key for f in flows], None, refused)

    async def install_meters(self, meters: Sequence[MeterSpec]) -> None:
        """Add meters, or modify the ones that already exist."""
        refused = await add_or_modify(
            self._batch, meters, messages.meter_mod, ofp.OFPMC_ADD, ofp.OFPMC_MODIFY, meter_exists)
        settle(self._desired.meters, [x.meter_id for x in meters], meters, refused)

    async def delete_meters(self, meter_ids: Iterable[int]) -> None:
        ids = list(meter_ids)
        refused = await self._batch([(messages.meter_delete(i), f"delete meter_id={i}") for i in ids])
        settle(self._desired.meters, ids, None, refused)

    async def delete_flows_by_cookie(self, cookie: int, mask: int) -> None:
        """Delete every flow whose cookie matches under `mask` (e.g. a previous agent round).

        Not part of the desired state: it removes what an earlier run left behind."""
        delete = messages.flow_delete_cookie(cookie, mask)
        refused = await self._batch([(delete, f"delete cookie={cookie:#x}/{mask:#x}")])
        raise_first(refused)

    @property
    def desired_flows(self) -> list[messages.FlowSpec]:
        return list(self._desired.flows.values())

    async def request(self, msg: Any) -> Any:
        """Send a request and return the single reply with the same xid."""
        return await self._reply(self._send(msg))

    async def _reply(self, xid: int) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self._pending[xid] = fut
        try:
            return await within(fut, self.settings.request_timeout)
        finally:
            self._pending.pop(xid, None)

    async def multipart(self, msg: Any) -> list[bytes]:
        """Send a multipart request; return every reply part as raw bytes.

        Raw, because os-ken's OpenFlow 1.5 parsers do not read every reply OVS
        sends (meter features come in the 16-byte OpenFlow 1.3 layout).
        """
        xid = self._send(msg)
        self._multipart[xid] = []
        fut = asyncio.get_running_loop().create_future()
        self._pending[xid] = fut
        try:
            await within(fut, self.settings.request_timeout)
            return self._multipart[xid]
        finally:
            self._pending.pop(xid, None)
            self._multipart.pop(xid, None)

    def send_nowait(self, msg: Any) -> int:
        """Fire-and-forget (packet-outs): returns the xid used."""
        return self._send(msg)

    # --- batches ---------------------------------------------------------------------

    async def _barrier(self) -> None:
        await self.request(messages.barrier())

    async def _batch(self, items: list[tuple[Any, str]]) -> dict[int, OpenFlowError]:
        """Send messages then a barrier; return the switch's refusals by item index."""
        if not items:
            return {}
        if self._proto is None:
            raise ChannelClosed(f"not connected to {self.settings.target}")
        xids = self._send_many([msg for msg, _ in items])  # one write: contiguous on the wire
        for xid in xids:
            self._errors[xid] = None
        try:
            await self._barrier()
        finally:
            replies = [self._errors.pop(x, None) for x in xids]
        return {i: refusal(err, items[i][0], items[i][1], xids[i])
                for i, err in enumerate(replies) if err is not None}

    # --- I/O -------------------------------------------------------------------------

    def _next_xid(self) -> int:
        self._xid = (self._xid + 1) & 0xFFFFFFFF or 1
        return self._xid

    def _send(self, msg: Any) -> int:
        return self._send_many([msg])[0]

    def _send_many(self, msgs: list[Any]) -> list[int]:
        """Serialise every message and hand them to the transport in one write."""
        xids = [self._next_xid() for _ in msgs]
        self._send_raw(b"".join(messages.serialize(msg, xid) for msg, xid in zip(msgs, xids)))
        return xids

    def _send_raw(self, data: bytes) -> None:
        proto = self._proto
        if proto is None or proto.transport is None or proto.transport.is_closing():
            raise ChannelClosed(f"not connected to {self.settings.target}")
        proto.transport.write(data)
        proto.hurry()  # whatever we send may be answered: read the answer now, not after a paced pause

    def _fail_pending(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(exc)

    def input_pressed(self) -> bool:
        """True while reads keep coming back with PRESSURE_MESSAGES or more (packetin/reader.py)."""
        return self._reader.input_pressed()

    # The reader's counters (one reader over every connection).
    packet_ins = property(lambda self: self._reader.packet_ins, doc="Packet-ins read")
    malformed = property(lambda self: self._reader.malformed, doc="Messages that could not be decoded")
    grouped = property(lambda self: self._reader.grouped, doc="Packet-ins handed over in groups (overload)")
    pressed_reads = property(lambda self: self._reader.pressed_reads, doc="Full reads (input pressure)")
    reads = property(lambda self: self._reader.reads, doc="Reads of the socket")
    lone_reads = property(lambda self: self._reader.lone_reads, doc="Reads of one packet-in taken by the lone "
                          "path (PacketInReader.lone)")
    quiet_reads = property(lambda self: self._reader.quiet_reads, doc="Of those, reads the event loop's quiet wait "
                           "made, their record written there (packetin/quiet.py)")

    @property
    def paced_reads(self) -> int:
        """Reads followed by a paced pause, over every connection."""
        return self._paced_before + (self._pacer.paced_reads if self._pacer is not None else 0)

    @property
    def urgent_reads(self) -> int:
        """Reads a pause would have followed, not paced because somebody waited for packet-ins (read_urgent)."""
        return self._urgent_before + (self._pacer.urgent_reads if self._pacer is not None else 0)

    def _on_control(self, raw: bytes) -> None:
        msg_type = raw[1]
        xid = int.from_bytes(raw[4:8], "big")
        if msg_type == ofp.OFPT_HELLO:
            if self._hello is not None and not self._hello.done():
                self._hello.set_result(raw[0])
            return
        if msg_type == ofp.OFPT_ECHO_REQUEST:
            if self._proto is not None and self._proto.transport is not None:
                reply = messages.serialize(messages.echo_reply(raw[8:]), xid)
                self._proto.transport.write(reply)
            return
        if msg_type == ofp.OFPT_ECHO_REPLY:
            return
        if msg_type == ofp.OFPT_MULTIPART_REPLY:
            parts = self._multipart.get(xid)
            if parts is None:
                return
            parts.append(raw)
            if messages.multipart_more(raw):
                return
            fut = self._pending.get(xid)
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        msg = messages.parse(raw)
        if msg is None:
            raise DecodeError(f"os-ken could not parse message type {msg_type}")
        if msg_type == ofp.OFPT_ERROR:
            if xid in self._errors:
                self._errors[xid] = msg
            else:
                fut = self._pending.get(xid)
                if fut is not None and not fut.done():
                    fut.set_exception(refusal(msg, None, "request", xid))
                else:
                    log.warning("OpenFlow error for xid %d: type %d code %d", xid, msg.type, msg.code)
            return
        fut = self._pending.get(xid)
        if fut is not None and not fut.done():
            fut.set_result(msg)

