"""The eBPF drop offload in the agent (DESIGN.md §4, tier 3): load it, attach it to Pod veths, cache
judged Drop floods, flush before policy changes, and fold what it dropped into the audit records.

Which verdicts may be cached is decided once, by the compiler (`rule_flags`: a logged Drop carries
Flags.OFFLOAD_ELIGIBLE); this module checks that flag and the Drop disposition, nothing else.
Every map operation and fold runs under one asyncio lock (`_ops`), so counts are folded once:
the periodic read, a flush before a change and a Pod's detach never interleave, and an insertion
that would meet one of them is skipped (the flood's next packet-in tries again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Callable, Iterator, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from auditlog.aggregate import AggregateKey
from auditlog.packet import PacketSummary, decode_frame
from auditlog.pipeline import aggregate_key
from meters.ebpf.loader import DEFAULT_SOURCE, XdpOffload
from meters.ebpf.maps import ICMP_PROTOCOLS, PORT_PROTOCOLS, OffloadCounts, OffloadKey, icmp_port, rule_until
from meters.errors import MeterError, OffloadUnavailable
from packetin.groups import PacketInGroup
from packetin.model import Disposition, Flags, PacketIn
from packetin.ratelimited_log import RateLimitedLog
from packetin.registers import DISPOSITION_BITS
from packetin.tasks import cancel_and_wait
from policy_agent.cni.state import PodInterfaceInfo
from policy_agent.config.offload import OffloadConfig

log = logging.getLogger(__name__)

_ELIGIBLE = int(Flags.OFFLOAD_ELIGIBLE)
_DROP = int(Disposition.DROP)
Sample = tuple[PacketIn, PacketSummary]
Flow = tuple[int | None, AggregateKey]  # (OVS in_port, aggregation key): what the detector counts
Loader = Callable[[OffloadConfig], XdpOffload]


class OffloadSink(Protocol):
    """Where offloaded counts go (the AuditPipeline): folded into the key's aggregate record."""

    def add_offloaded(self, key: AggregateKey, packets: int, bytes_: int, sample: Sample) -> None: ...

    def decoded(self, pin: PacketIn) -> PacketSummary: ...


class PodHooks(Protocol):
    async def pod_added(self, info: PodInterfaceInfo) -> None: ...

    async def pod_deleted(self, info: PodInterfaceInfo) -> None: ...


def load_program(config: OffloadConfig) -> XdpOffload:
    """Compile and load the XDP program as configured (blocking: seconds); OffloadUnavailable if it cannot run."""
    source = Path(config.source) if config.source else DEFAULT_SOURCE
    return XdpOffload.compile(source=source, max_entries=config.max_entries, mode=config.mode)


@dataclass(frozen=True)
class OffloadStats:
    """A snapshot for metrics and `npaudit status`."""

    active: bool
    state: str
    attached: int
    entries: int
    inserted: int
    refreshed: int
    flushes: int
    offloaded_packets: int
    offloaded_bytes: int
    errors: int


@dataclass
class _Entry:
    """The agent's mirror of one map entry: which record its drops belong to, and what is folded already."""

    flow: Flow
    sample: Sample
    expires_ns: int
    folded: OffloadCounts


class FloodDetector:
    """Counts logged Drop packet-ins per flow in one-second windows; says when one reaches the threshold.
    Memory is bounded: at most `max_keys` flows per window (more are not counted that second)."""

    def __init__(self, threshold_pps: int, max_keys: int) -> None:
        self._threshold = threshold_pps
        self._max_keys = max_keys
        self._second = -math.inf
        self._counts: dict[Flow, int] = {}

    def over(self, flow: Flow, now: float) -> bool:
        second = math.floor(now)
        if second != self._second:
            self._second = second
            self._counts.clear()
        n = self._counts.get(flow, 0) + 1
        if n == 1 and len(self._counts) >= self._max_keys:
            return False
        self._counts[flow] = n
        return n >= self._threshold


def offload_port(summary: PacketSummary) -> int | None:
    """The key's port field for this packet (meters/ebpf/maps.py), None when the program cannot key it."""
    if summary.protocol in PORT_PROTOCOLS:
        return summary.dst_port
    if summary.protocol in ICMP_PROTOCOLS and summary.icmp_type is not None:
        return icmp_port(summary.icmp_type, summary.icmp_code or 0)
    return None


