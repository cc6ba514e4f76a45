"""Every meters.stats_interval seconds: read the OVS meter statistics, then state the window's losses.

The meter band counts come over the agent's own OpenFlow channel (OFPMP_METER);
they feed npaudit_meter_dropped_*_total and, with ovs-vswitchd's packet-in
overflow counters, the demux's admission drops and the records a full writer
refused, the loss records written into the audit trail (auditlog/loss_records.py).
Nothing here runs on the packet-in path: it only reads counters.

With cluster.deny_unknown_sources each window also reads the packet count of the flow dropping
new connections from the tunnel whose source is no Pod this node knows (policy/tunnel_flows.py):
no rule saw those packets, so they are stated like the drops before the pipeline (reason
unknown_source) and exported as npaudit_cluster_unknown_source_drops_total. With Geneve it also
reads the packet count of the flow dropping IPv4 from the tunnel whose VNI is neither Pod traffic's
nor a trace mark's (npaudit_cluster_unknown_vni_drops_total, and a warning when it grows: a node
of a newer version marking packets this one does not know, or something else sending Geneve here);
no rule saw those either, so they are stated the same way (reason unknown_vni, source tunnel).

Each window also reads the packet counts of every logged rule's flows (one OFPMP_FLOW_DESC
request, policy_agent/limits/rule_flows.py) and states, per rule, what its flows matched
that its records do not hold (policy_agent/limits/rule_losses.py).

With per-rule fair meters (policy_agent/limits/meter_sync.py) each rule's meter counts
under its class (policy_allow, policy_deny): the `meter` label stays bounded. Their
meters are read once more just before they are deleted, so their drops stay exact.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Protocol

from auditlog.chain import RecordText
from auditlog.loss_records import (ADMISSION, DATAPATH_DROP, FRAMES, METER, OVS_QUEUE, PORT_RX_DROPPED,
                                   PORT_SOCKET_OVERFLOW, RECORDS, UNKNOWN_SOURCE, UNKNOWN_VNI, WRITER_FULL,
                                   LossKey, LossRecorder)
from meters.ovs import MeterSupport
from meters.rule_meters import RuleMeterRange
from meters.stats import METER_CATEGORIES, Dropped, MeterTotals, meter_name
from packetin import messages
from packetin.demux import DROPPED_QUEUE, DROPPED_RATE
from packetin.errors import ChannelClosed, DecodeError, OpenFlowError
from packetin.ratelimited_log import RateLimitedLog
from packetin.tasks import cancel_and_wait, within
from policy_agent.limits.rule_flows import RuleFlowTotals, parse_flow_packets, parse_logged_flows, policy_flows_request
from policy_agent.limits.rule_losses import RuleLoss, RuleLossLedger
from policy_agent.ovs.port_stats import RX_DROPPED, SOCKET_DROPPED, PortDropTotals

log = logging.getLogger(__name__)

ADMISSION_SOURCES = {DROPPED_RATE: "rate_limit", DROPPED_QUEUE: "queue_full"}
# A flow statistics reply up to this size (a few logged rules' flows) is parsed on the loop: some 0.25 ms
# (parsing costs ~60 us per KiB), about what the two wake-ups of a hand-off to a worker thread cost; a
# larger one goes to a thread, so the loop never stalls long enough to show in packet-in latency.
INLINE_PARSE_BYTES = 4 * 1024
# Seconds the last window at stop may take. Its reads wait up to OpenFlow's request timeout each; a node's
# grace period (Kubernetes: 30 s) ends a slow stop with SIGKILL, before the audit trail and its loss note close.
LAST_WINDOW_BOUND = 5.0
PORT_REASONS = {RX_DROPPED: PORT_RX_DROPPED, SOCKET_DROPPED: PORT_SOCKET_OVERFLOW}


class MeterChannel(Protocol):
    """The OpenFlow channel as the meter statistics reader sees it (packetin.channel.OpenFlowChannel)."""

    @property
    def ready(self) -> bool: ...

    meter_support: MeterSupport | None

    async def multipart(self, msg: Any) -> list[bytes]: ...


class Restartable:
    """Totals of counters that start again from zero when their process restarts (vswitchd coverage).

    The first reading is the baseline: what was counted before the agent looked is not its to state."""

    def __init__(self) -> None:
        self._raw: dict[str, int] = {}
        self.totals: dict[str, int] = {}

    def update(self, readings: Mapping[str, int | None]) -> None:
        for name, raw in readings.items():
            if raw is None:
                continue
            before = self._raw.get(name)
            if before is not None:
                self.totals[name] = self.totals.get(name, 0) + (raw - before if raw >= before else raw)
            else:
                self.totals.setdefault(name, 0)
            self._raw[name] = raw


class RuleMeterSource(Protocol):
    """The per-rule meters as the statistics reader sees them (policy_agent.limits.meter_sync.RuleMeters)."""

    range: RuleMeterRange

    def class_of(self, meter_id: int) -> int | None: ...

    def meter_of_rule(self) -> dict[int, int]: ...

    async def sweep(self, present: list[int]) -> None: ...


class LossAccounting:
    """Reads meter statistics and writes loss records, once per `interval` (a task, until `close`).

    `submit` is the audit writer's (None: no audit log, meter statistics only);
    `admission` returns the demux's counters and `writer_full` the records the
    pipeline could not queue; `ovs_losses` reads ovs-vswitchd's coverage
    counters (blocking: run in a thread). `rule_seen` returns, per rule id, the packet-ins
    the audit pipeline took less those of records it could not write; `describe` turns a
    rule id into the loss record's rule object. Without `rule_seen` no per-rule loss is stated.
    `port_drops` reads the frames lost on ports before ovs-vswitchd read them ("<port> <kind>":
    count, ovs/port_stats.py) and `datapath_drops` the datapath's drop counters before the
    pipeline (coverage); both blocking, run in a thread; None: not read. `unknown_sources` returns the
    flow statistics request of the drop of unknown sources for the current round (None: not read), which
    come in through `unknown_via` (the source of their loss records: tunnel, or gateway when routed);
    `unknown_vnis` that of the drop of unknown VNIs from the tunnel (None: not read, no Geneve).
    """

    def __init__(self, channel: MeterChannel, *, interval: float,
                 admission: Callable[[], Mapping[str, Mapping[str, int]]],
                 ovs_losses: Callable[[], Mapping[str, int | None]],
                 writer_full: Callable[[], int] = lambda: 0,
                 submit: Callable[[RecordText], bool] | None = None,
                 context: Mapping[str, Any] | None = None,
                 rule_seen: Callable[[], Mapping[int, int]] | None = None,
                 describe: Callable[[int], Mapping[str, str]] | None = None,
                 port_drops: Callable[[], Mapping[str, int]] | None = None,
                 datapath_drops: Callable[[], Mapping[str, int | None]] | None = None,
                 unknown_sources: Callable[[], Any] | None = None, unknown_via: str = "tunnel",
                 unknown_vnis: Callable[[], Any] | None = None,
                 mono_clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._channel = channel
        self.interval = interval
        self._admission = admission
        self._ovs_losses = ovs_losses
        self._writer_full = writer_full
        self._mono, self._wall = mono_clock, wall_clock
        self.meters = MeterTotals(started=mono_clock())
        self.meters_read = False  # True once a reply came: before that the meter counts are unknown
        self.read_errors = 0
        self.ovs = Restartable()
        self.recorder = None if submit is None else LossRecorder(
            submit, now=wall_clock(), context=context,
            describe=describe or (lambda rule_id: {"id": str(rule_id)}))
        self._rule_seen = rule_seen
        self._port_drops, self._datapath_drops = port_drops, datapath_drops
        self.ports = PortDropTotals()
        self.datapath = Restartable()
        self.rule_flows = RuleFlowTotals()
        self._unknown_request, self._unknown_via = unknown_sources, unknown_via
        # This round's drop flow (asked for by its whole cookie) is this run's: counted from its first packet.
        self.unknown_sources = RuleFlowTotals(baseline=False)
        self._vni_request = unknown_vnis
        self.unknown_vnis = RuleFlowTotals(baseline=False)  # the same: this round's flow
        self._vni_said = (0, float("-inf"))  # unknown-VNI drops as of the last warning, and when it was
        # A packet-in reaches the pipeline well within a window (or two seconds) of its flow counting it.
        self.rule_ledger = RuleLossLedger(settle=max(interval, 2.0))
        self.own_meter_drops: dict[int, int] = {}  # per-rule meter id -> its drops this run (MeterTotals')
        self._errors = RateLimitedLog(log, 60.0, clock=mono_clock)
        self._task: asyncio.Task[None] | None = None
        self._reading = asyncio.Lock()  # one reading at a time: replies folded in the order taken
        self.rule_meters: RuleMeterSource | None = None  # set when meters.per_rule is on
        self._present: list[int] = []  # the meter ids of the last reading
        # The window's blocking reads run in one thread of their own: handing work to the loop's shared
        # pool also wakes its other idle workers (each hand-off two or three thread wake-ups, not one).
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="npaudit-loss-reads")

    def _fold(self, meter_id: int) -> int | None:
        """The meter a reading's drops count under: a per-rule meter's class; one of the range that
        is not ours (left by an earlier run, holding no flows) is not counted."""
        rm = self.rule_meters
        if rm is None or meter_id not in rm.range:
            return meter_id
        return rm.class_of(meter_id)

    def dropped(self) -> dict[str, Dropped] | None:
        """Meter drops by meter name, None until the first statistics reply (or without meters)."""
        if not self.meters_read:
            return None
        return {meter_name(meter_id): d for meter_id, d in self.meters.totals().items()}

    def dropped_json(self) -> dict[str, dict[str, int]] | None:
        """dropped() for `npaudit status|stats`: {meter: {packets, bytes}}."""
        drops = self.dropped()
        return None if drops is None else {m: {"packets": d.packets, "bytes": d.bytes} for m, d in drops.items()}

    async def read_meters(self) -> None:
        """One OFPMP_METER request; a failure is logged (rate-limited) and counted, never raised."""
        support = self._channel.meter_support
        if not self._channel.ready or support is None or not support.supported:
            return
        async with self._reading:
            try:
                parts = await self._channel.multipart(messages.meter_stats_request())
                readings = messages.parse_meter_stats(parts)
            except (OpenFlowError, ChannelClosed, DecodeError, asyncio.TimeoutError) as exc:
                self.read_errors += 1
                self._errors.log(logging.WARNING, "meter-stats", "OVS meter statistics not read: %s",
                                 str(exc) or type(exc).__name__)
                return
            self.meters.update(readings, self._mono(), self._fold)
            if self.rule_meters is not None:  # for the split of each rule's loss
                own = self.rule_meters.range
                self.own_meter_drops = {m: n for m, n in self.meters.packets_by_meter().items() if m in own}
            self.meters_read = True
            self._present = [r.meter_id for r in readings]

    async def read_rule_flows(self) -> bool:
        """One OFPMP_FLOW_DESC request over the policy flows into `rule_flows`; False if not read (logged)."""
        if not self._channel.ready:
            return False
        try:
            parts = await self._channel.multipart(policy_flows_request())
            if sum(len(part) for part in parts) <= INLINE_PARSE_BYTES:
                flows = parse_logged_flows(parts)
            else:
                flows = await asyncio.get_running_loop().run_in_executor(self._reads, parse_logged_flows, parts)
        except (OpenFlowError, ChannelClosed, DecodeError, asyncio.TimeoutError) as exc:
            self.read_errors += 1
            self._errors.log(logging.WARNING, "flow-stats", "OVS flow statistics of the logged rules not read: %s",
                             str(exc) or type(exc).__name__)
            return False
        self.rule_flows.update(flows)
        return True

    async def read_unknown_sources(self) -> None:
        """The packet count of the drop of unknown sources; a failure is logged (rate-limited) and counted."""
        if self._unknown_request is None or not self._channel.ready:
            return
        try:
            parts = await self._channel.multipart(self._unknown_request())
            self.unknown_sources.update(parse_flow_packets(parts))
        except (OpenFlowError, ChannelClosed, DecodeError, asyncio.TimeoutError) as exc:
            self.read_errors += 1
            self._errors.log(logging.WARNING, "unknown-sources", "OVS flow statistics of the drop of unknown "
                             "sources not read: %s", str(exc) or type(exc).__name__)

    async def read_unknown_vnis(self) -> None:
        """The packet count of the drop of unknown VNIs; a warning (rate-limited) when it grew."""
        if self._vni_request is None or not self._channel.ready:
            return
        try:
            parts = await self._channel.multipart(self._vni_request())
            self.unknown_vnis.update(parse_flow_packets(parts))
        except (OpenFlowError, ChannelClosed, DecodeError, asyncio.TimeoutError) as exc:
            self.read_errors += 1
            self._errors.log(logging.WARNING, "unknown-vnis", "OVS flow statistics of the drop of unknown "
                             "VNIs not read: %s", str(exc) or type(exc).__name__)
            return
        n = self.unknown_vnis.totals.get(0, 0)
        now = self._mono()
        if n > self._vni_said[0] and now - self._vni_said[1] >= 60.0:  # at most a line a minute, saying the total
            log.warning("%d packets from the tunnel dropped before any rule since start: their Geneve VNI was neither "
                        "Pod traffic's (0) nor a trace mark this node knows (a node of a newer version, or something "
                        "else sending Geneve here)", n)
            self._vni_said = (n, now)

    def unknown_vni_drops(self) -> int | None:
        """Packets from the tunnel dropped because of their VNI; None: not counted (no Geneve) or not read yet."""
        if self._vni_request is None or not self.unknown_vnis.read:
            return None
        return self.unknown_vnis.totals.get(0, 0)

    def unknown_source_drops(self) -> int | None:
        """Packets from the tunnel dropped because no Pod this node knows holds their source address;
        None: not counted (deny_unknown_sources off, routed, one node) or not read yet."""
        if self._unknown_request is None or not self.unknown_sources.read:
            return None
        return self.unknown_sources.totals.get(0, 0)

    def rule_losses(self) -> dict[int, RuleLoss]:
        """Per rule id: the loss newly stated this window (after read_rule_flows and read_meters)."""
        if self._rule_seen is None or not self.rule_flows.read:
            return {}
        meters = None
        if self.rule_meters is not None and self.meters_read:
            own = self.own_meter_drops
            meters = {rule_id: own.get(meter, 0) for rule_id, meter in self.rule_meters.meter_of_rule().items()}
        return self.rule_ledger.tick(self.rule_flows.totals, self._rule_seen(), self._mono(), meters)

    def _read_counters(self) -> tuple[Mapping[str, int | None], Mapping[str, int | None] | None,
                                      Mapping[str, int] | Exception | None]:
        """The blocking reads of a window, in one thread hop (one wake-up of a worker and of the loop, not
        three): vswitchd's packet-in losses, the datapath's drops, the ports' drops (or why not read)."""
        ovs = self._ovs_losses()
        datapath = self._datapath_drops() if self._datapath_drops is not None else None
        ports: Mapping[str, int] | Exception | None = None
        if self._port_drops is not None:
            try:
                ports = self._port_drops()
            except (OSError, ValueError) as exc:
                ports = exc
        return ovs, datapath, ports

    async def read_counters(self) -> None:
        """vswitchd's packet-in losses, and the ports' and the datapath's drops (frames no rule saw); a port
        reading that fails is logged (rate-limited) and counted, the others still taken."""
        ovs, datapath, ports = await asyncio.get_running_loop().run_in_executor(self._reads, self._read_counters)
        self.ovs.update(ovs)
        if datapath is not None:
            self.datapath.update(datapath)
        if isinstance(ports, Exception):
            self.read_errors += 1
            self._errors.log(logging.WARNING, "port-drops", "frames lost on ports before ovs-vswitchd read them "
                             "not read: %s", str(ports) or type(ports).__name__)
        elif ports is not None:
            self.ports.update(ports)

    def counts(self) -> dict[LossKey, int]:
        """Every loss counted so far, cumulative, by kind."""
        counts = {LossKey(METER_CATEGORIES.get(meter_id, "policy"), METER, meter_name(meter_id)): d.packets
                  for meter_id, d in self.meters.totals().items()}
        counts.update({LossKey("all", OVS_QUEUE, name): n for name, n in self.ovs.totals.items()})
        for source, n in self.ports.totals.items():
            port, _, kind = source.rpartition(" ")
            counts[LossKey("all", PORT_REASONS[kind], port, FRAMES)] = n
        counts.update({LossKey("all", DATAPATH_DROP, name, FRAMES): n for name, n in self.datapath.totals.items()})
        if (unknown := self.unknown_source_drops()) is not None:
            counts[LossKey("all", UNKNOWN_SOURCE, self._unknown_via, FRAMES)] = unknown
        if (vnis := self.unknown_vni_drops()) is not None:
            counts[LossKey("all", UNKNOWN_VNI, "tunnel", FRAMES)] = vnis
        for category, outcomes in self._admission().items():
            for outcome, source in ADMISSION_SOURCES.items():
                counts[LossKey(category, ADMISSION, source)] = outcomes.get(outcome, 0)
        counts[LossKey("policy", WRITER_FULL, "audit_writer", RECORDS)] = self._writer_full()
        return counts

    async def baseline(self) -> None:
        """Read the logged rules' flows and the meters once, before this run installs any policy flow: the
        baseline of the per-rule loss. Every flow (and meter) this run makes then counts from its first packet,
        against packet-ins counted from the same moment; a baseline taken later, in the middle of a flood,
        would leave the flows' count and the packet-ins taken apart by the packet-ins read in between."""
        if self._rule_seen is not None and await self.read_rule_flows():
            await self.read_meters()
            self.rule_losses()

    async def tick(self) -> dict[str, Any] | None:
        """Read everything once; the loss record written for the window now ended, if any."""
        self._present = []
        flows_read = self._rule_seen is not None and await self.read_rule_flows()
        await self.read_meters()  # just after the flows: a rule's own meter drops as of the same moment
        rules = self.rule_losses() if flows_read else {}
        if self.rule_meters is not None:  # only from here: the task starts once the previous run's flows are gone
            await self.rule_meters.sweep(self._present)
        await self.read_counters()
        await self.read_unknown_sources()
        await self.read_unknown_vnis()
        if self.recorder is None:
            return None
        return self.recorder.tick(self.counts(), self._wall(), rules)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loss-accounting")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except Exception:  # a bug here must not end the accounting for the agent's lifetime
                self._errors.log(logging.ERROR, "tick", "loss accounting failed", exc_info=True)

    async def close(self, bound: float = LAST_WINDOW_BOUND) -> None:
        """Stop, after one last window up to now (while the channel is still up), given `bound` seconds."""
        if self._task is None:
            return
        await cancel_and_wait(self._task)
        self._task = None
        try:
            await within(self.tick(), bound)
        except TimeoutError:
            log.error("last loss accounting window not read within %.0f s: losses since the previous window "
                      "(at most %.0f s) are not stated in the audit trail", bound, self.interval)
        except Exception:
            log.error("last loss accounting window failed", exc_info=True)
        self._reads.shutdown(wait=False)
