"""Prometheus metrics for the agent, read from component counters at scrape time.

The hot path keeps plain integer counters (a prometheus Counter.inc per
packet-in would cost more than decoding it); this collector exports them.
The registry is passed in, never the process-wide default.
"""

from __future__ import annotations

import platform
from dataclasses import fields
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from auditlog import record_fast
from auditlog.compressor import gzip_codec
from auditlog.pipeline import PipelineStats
from auditlog.syslog.forwarder import ForwarderStats
from auditlog.verdicts import LATENCY_BUCKETS, LatencySnapshot
from auditlog.writer import WriterStats
from meters.stats import Dropped
from packetin.channel import OpenFlowChannel
from packetin.demux import Demux
from packetin import quiet
from packetin.model import Category
from packetin.reader import PRESSURE_BACKLOG, PRESSURE_MESSAGES
from policy_agent.ovs.supervisor import SupervisorStats

if TYPE_CHECKING:
    from policy_agent.http.endpoints import ListenerStats


def category_name(cat: int) -> str:
    """A packet-in category as metrics and `npaudit status` name it (policy, traceflow, or the number)."""
    try:
        return Category(cat).name.lower()
    except ValueError:
        return str(cat)


class AgentCollector:
    """Exports demux and channel statistics."""

    def __init__(self, demux: Demux, channel: OpenFlowChannel,
                 ovs_losses: Callable[[], dict[str, int | None]] | None = None) -> None:
        self._demux = demux
        self._channel = channel
        self._ovs_losses = ovs_losses

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "npaudit_packetin", "Packet-ins per category and outcome "
            "(received = delivered + dropped_* + handler_error + queued)",
            labels=["category", "outcome"])
        for cat, counts in sorted(self._demux.stats().items()):
            for outcome, n in counts.items():
                total.add_metric([category_name(cat), outcome], n)
        yield total
        unroutable = CounterMetricFamily(
            "npaudit_packetin_unroutable", "Packet-ins that reached no category, by reason",
            labels=["reason"])
        for reason, n in self._demux.unroutable.items():
            unroutable.add_metric([reason], n)
        yield unroutable
        depth = GaugeMetricFamily("npaudit_packetin_queue_depth", "Packet-ins waiting per category",
                                  labels=["category"])
        for cat, n in sorted(self._demux.queue_depths().items()):
            depth.add_metric([category_name(cat)], n)
        yield depth
        yield from _fair_share_metrics(self._demux)
        ch = self._channel
        yield GaugeMetricFamily("npaudit_openflow_connected", "1 while the OpenFlow channel is ready",
                                value=1 if ch.ready else 0)
        yield CounterMetricFamily("npaudit_openflow_connects", "Successful OpenFlow handshakes",
                                  value=ch.connects)
        yield CounterMetricFamily("npaudit_openflow_malformed", "OpenFlow messages that could not be decoded",
                                  value=ch.malformed)
        yield CounterMetricFamily("npaudit_openflow_reads", "Reads of the OpenFlow socket (agent wake-ups for it)",
                                  value=ch.reads)
        yield CounterMetricFamily("npaudit_openflow_reads_lone", "Reads that brought one packet-in, taken by the "
                                  "lone path: its record written before the read's bookkeeping", value=ch.lone_reads)
        yield CounterMetricFamily("npaudit_openflow_reads_quiet", "Of the lone reads, those the event loop's wait "
                                  "made after a quiet spell, their record written before any Python ran",
                                  value=ch.quiet_reads)
        yield CounterMetricFamily("npaudit_openflow_reads_paced", "Reads in a flood of packet-ins followed by a "
                                  "pause so that the next read takes many (openflow.read_pace_max)",
                                  value=ch.paced_reads)
        yield CounterMetricFamily("npaudit_openflow_reads_urgent", "Reads in a flood of packet-ins a pause would "
                                  "have followed, read on at once because a trace waited for its copies",
                                  value=ch.urgent_reads)
        yield CounterMetricFamily("npaudit_openflow_reads_pressed", "Full reads of the OpenFlow socket: "
                                  f"{PRESSURE_MESSAGES} messages or more, the TCP socket left at least "
                                  f"{PRESSURE_BACKLOG:.0%} full (input pressure: holds audit overload on)",
                                  value=ch.pressed_reads)
        yield CounterMetricFamily("npaudit_openflow_packetins_grouped", "Packet-ins read in audit overload and "
                                  "handed over in groups (one decoded per group)", value=ch.grouped)
        support = ch.meter_support
        yield GaugeMetricFamily(
            "npaudit_datapath_meters_supported",
            "1 if the datapath supports meters, 0 if not (packet-ins then rely on agent token buckets), "
            "-1 before the first connection", value=-1 if support is None else int(support.supported))
        if self._ovs_losses is not None:
            lost = CounterMetricFamily(
                "npaudit_ovs_packetin_lost",
                "Packet-ins ovs-vswitchd dropped before sending them (coverage counters; "
                "process-wide across its bridges and controllers)", labels=["counter"])
            for name, count in self._ovs_losses().items():
                if count is not None:
                    lost.add_metric([name], count)
            yield lost


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def build_versions() -> dict[str, str]:
    """What npaudit_build_info carries: the versions of npaudit, Python, and the os-ken and ovs libraries it runs
    on, whether its records are built in C or, slower, in pure Python (auditlog/record_fast.py), whether
    rotated audit files are gzipped with ISA-L or, slower, zlib (auditlog/compressor.py), and whether its event
    loop's wait writes a lone record after a quiet spell ("c") or not ("off": packetin/quiet.py)."""
    return {"version": _distribution_version("npaudit"), "python": platform.python_version(),
            "os_ken": _distribution_version("os-ken"), "ovs": _distribution_version("ovs"),
            "record_encoder": record_fast.mode(), "audit_gzip": gzip_codec()[0], "quiet_wait": quiet.QUIET}


