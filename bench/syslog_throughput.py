#!/usr/bin/env python3
"""Does the syslog forwarder keep up with the writer's distinct-flow rate? Measured as the agent runs. Prints JSON.

Records: distinct-flow records made by the real audit pipeline (auditlog_throughput:
decode, aggregate, ECS record, seal; every record a new key). rsyslogd, where it
receives, is a private one on loopback running config/syslog/rsyslog-receiver.conf
as shipped (tests.support.rsyslog.Receiver swaps only its paths and ports), TLS
with the ossl driver.

- sustained (the target), per transport: the real pipeline writes distinct-flow
  records at its full rate for --seconds while the forwarder runs as the agent
  runs it by default, in a child process of its own (auditlog/syslog/process.py,
  its own GIL), and sends to a receiver that only reads (TLS: decrypts) in a
  process of its own: a SIEM off the node, as far as this node's CPU goes. The
  forwarder's own keeping up. Reported: records/s written (on disk) and
  delivered (acknowledged by the receiver's TCP), the backlog (written, not yet
  delivered) sampled every SAMPLE_EVERY s, the seconds to drain once the
  writer stopped, CPU per 100k records of each thread, process and receiver,
  the CPU cores all of them kept busy, and the share of the time the forwarder
  waited for the receiver's ACKs with a full window (ForwarderStats.
  receiver_wait_s: near 1, the receiver set the pace). The rule is in
  summary.keeps_up_rule; summary.keeps_up says per transport whether it held.
- sustained_in_process, the baseline of the same run: the forwarder as a thread
  of the pipeline's process instead (syslog.process: false; one GIL for the
  pipeline, the writer thread, the forwarder thread and the writer's
  compressor), to the same kind of receiver.
- sustained_rsyslog_on_node: the child forwarder again, to a private rsyslogd on
  the same 2 cores running config/syslog/rsyslog-receiver.conf as shipped (each
  record parsed with mmjsonparse and written twice). rsyslogd needs about 2 s
  of CPU per 100k records, more than the pipeline: this phase measures the
  node's capacity more than the forwarder's (cpu_cores_busy near cpus,
  receiver_wait_share, rsyslog_records_per_s_written_out: an ACK means "in
  rsyslog's queue", its verbatim file's size over the mean line is what it
  wrote out by the end of the span).
- sealing ceiling (not the target): records/s the AuditWriter seals and writes
  when fed pre-built records as fast as it takes them, beside the whole
  pipeline's rate alone (pipeline_alone): the writer never reaches the former
  under a real flood, since the pipeline makes the records.
- drain: the forwarder alone sends a ready file set (rotated, gzipped files
  included) from an empty checkpoint: its records/s and CPU, rsyslogd's CPU.
- capacity: the same drain to a receiver that only reads the bytes (TLS:
  decrypts them) in a process of its own: the forwarder's own ceiling.
  capacity_one_file: the same records in one plain file, what a forwarder that
  keeps up reads (the live file: no gzip), so its CPU per 100k records is the
  forwarder's per-record cost in its steady state (--only capacity: these alone).
Run as root or not; needs rsyslogd and rsyslog-openssl (`make bench` runs it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from auditlog_throughput import bench_context, distinct_packet_ins, pipeline_capacity  # noqa: E402

from auditlog.record_fast import aggregator  # noqa: E402
from auditlog.chain import RecordText  # noqa: E402
from auditlog.fileset import audit_files, iter_lines  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from auditlog.syslog.destination import Destination, make_destination  # noqa: E402
from auditlog.syslog.forwarder import Forwarder  # noqa: E402
from auditlog.syslog.process import ProcessForwarder  # noqa: E402
from auditlog.syslog.transport import TlsOptions  # noqa: E402
from auditlog.writer import AuditWriter  # noqa: E402
from packetin.gctune import settle_heap  # noqa: E402
from tests.support.certs import Pki, make_pki  # noqa: E402
from tests.support.rsyslog import Receiver  # noqa: E402

FILE_BYTES = 16 << 20  # drains: rotate every 16 MiB, so the drain reads gzipped files too
KEEP_UP_RATIO = 0.95
SAMPLE_EVERY = 0.25  # seconds between backlog samples in the sustained phase
MAX_LAG = 1.0  # seconds of writing the backlog may reach in the steady part
KEEPS_UP_RULE = (f"keeps_up: over the steady part of the feed (its last three quarters: the first is the start-up; "
                 "it ends when the pipeline stops being fed, before the writer's last flush, a burst no steady "
                 "state has), records/s delivered >= {KEEP_UP_RATIO} x records/s written, both the least-squares "
                 "slope of the records written (delivered) over the samples taken every "
                 f"{SAMPLE_EVERY} s, not the difference of two samples (the writer writes in batches of thousands "
                 "of records, so one sample can fall just before or after one); and the backlog (written, not "
                 f"delivered) never exceeds {MAX_LAG:g} s of writing in that part (records/s written x {MAX_LAG:g})")


def load_records(live: Path) -> list[RecordText]:
    """The records of a file set, open again for sealing (their seq and chain are ignored)."""
    out = []
    for _, path in audit_files(live):
        for _, _, raw in iter_lines(path):
            out.append(RecordText.of(json.loads(raw)))
    return out


def write_all(live: Path, records: list[RecordText], max_bytes: int = FILE_BYTES) -> dict[str, Any]:
    """Seal and write `records` as fast as the writer takes them; its records/s from first submit to on disk."""
    with AuditWriter(live, max_bytes=max_bytes, backup_count=1000, max_age_days=0,
                     queue_size=len(records) + 1) as writer:
        t0 = time.perf_counter()
        for record in records:
            if not writer.submit(record):
                raise RuntimeError("writer refused a record")
        if not writer.flush_wait(600):
            raise RuntimeError("writer did not finish")
        seconds = time.perf_counter() - t0
        writer.wait_compressed(600)
    return {"records": len(records), "seconds": round(seconds, 3), "records_per_s": round(len(records) / seconds),
            "files": len(audit_files(live))}


def forwarder(scheme: str, url: str, pki: Pki, live: Path, checkpoint: Path) -> Forwarder:
    """A forwarder as the agent builds it with syslog.process: false (default batch, window and checkpoint
    settings)."""
    return Forwarder(destination(scheme, url, pki), live=live, checkpoint=checkpoint)


def destination(scheme: str, url: str, pki: Pki) -> Destination:
    return make_destination(url, node_name="bench", tls=TlsOptions(ca=pki.ca) if scheme == "tls" else None)


def wait_sent(fwd: Forwarder | ProcessForwarder, last_seq: int, timeout: float) -> float:
    """perf_counter time at which `fwd` has delivered `last_seq` (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while (fwd.stats().last_seq_sent or 0) < last_seq:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{fwd.destination.name}: {fwd.stats()} after {timeout:.0f} s")
        time.sleep(0.005)
    return time.perf_counter()


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` so far (its threads included), or of its thread `tid`."""
    stat = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _discard(listener: socket.socket, pki: Pki | None) -> None:
    """Accept connections one after the other and read (TLS: decrypt) everything sent, keeping nothing."""
    ctx = None
    if pki is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(pki.cert), str(pki.key))
    buf = bytearray(1 << 20)
    while True:
        conn, _ = listener.accept()
        try:
            if ctx is not None:
                conn = ctx.wrap_socket(conn, server_side=True)
            while conn.recv_into(buf):
                pass
        except OSError:
            pass
        conn.close()


class Sink:
    """A receiver that only reads (TLS: decrypts) what it is sent, in a process of its own (stopped by pid)."""

    def __init__(self, scheme: str, pki: Pki) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.proc = multiprocessing.get_context("fork").Process(
            target=_discard, args=(self.listener, pki if scheme == "tls" else None), daemon=True)
        self.proc.start()

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}"

    def stop(self) -> None:
        self.listener.close()
        if self.proc.pid is not None and self.proc.exitcode is None:
            os.kill(self.proc.pid, 9)
        self.proc.join(5)


def capacity(scheme: str, pki: Pki, live: Path, count: int, work: Path) -> dict[str, Any]:
    """Records/s the forwarder delivers to a receiver that only reads (a process of its own, stopped by pid)."""
    sink = Sink(scheme, pki)
    try:
        fwd = forwarder(scheme, sink.url(scheme), pki, live, work / f"ck-capacity-{scheme}.json")
        c0, t0 = time.process_time(), time.perf_counter()
        fwd.start()
        done = wait_sent(fwd, count, 600)
        cpu = time.process_time() - c0
        fwd.stop()
        return {"records_per_s": round(count / (done - t0)), "seconds": round(done - t0, 3),
                "forwarder_cpu_s_per_100k": round(cpu * 1e5 / count, 3), "errors": fwd.stats().errors}
    finally:
        sink.stop()


def received(rx: Receiver, count: int) -> int:
    """Records rsyslog wrote out (parsed, audit.json), once it has written `count` or made no progress for 10 s.

    A TCP ACK means "in rsyslog's socket buffer", not "processed": stopped right
    after the last ACK, rsyslog may drop what its queue still holds at shutdown.
    """
    seen, progress_at = -1, time.monotonic()
    while time.monotonic() - progress_at < 10:
        now_seen = rx.count("audit.json")
        if now_seen >= count:
            break
        if now_seen != seen:
            seen, progress_at = now_seen, time.monotonic()
        time.sleep(0.05)
    rx.daemon.stop()  # flushes its output
    return rx.count("audit.json")


def drain(scheme: str, pki: Pki, live: Path, count: int, work: Path) -> dict[str, Any]:
    rx = Receiver(work / f"rsyslog-drain-{scheme}", pki)
    rx.daemon.start()
    try:
        fwd = forwarder(scheme, rx.url(scheme), pki, live, work / f"ck-drain-{scheme}.json")
        assert rx.daemon.proc is not None
        r0, c0, t0 = cpu_seconds(rx.daemon.proc.pid), time.process_time(), time.perf_counter()
        fwd.start()
        done = wait_sent(fwd, count, 600)
        cpu = {"forwarder": round(time.process_time() - c0, 3),
               "rsyslog": round(cpu_seconds(rx.daemon.proc.pid) - r0, 3)}
        fwd.stop()
        stats = fwd.stats()
        return {"records_per_s": round(count / (done - t0)), "seconds": round(done - t0, 3), "cpu_s": cpu,
                "delivered_rsyslog_count": received(rx, count), "errors": stats.errors, "lost": stats.lost}
    finally:
        rx.daemon.stop()


class Sampler(threading.Thread):
    """(seconds since t0, records written, records delivered, seconds the forwarder waited for the receiver)
    every SAMPLE_EVERY seconds until stopped."""

    def __init__(self, writer: AuditWriter, fwd: Forwarder | ProcessForwarder, t0: float) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.writer, self.fwd, self.t0 = writer, fwd, t0
        self.samples: list[tuple[float, int, int, float]] = []
        self.done = threading.Event()
        self.lock = threading.Lock()  # `take` runs in this thread and in the bench's

    def take(self) -> tuple[float, int, int, float]:
        with self.lock:
            st = self.fwd.stats()
            sample = (time.perf_counter() - self.t0, self.writer.stats["written"], st.sent, st.receiver_wait_s)
        self.samples.append(sample)
        return sample

    def run(self) -> None:
        while not self.done.wait(SAMPLE_EVERY):
            self.take()


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (x, y) points."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def steady(samples: list[tuple[float, int, int, float]], fed_for: float) -> dict[str, Any]:
    """KEEPS_UP_RULE over the samples taken in the steady part of the feed, (fed_for / 4, fed_for]."""
    inside = [s for s in samples if fed_for / 4 <= s[0] <= fed_for]
    if len(inside) < 4:
        raise SystemExit(f"{len(inside)} samples in the steady part: --seconds is too short for a rate")
    written = slope([(t, w) for t, w, _, _ in inside])
    delivered = slope([(t, d) for t, _, d, _ in inside])
    backlog = [w - d for _, w, d, _ in inside]
    seconds = inside[-1][0] - inside[0][0]
    waited = inside[-1][3] - inside[0][3]
    allowance = round(written * MAX_LAG)
    return {"steady_seconds": round(seconds, 3), "steady_samples": len(inside),
            "steady_records_per_s_written": round(written),
            "steady_records_per_s_delivered": round(delivered),
            "steady_delivered_vs_written": round(delivered / written, 3) if written else None,
            "backlog_max_steady": max(backlog), "backlog_allowance": allowance,
            "backlog_max_steady_seconds_of_writing": round(max(backlog) / written, 3) if written else None,
            # The share of the steady part the forwarder waited for the receiver's ACKs with a full window:
            # near 1, the receiver set the pace, not the forwarder.
            "receiver_wait_share": round(waited / seconds, 3) if seconds else None,
            "keeps_up": delivered >= KEEP_UP_RATIO * written and max(backlog) <= allowance}


def sustained(scheme: str, pki: Pki, work: Path, seconds: float, child: bool, sink: bool = False) -> dict[str, Any]:
    """The real pipeline writing distinct flows at full rate for `seconds`, the forwarder in a child process
    (`child`, the agent's default) or in a thread of this process; to rsyslogd, or (`sink`) to a receiver
    that only reads: a SIEM off the node, as far as this node's CPU goes."""
    name = f"{scheme}-{'child' if child else 'thread'}{'-sink' if sink else ''}"
    rx: Receiver | Sink = Sink(scheme, pki) if sink else Receiver(work / f"rsyslog-sustained-{name}", pki)
    if isinstance(rx, Receiver):
        rx.daemon.start()
    live = work / f"sustained-{name}" / "audit.jsonl"
    writer = AuditWriter(live, backup_count=50)  # the agent's defaults: 100 MiB files, a 100k-record queue
    writer.start()
    pipeline = AuditPipeline(bench_context(), writer, aggregator(window=1.0))
    checkpoint = work / f"ck-sustained-{name}.json"
    fwd: Forwarder | ProcessForwarder = (
        ProcessForwarder(destination(scheme, rx.url(scheme), pki), live=live, checkpoint=checkpoint) if child
        else forwarder(scheme, rx.url(scheme), pki, live, checkpoint))
    try:
        fwd.start()
        settle_heap()  # as the agent does once it has started
        rx_proc = rx.proc if isinstance(rx, Sink) else rx.daemon.proc
        assert rx_proc is not None and rx_proc.pid is not None and writer._thread is not None
        pid, rx_pid = os.getpid(), rx_proc.pid
        tids = {"pipeline": threading.get_native_id(), "writer": writer._thread.native_id}
        if isinstance(fwd, Forwarder):
            assert fwd._thread is not None
            tids["forwarder"] = fwd._thread.native_id
        child_pid = fwd.pid if isinstance(fwd, ProcessForwarder) else None
        cpu0 = {name: cpu_seconds(pid, tid) for name, tid in tids.items()}
        if child_pid is not None:  # the whole child: its forwarder thread and the one answering stats requests
            cpu0["forwarder_process"] = cpu_seconds(child_pid)
        c0, r0 = time.process_time(), cpu_seconds(rx_pid)
        t0 = time.perf_counter()
        sampler = Sampler(writer, fwd, t0)
        sampler.start()
        fed = 0
        for pin in distinct_packet_ins(1 << 30):
            pipeline(pin)
            fed += 1
            if not fed & 1023 and time.perf_counter() - t0 >= seconds:
                break
        fed_for = sampler.take()[0]  # the steady part ends here: the writer's last flush is a burst
        writer.flush_wait(120)
        span, written, delivered, _ = sampler.take()
        line_bytes = writer.stats["bytes"] / written  # the verbatim copy is the record lines, as the node wrote them
        rsyslog_out = rx.out / rx.node_copy("bench") if isinstance(rx, Receiver) else None
        wrote_out = round(rsyslog_out.stat().st_size / line_bytes) if rsyslog_out and rsyslog_out.exists() else 0
        cpu = {name: cpu_seconds(pid, tid) - cpu0[name] for name, tid in tids.items()}
        if child_pid is not None:
            cpu["forwarder_process"] = cpu_seconds(child_pid) - cpu0["forwarder_process"]
        cpu["process"], cpu["sink" if sink else "rsyslog"] = time.process_time() - c0, cpu_seconds(rx_pid) - r0
        last_seq = writer.head[0]
        drained = wait_sent(fwd, last_seq, 600) - t0 - span
        sampler.done.set()
        sampler.join()
        fwd.stop()
        writer.close()
        stats = fwd.stats()
        rule = steady(sampler.samples, fed_for)
        cores = cpu["process"] + cpu.get("forwarder_process", 0.0) + cpu["sink" if sink else "rsyslog"]
        written_rate, delivered_rate = written / span, delivered / span
        every = max(1, round(0.5 / SAMPLE_EVERY))  # the JSON shows a sample every 0.5 s
        received_fields: dict[str, Any] = {} if isinstance(rx, Sink) else {
            "rsyslog_wrote_out_by_end_of_span": wrote_out,
            "rsyslog_records_per_s_written_out": round(wrote_out / span),
            "delivered_rsyslog_count": received(rx, last_seq),
            "rsyslog_done_after_writer_stopped_s": round(time.perf_counter() - t0 - span, 3)}
        return {
            "forwarder": "child process" if child else "thread of the pipeline's process",
            "receiver": "a process that only reads" if sink else "rsyslogd, shipped config",
            "seconds": round(span, 3), "packet_ins_fed": fed, "records_written": written,
            "writer_dropped": writer.stats["dropped_queue_full"],
            "records_per_s_written": round(written_rate), "records_per_s_delivered": round(delivered_rate),
            "delivered_vs_written": round(delivered_rate / written_rate, 3),
            "backlog_at_end": written - delivered, **rule,
            "backlog_samples": [[round(t, 2), w - d] for t, w, d, _ in sampler.samples[::every] if t <= span],
            "drain_after_writer_stopped_s": round(drained, 3),
            "cpu_s_per_100k_written": {k: round(v * 1e5 / written, 3) for k, v in cpu.items()},
            # This process, the forwarder child and the receiver together, over the span: near
            # os.cpu_count(), the node had no CPU to spare and whoever got less fell behind.
            "cpu_cores_busy": round(cores / span, 2), "cpus": os.cpu_count(),
            **received_fields, "records_on_disk": last_seq, "records_delivered": stats.sent,
            "errors": stats.errors, "lost": stats.lost}
    finally:
        fwd.stop()
        writer.close()
        if isinstance(rx, Sink):
            rx.stop()
        else:
            rx.daemon.stop()


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000, help="records of the drain and ceiling phases")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each sustained phase")
    ap.add_argument("--only", choices=["sustained", "capacity"],
                    help="only the sustained phases, or only the capacity phases (and what they need)")
    ap.add_argument("--no-in-process", action="store_true",
                    help="skip the sustained phases with the forwarder as a thread (the baseline)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npab-syslog-", dir="/tmp"))
    try:
        pki = make_pki(work / "pki", "bench")
        sustain: dict[str, dict[str, Any]] = {}
        threaded: dict[str, dict[str, Any]] = {}
        on_node: dict[str, dict[str, Any]] = {}
        for scheme in ("tcp", "tls") if args.only != "capacity" else ():  # interleaved: a shift in load hits both
            sustain[scheme] = sustained(scheme, pki, work, args.seconds, child=True, sink=True)
            if not args.no_in_process:
                threaded[scheme] = sustained(scheme, pki, work, args.seconds, child=False, sink=True)
            on_node[scheme] = sustained(scheme, pki, work, args.seconds, child=True)

        def each(phases: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
            return {scheme: phase[key] for scheme, phase in phases.items()}
        summary: dict[str, Any] = {
            "keeps_up_rule": KEEPS_UP_RULE,
            "target": "the forwarder, in a child process as the agent runs it by default (syslog.process: true), "
                      "keeps up with the pipeline's distinct-flow rate; receiver: a process that only reads",
            "keeps_up": each(sustain, "keeps_up"),
            "steady_delivered_vs_written": each(sustain, "steady_delivered_vs_written"),
            "steady_written_records_per_s": each(sustain, "steady_records_per_s_written"),
            "backlog_max_steady_seconds_of_writing": each(sustain, "backlog_max_steady_seconds_of_writing"),
            "in_process_keeps_up": each(threaded, "keeps_up"),
            "in_process_steady_delivered_vs_written": each(threaded, "steady_delivered_vs_written"),
            "in_process_steady_written_records_per_s": each(threaded, "steady_records_per_s_written"),
            "rsyslog_on_node_keeps_up": each(on_node, "keeps_up"),
            "rsyslog_on_node_steady_delivered_vs_written": each(on_node, "steady_delivered_vs_written"),
            "rsyslog_on_node_receiver_wait_share": each(on_node, "receiver_wait_share"),
            "rsyslog_on_node_cpu_cores_busy": each(on_node, "cpu_cores_busy"),
            "rsyslog_on_node_records_per_s_written_out": each(on_node, "rsyslog_records_per_s_written_out"),
            "every_record_delivered": all(p["delivered_rsyslog_count"] == p["records_on_disk"]
                                          for p in on_node.values())
                                      and all(p["records_delivered"] == p["records_on_disk"]
                                              for p in (*sustain.values(), *threaded.values()))}
        report: dict[str, Any] = {"benchmark": "syslog_throughput",
                                  "settings": {"seconds": args.seconds, "records": args.records,
                                               "rsyslog": "config/syslog/rsyslog-receiver.conf in rsyslogd "
                                                          "on 127.0.0.1 (TLS: ossl driver)"},
                                  "sustained": sustain, "sustained_in_process": threaded,
                                  "sustained_rsyslog_on_node": on_node}
        if args.only != "sustained":
            pipeline = pipeline_capacity(work / "pipeline" / "audit.jsonl", args.records, pin=False)
            records = load_records(work / "pipeline" / "audit.jsonl")
            live = work / "baseline" / "audit.jsonl"
            ceiling = write_all(live, records)
            count = len(records)
            drains = {scheme: drain(scheme, pki, live, count, work) for scheme in ("tcp", "tls")} \
                if args.only is None else {}
            capacities = {scheme: capacity(scheme, pki, live, count, work) for scheme in ("tcp", "tls")}
            # The same records in one file: what a forwarder that keeps up reads (the live file, no gzip).
            one_file = work / "one-file" / "audit.jsonl"
            write_all(one_file, records, max_bytes=1 << 40)
            following = {scheme: capacity(scheme, pki, one_file, count, one_file.parent) for scheme in ("tcp", "tls")}
            for d in (*drains.values(), *capacities.values(), *following.values()):
                d["vs_sealing_ceiling"] = round(d["records_per_s"] / ceiling["records_per_s"], 3)
                d["vs_pipeline_alone"] = round(d["records_per_s"] / pipeline["records_per_s_on_disk"], 3)
            summary["every_record_delivered"] &= all(d["delivered_rsyslog_count"] == count for d in drains.values())
            summary.update({
                "sealing_ceiling_records_per_s_not_the_target": ceiling["records_per_s"],
                "pipeline_alone_records_per_s": pipeline["records_per_s_on_disk"],
                "drain_records_per_s": {s: d["records_per_s"] for s, d in drains.items()},
                "capacity_records_per_s": {s: c["records_per_s"] for s, c in capacities.items()},
                "capacity_one_file_forwarder_cpu_s_per_100k": {s: c["forwarder_cpu_s_per_100k"]
                                                               for s, c in following.items()}})
            report.update({"sealing_ceiling_writer_alone": ceiling, "pipeline_alone": pipeline, "drain": drains,
                           "capacity": capacities, "capacity_one_file": following})
        report["summary"] = summary
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