class DropOffload:
    """Tier 3 in the agent. `load()` (blocking) decides whether it runs; everything else is a no-op
    when it does not. `busy()` says whether a policy change is under way (the engine's lock):
    no verdict judged before a change ends may be cached after it."""

    def __init__(self, config: OffloadConfig, sink: OffloadSink | None, *, ovs_netns: str,
                 busy: Callable[[], bool] = lambda: False, loader: Loader = load_program,
                 mono_ns: Callable[[], int] = time.monotonic_ns, wall: Callable[[], float] = time.time) -> None:
        self._config = config
        self._sink = sink
        self._netns = ovs_netns or None
        self._busy = busy
        self._loader = loader
        self._mono_ns = mono_ns
        self._wall = wall
        self._xdp: XdpOffload | None = None
        self._reason = "disabled in the config (offload.enabled: false)"
        self._ifindex: dict[int, int] = {}  # OVS ofport -> the veth's ifindex (its netns)
        self._entries: dict[OffloadKey, _Entry] = {}
        self._by_flow: dict[Flow, OffloadKey] = {}
        self._detector = FloodDetector(config.threshold_pps, 4 * config.max_entries)
        self._ops = asyncio.Lock()
        self._frozen = False
        self._thawed_at = -math.inf
        self._task: asyncio.Task[None] | None = None
        self._errors = RateLimitedLog(log, 10.0)
        self.counts = {"inserted": 0, "refreshed": 0, "flushes": 0, "offloaded_packets": 0,
                       "offloaded_bytes": 0, "errors": 0, "full": 0}

    # --- lifecycle --------------------------------------------------------------------

    def load(self) -> None:
        """Compile and load the program when the config enables it; on failure say so once, loudly."""
        if not self._config.enabled:
            return
        try:
            self._xdp = self._loader(self._config)
        except OffloadUnavailable as exc:
            self._reason = f"unavailable: {exc}"
            log.warning("eBPF drop offload unavailable, running on OVS meters and token buckets only "
                        "(npaudit_ebpf_offload_active=0): %s", exc)
            return
        log.info("eBPF drop offload loaded (XDP, %s mode): logged Drop floods above %d pps are dropped "
                 "before OVS", self._config.mode, self._config.threshold_pps)

    @property
    def active(self) -> bool:
        return self._xdp is not None

    def start(self) -> None:
        if self._xdp is not None:
            self._task = asyncio.get_running_loop().create_task(self._reader(), name="ebpf-offload-reader")

    async def close(self) -> None:
        """Fold every entry's final counts (call before the audit pipeline closes) and detach everywhere."""
        await cancel_and_wait(self._task)
        self._task = None
        xdp = self._xdp
        if xdp is None:
            return
        await self._flush(None)
        self._xdp = None
        self._reason = "stopped"
        await asyncio.to_thread(xdp.close)
        self._ifindex.clear()

    # --- Pods (CNI ADD and DEL) -------------------------------------------------------

    async def attach(self, info: PodInterfaceInfo) -> None:
        """Attach to the Pod's host-side veth. A failure is logged and counted: the Pod still gets its
        network, its floods just reach OVS."""
        xdp = self._xdp
        if xdp is None:
            return
        try:
            ifindex = await asyncio.to_thread(xdp.attach, info.host_ifname, self._netns)
        except MeterError as exc:
            self.counts["errors"] += 1
            log.warning("eBPF drop offload: Pod %s/%s not covered: %s", info.namespace, info.name, exc)
            return
        self._ifindex[info.ofport] = ifindex

    async def detach(self, info: PodInterfaceInfo) -> None:
        """Detach from the Pod's veth; its entries go (their final counts folded) before it does."""
        xdp = self._xdp
        ifindex = self._ifindex.pop(info.ofport, None)
        if xdp is None or ifindex is None:
            return
        await self._flush(lambda key: key.ifindex == ifindex)
        try:
            await asyncio.to_thread(xdp.detach, info.host_ifname, self._netns)
        except MeterError as exc:
            self.counts["errors"] += 1
            log.warning("eBPF drop offload: %s", exc)

    # --- the policy engine's hook -----------------------------------------------------

    async def invalidate(self) -> None:
        """Before new flows go in: every cached verdict goes (all of them: simplest, and a change
        is rare next to a flood), and none judged before the change ends is cached again."""
        self._frozen = True
        if self._xdp is not None:
            await self._flush(None)

    # --- packet-ins (after the audit pipeline, on the event loop) ----------------------

    def handle_group(self, group: PacketInGroup) -> None:
        """Packet-ins grouped in overload (packetin/groups.py): nothing to do unless XDP runs,
        then one by one (the detector counts each flow's rate)."""
        if self._xdp is None:
            return
        for pin in group.packet_ins():
            self(pin)

    def __call__(self, pin: PacketIn) -> None:
        flags = pin.flags
        if self._xdp is None or flags is None or not flags & _ELIGIBLE or pin.reg7 & DISPOSITION_BITS != _DROP:
            return
        if self._frozen:
            if self._busy():
                return
            self._frozen = False
            self._thawed_at = self._wall()  # packet-ins read before now may come from the old flows
        if pin.received_at < self._thawed_at:
            return
        ifindex = self._ifindex.get(pin.in_port) if pin.in_port is not None else None
        if ifindex is None:
            return  # not from a Pod veth we cover
        # The pipeline took this packet-in just before us: its decoding, not a second one.
        summary = self._sink.decoded(pin) if self._sink is not None else decode_frame(pin.packet)
        flow = (pin.in_port, aggregate_key(pin, summary))
        key = self._by_flow.get(flow)
        if key is None:  # a cached flow's samples refresh it whatever their rate
            if not self._detector.over(flow, pin.received_at):
                return
            port = offload_port(summary)
            if port is None or summary.fragment or summary.src_ip is None or summary.dst_ip is None:
                return
            key = OffloadKey(ifindex, ip_address(summary.src_ip), ip_address(summary.dst_ip),
                             summary.protocol or 0, port)
        self._insert(key, flow, (pin, summary), pin.rule_id)

    def _insert(self, key: OffloadKey, flow: Flow, sample: Sample, rule_id: int) -> None:
        xdp, cfg = self._xdp, self._config
        if xdp is None or self._ops.locked():
            return  # a read or flush is under way: the flood's next packet-in tries again
        now_ns = self._mono_ns()
        ttl_ns = int(cfg.ttl_s * 1e9)
        entry = self._entries.get(key)
        if entry is not None and entry.expires_ns - now_ns > ttl_ns // 2:
            return  # fresh enough: a refresh per sample would cost a syscall each
        if entry is None and len(self._entries) >= cfg.max_entries:
            self.counts["full"] += 1
            return
        rule = rule_until(rule_id, cfg.rate_pps, cfg.burst, now_ns, ttl_ns)
        try:
            xdp.put(key, rule)
        except MeterError as exc:
            self.counts["errors"] += 1
            self._errors.log(logging.WARNING, "put", "eBPF drop offload: %s", exc)
            return
        if entry is None:
            self._entries[key] = _Entry(flow, sample, rule.expires_ns, OffloadCounts())
            self._by_flow[flow] = key
            self.counts["inserted"] += 1
        else:
            entry.expires_ns = rule.expires_ns
            self.counts["refreshed"] += 1

    # --- counts -----------------------------------------------------------------------

    async def _reader(self) -> None:
        while True:
            await asyncio.sleep(self._config.read_interval)
            try:
                await self.read()
            except Exception:  # keep reading whatever one round met
                self.counts["errors"] += 1
                log.exception("eBPF drop offload: reading the counters failed")

    async def read(self) -> None:
        """Fold what the program dropped since the last read; remove expired entries (final counts)."""
        xdp = self._xdp
        if xdp is None:
            return
        async with self._ops:
            now_ns = self._mono_ns()
            counters, removed = await asyncio.to_thread(lambda: (xdp.counters(), xdp.sweep(now_ns)))
            for key, counts in counters.items():
                if key not in removed:
                    self._fold(key, counts)
            for key, counts in removed.items():
                self._fold(key, counts)
                self._forget(key)

    async def _flush(self, match: Callable[[OffloadKey], bool] | None) -> None:
        xdp = self._xdp
        if xdp is None:
            return
        async with self._ops:
            chosen = None if match is None else (lambda key, _rule: match(key))
            removed = await asyncio.to_thread(xdp.flush, chosen)
            self.counts["flushes"] += 1
            for key, counts in removed.items():
                self._fold(key, counts)
            for key in [k for k in self._entries if match is None or match(k)]:
                self._forget(key)

    def _forget(self, key: OffloadKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._by_flow.pop(entry.flow, None)

    def _fold(self, key: OffloadKey, counts: OffloadCounts) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return  # not ours (another agent's leftovers are flushed with ours)
        packets = counts.dropped_packets - entry.folded.dropped_packets
        bytes_ = counts.dropped_bytes - entry.folded.dropped_bytes
        entry.folded = counts
        if packets <= 0:
            return
        self.counts["offloaded_packets"] += packets
        self.counts["offloaded_bytes"] += bytes_
        if self._sink is not None:
            self._sink.add_offloaded(entry.flow[1], packets, bytes_, entry.sample)

    # --- reporting --------------------------------------------------------------------

    def stats(self) -> OffloadStats:
        c = self.counts
        return OffloadStats(active=self.active, state=self.state, attached=len(self._ifindex),
                            entries=len(self._entries), inserted=c["inserted"], refreshed=c["refreshed"],
                            flushes=c["flushes"], offloaded_packets=c["offloaded_packets"],
                            offloaded_bytes=c["offloaded_bytes"], errors=c["errors"])

    def status(self) -> dict[str, object]:
        """For `npaudit status`: the state line and the counts."""
        return dataclasses.asdict(self.stats())

    @property
    def state(self) -> str:
        if self._xdp is None:
            return self._reason
        return (f"active: XDP on {len(self._ifindex)} Pod veth(s), {len(self._entries)} cached Drop flow(s), "
                f"{self.counts['offloaded_packets']} packets dropped before OVS (threshold "
                f"{self._config.threshold_pps} pps)")


class OffloadPodHooks:
    """The CNI server's hooks with the offload around the engine's: attach once the Pod's policy
    and forwarding flows are in, detach before they go."""

    def __init__(self, hooks: PodHooks, offload: DropOffload) -> None:
        self._hooks = hooks
        self._offload = offload

    async def pod_added(self, info: PodInterfaceInfo) -> None:
        await self._hooks.pod_added(info)
        await self._offload.attach(info)

    async def pod_deleted(self, info: PodInterfaceInfo) -> None:
        await self._offload.detach(info)
        await self._hooks.pod_deleted(info)


class OffloadCollector:
    """Exports the offload's state and counts (registered whether or not it runs: 0 says it does not)."""

    def __init__(self, offload: DropOffload) -> None:
        self._offload = offload

    def collect(self) -> Iterator[Metric]:
        s = self._offload.stats()
        yield GaugeMetricFamily("npaudit_ebpf_offload_active", "1 while the XDP drop offload is loaded; 0 when "
                                "it is disabled or cannot run here (then only meters and token buckets limit)",
                                value=int(s.active))
        yield CounterMetricFamily("npaudit_ebpf_offloaded_packets", "Packets of cached Drop flows the XDP "
                                  "program dropped before OVS, folded into audit records", value=s.offloaded_packets)
        yield CounterMetricFamily("npaudit_ebpf_offloaded_bytes", "Bytes (whole frames) of those packets",
                                  value=s.offloaded_bytes)
        yield GaugeMetricFamily("npaudit_ebpf_offload_entries", "Drop flows cached in the XDP map", value=s.entries)
        yield GaugeMetricFamily("npaudit_ebpf_offload_attached", "Pod veths the XDP program is attached to",
                                value=s.attached)
        events = CounterMetricFamily("npaudit_ebpf_offload_events", "Offload map events (inserted, refreshed, "
                                     "flushes, errors, full: an insertion refused for max_entries)",
                                     labels=["event"])
        for event in ("inserted", "refreshed", "flushes", "errors", "full"):
            events.add_metric([event], self._offload.counts[event])
        yield events