class BuildInfoCollector:
    """npaudit_build_info: always 1, the versions in its labels (a join target for other series)."""

    def __init__(self, versions: dict[str, str]) -> None:
        self._versions = dict(versions)

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("npaudit_build_info", "Always 1; the labels say which npaudit, Python, os-ken "
                                 "and ovs (Python library) versions this agent runs, record_encoder whether "
                                 "its records are built in C or pure Python, audit_gzip whether rotated "
                                 "audit files are gzipped with isal or zlib, and quiet_wait whether a lone "
                                 "record is written from the event loop's wait (c, off)", labels=list(self._versions))
        info.add_metric(list(self._versions.values()), 1)
        yield info


def build_registry(demux: Demux, channel: OpenFlowChannel,
                   ovs_losses: Callable[[], dict[str, int | None]] | None = None) -> CollectorRegistry:
    """The agent's registry: its own collectors, build info and the standard process_* metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(demux, channel, ovs_losses))
    registry.register(BuildInfoCollector(build_versions()))
    ProcessCollector(registry=registry)  # CPU seconds, memory bytes, open fds, start time (Linux /proc)
    return registry


class PipelineStatsSource(Protocol):
    """The audit pipeline as this collector sees it (AuditPipeline)."""

    def snapshot(self) -> PipelineStats: ...


class WriterStatsSource(Protocol):
    """The audit writer as this collector sees it (AuditWriter)."""

    queue_size: int  # the queue's capacity: a full queue drops records

    def snapshot(self) -> WriterStats: ...


def _fair_share_metrics(demux: Demux) -> Iterator[Metric]:
    keys = GaugeMetricFamily("npaudit_packetin_fair_share_keys", "(rule, applied-to Pod) keys with a "
                             "fair-share bucket now", labels=["category"])
    evicted = CounterMetricFamily("npaudit_packetin_fair_share_keys_evicted", "Fair-share keys dropped "
                                  "from the LRU to stay within max_keys", labels=["category"])
    borrowed = CounterMetricFamily("npaudit_packetin_fair_share_borrowed", "Packet-ins admitted past their "
                                   "key's share, from the category's excess", labels=["category"])
    for cat, st in sorted(demux.fair_share_stats().items()):
        keys.add_metric([category_name(cat)], st.keys)
        evicted.add_metric([category_name(cat)], st.evicted)
        borrowed.add_metric([category_name(cat)], st.borrowed)
    yield from (keys, evicted, borrowed)


class AuditCollector:
    """Exports the audit pipeline's and writer's counters: nothing the audit trail loses is silent."""

    def __init__(self, pipeline: PipelineStatsSource, writer: WriterStatsSource) -> None:
        self._pipeline = pipeline
        self._writer = writer

    def collect(self) -> Iterator[Metric]:
        p = self._pipeline.snapshot()
        yield CounterMetricFamily("npaudit_audit_packet_ins", "Packet-ins the audit pipeline accounted for",
                                  value=p.packet_ins)
        yield CounterMetricFamily("npaudit_audit_packet_ins_truncated",
                                  "Audited packet-ins whose frame ended inside a header", value=p.decode_truncated)
        records = CounterMetricFamily("npaudit_audit_records", "Audit records by outcome at the writer's queue",
                                      labels=["outcome"])
        records.add_metric(["queued"], p.records)
        records.add_metric(["dropped_writer_full"], p.writer_full)
        yield records
        yield CounterMetricFamily("npaudit_audit_records_early", "Of the queued records, those of a lone packet-in "
                                  "made from its message's bytes before it was decoded", value=p.early)
        w = self._writer.snapshot()
        writer = CounterMetricFamily("npaudit_audit_writer", "Audit writer events (records written, dropped, "
                                     "rotations, compression, write errors)", labels=["event"])
        for event in fields(w.events):
            if event.name != "bytes":  # a size, not an event: summing the series would mix units
                writer.add_metric([event.name], getattr(w.events, event.name))
        yield writer
        yield CounterMetricFamily("npaudit_audit_writer_bytes", "Bytes of record lines written to the audit "
                                  "files (before compression)", value=w.events.bytes)
        yield GaugeMetricFamily("npaudit_audit_writer_queue_depth", "Records waiting for the writer thread",
                                value=w.queued)
        yield GaugeMetricFamily("npaudit_audit_writer_queue_capacity", "Records the writer's queue holds "
                                "(audit.queue_size); at depth = capacity new records are dropped",
                                value=self._writer.queue_size)
        yield GaugeMetricFamily("npaudit_audit_chain_seq", "npaudit.seq of the newest sealed record "
                                "(compare with the forwarded copy)", value=w.seq)
        a = p.aggregator
        yield GaugeMetricFamily("npaudit_audit_packets_held", "Packets in open aggregation windows, "
                                "not yet in a record", value=a.packets_held)
        yield GaugeMetricFamily("npaudit_audit_open_windows", "Open aggregation windows",
                                value=a.open_windows)
        yield CounterMetricFamily("npaudit_audit_windows_evicted", "Aggregation windows closed early "
                                  "because the key limit was reached", value=a.evicted_early)
        yield CounterMetricFamily("npaudit_audit_records_coarsened", "Audit records written with a coarser "
                                  "key in overload mode (of the queued ones)", value=p.coarsened)
        ov = p.overload
        yield GaugeMetricFamily("npaudit_audit_overload_level", "Detail of the audit records now: 0 full, "
                                "1 ports dropped, 2 peers dropped too", value=ov.level if ov else 0)
        yield CounterMetricFamily("npaudit_audit_overload_seconds", "Time the audit pipeline spent in "
                                  "overload mode (coarsened)", value=ov.seconds if ov else 0)
        yield CounterMetricFamily("npaudit_audit_overload_entered", "Times the audit pipeline left full detail",
                                  value=ov.entered if ov else 0)
        yield CounterMetricFamily("npaudit_audit_overload_entered_pressed", "Of those, times input pressure "
                                  "(full OpenFlow reads) left it while both queues were below high_mark",
                                  value=ov.entered_pressed if ov else 0)


class VerdictSource(Protocol):
    """Written records by verdict and their latency as this collector sees them (auditlog.verdicts.VerdictTally)."""

    def verdicts(self) -> dict[tuple[str, str, str], int]: ...
    def latency(self) -> LatencySnapshot: ...


class VerdictCollector:
    """npaudit_policy_verdicts_total and npaudit_audit_record_latency_seconds, of records in the audit file."""

    def __init__(self, source: VerdictSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        verdicts = CounterMetricFamily(
            "npaudit_policy_verdicts", "Policy audit records written to the audit file, by npaudit.disposition "
            "(Allow, Drop, Reject, Pass), network.direction and tier (rule.category); \"\" where the record has "
            "none. A record stands for one flow's packets (npaudit.aggregate.packets), as `npaudit stats` counts",
            labels=["disposition", "direction", "tier"])
        for (disposition, direction, tier), n in sorted(self._source.verdicts().items()):
            verdicts.add_metric([disposition, direction, tier], n)
        yield verdicts
        lat = self._source.latency()
        bounds = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
        yield HistogramMetricFamily(
            "npaudit_audit_record_latency_seconds", "From the packet-in's arrival at the agent to its record "
            "being in the audit file, for records written at once (a flow's first packet, an Allow); records "
            "that waited for an aggregation window are not observed",
            buckets=list(zip(bounds, lat.buckets)), sum_value=lat.sum)


class SyslogStatsSource(Protocol):
    """One syslog forwarder as this collector sees it (auditlog.syslog Forwarder or ProcessForwarder)."""

    def stats(self) -> ForwarderStats: ...


class SyslogCollector:
    """Exports each syslog destination's counters, connection state and position."""

    def __init__(self, forwarders: Sequence[SyslogStatsSource]) -> None:
        self._forwarders = forwarders

    def collect(self) -> Iterator[Metric]:
        records = CounterMetricFamily("npaudit_syslog_records", "Audit records per syslog destination and "
                                      "outcome (truncated: sent with a stub MSG, also counted as sent; skipped: "
                                      "not a sealed record or not encodable)", labels=["destination", "outcome"])
        lost = CounterMetricFamily("npaudit_syslog_records_lost", "Audit records removed by retention before "
                                   "they were forwarded", labels=["destination"])
        errors = CounterMetricFamily("npaudit_syslog_errors", "Failed connects and sends (each retried with "
                                     "backoff; TLS verification failures included)", labels=["destination"])
        connected = GaugeMetricFamily("npaudit_syslog_connected", "1 while connected to the destination",
                                      labels=["destination"])
        last_seq = GaugeMetricFamily("npaudit_syslog_last_seq_sent", "npaudit.seq of the newest record "
                                     "delivered (compare with npaudit_audit_chain_seq)", labels=["destination"])
        backlog = GaugeMetricFamily("npaudit_syslog_backlog_bytes", "Bytes of audit files not yet read "
                                    "(gzip files as stored)", labels=["destination"])
        restarts = CounterMetricFamily("npaudit_syslog_forwarder_restarts", "Forwarder child processes that died "
                                       "and were started again (each resends from its checkpoint)",
                                       labels=["destination"])
        waits = CounterMetricFamily("npaudit_syslog_receiver_wait_seconds", "Seconds the forwarder had a full send "
                                    "window and waited for the receiver's acknowledgements (growing as fast as "
                                    "time passes: the receiver sets the pace, not the forwarder)",
                                    labels=["destination"])
        for fwd in self._forwarders:
            st = fwd.stats()
            dest = [st.destination]
            for outcome in ("sent", "truncated", "skipped"):
                records.add_metric([*dest, outcome], getattr(st, outcome))
            lost.add_metric(dest, st.lost)
            restarts.add_metric(dest, st.restarts)
            waits.add_metric(dest, st.receiver_wait_s)
            errors.add_metric(dest, st.errors)
            connected.add_metric(dest, int(st.connected))
            if st.last_seq_sent is not None:
                last_seq.add_metric(dest, st.last_seq_sent)
            if st.backlog_bytes is not None:
                backlog.add_metric(dest, st.backlog_bytes)
        yield from (records, lost, errors, connected, last_seq, backlog, restarts, waits)


class OvsSupervisorSource(Protocol):
    """The OVS supervisor as this collector sees it (policy_agent.ovs.supervisor.OvsSupervisor)."""

    def snapshot(self) -> SupervisorStats: ...


class OvsSupervisorCollector:
    """Exports whether each OVS daemon runs and how often the supervisor restarted it."""

    def __init__(self, supervisor: OvsSupervisorSource) -> None:
        self._supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        s = self._supervisor.snapshot()
        up = GaugeMetricFamily("npaudit_ovs_up", "1 while the OVS daemon's pid file names a running "
                               "process, as of the supervisor's last look", labels=["daemon"])
        restarts = CounterMetricFamily("npaudit_ovs_restarts", "Restarts of an embedded OVS daemon by the "
                                       "agent (failed attempts included)", labels=["daemon"])
        for daemon in sorted(s.up):
            up.add_metric([daemon], int(s.up[daemon]))
            restarts.add_metric([daemon], s.restarts.get(daemon, 0))
        failed = CounterMetricFamily("npaudit_ovs_checks_failed", "Looks at an OVS daemon that could not be made "
                                     "(pid file or /proc unreadable, e.g. no descriptors left): nothing restarted",
                                     labels=["daemon"])
        for daemon, n in sorted(s.checks_failed.items()):
            failed.add_metric([daemon], n)
        yield up
        yield restarts
        yield failed
        yield GaugeMetricFamily("npaudit_ovs_restarts_capped", "1 while restarts of a dead OVS daemon are "
                                "held back by the per-window cap (OVS crash-looping)", value=int(s.capped))


class MeterDropsSource(Protocol):
    """Meter drops as this collector sees them (policy_agent.limits.losses.LossAccounting)."""

    def dropped(self) -> dict[str, Dropped] | None: ...


class MeterCollector:
    """Exports what each OVS meter's band dropped (read over OpenFlow), across OVS restarts."""

    def __init__(self, source: MeterDropsSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        packets = CounterMetricFamily("npaudit_meter_dropped_packets", "Packet-ins an OVS meter dropped "
                                      "(never sent to the agent), per meter", labels=["meter"])
        size = CounterMetricFamily("npaudit_meter_dropped_bytes", "Bytes of the packets an OVS meter dropped, "
                                   "per meter", labels=["meter"])
        for meter, d in sorted((self._source.dropped() or {}).items()):
            packets.add_metric([meter], d.packets)
            size.add_metric([meter], d.bytes)
        yield packets
        yield size


class HttpListenerSource(Protocol):
    """The metrics/probe listener as this collector sees it (policy_agent.http.endpoints.HttpListener)."""

    def snapshot(self) -> ListenerStats: ...


class HttpListenerCollector:
    """Exports the listener's connections, its cap and what it closed or could not accept."""

    def __init__(self, listener: HttpListenerSource) -> None:
        self._listener = listener

    def collect(self) -> Iterator[Metric]:
        s = self._listener.snapshot()
        yield GaugeMetricFamily("npaudit_http_connections", "Connections the metrics/probe listener holds now",
                                value=s.open)
        yield GaugeMetricFamily("npaudit_http_connections_max", "Connections the listener holds at most "
                                "(metrics.max_connections, less when RLIMIT_NOFILE less metrics.fd_reserve is lower)",
                                value=s.cap)
        closed = CounterMetricFamily("npaudit_http_connections_closed", "Connections the listener closed before "
                                     "answering, by reason (evicted: least recently active, to make room at the cap)",
                                     labels=["reason"])
        for reason, n in s.closed.items():
            closed.add_metric([reason], n)
        yield closed
        errors = CounterMetricFamily("npaudit_http_accept_errors", "accept() failures of the listener, by errno "
                                     "(each pauses accepting)", labels=["error"])
        for name, n in sorted(s.accept_errors.items()):
            errors.add_metric([name], n)
        yield errors
