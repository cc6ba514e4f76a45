#!/usr/bin/env python3
"""Syslog forwarder throughput against a private rsyslogd on loopback, beside the writer's rate in the same run. Prints JSON.

Records: distinct-flow records made by the real audit pipeline from recorded
OVS packet-ins (auditlog_throughput.pipeline_capacity, every record another key).
Baseline, same run: records/s the AuditWriter seals and writes for those
records, fed as fast as it takes them (and the whole pipeline's rate beside it).
Then, per transport (TCP, TLS with the ossl driver in rsyslog):
- drain: the forwarder, with the agent's default batch and checkpoint settings,
  sends the whole file set (rotated, gzipped files included) from an empty
  checkpoint: records/s delivered, i.e. acknowledged by rsyslog's TCP, with
  rsyslog's count after;
- live: the writer writes at full speed while the forwarder runs in the same
  process (one GIL, as in the agent): records/s forwarded over the span from the
  first record written to the last one delivered, and how long the forwarder
  still needed once the writer was done.
Target: the forwarder keeps up with the writer's distinct-flow rate, i.e.
drain records/s >= the writer's records/s (target_met; also shown against the
whole pipeline's rate). Two more TCP drains show what the batch size does: the
forwarder's earlier default (500 records / 256 KiB) and a larger one. Each drain
also gives the CPU seconds of the forwarder's process and of rsyslogd: on a small
machine rsyslog's share decides the rate. So a last pair of drains, "capacity",
sends to a receiver that only reads the bytes (TLS: decrypts them) in a process
of its own: the forwarder's own records/s, against the writer's as well. Run as
root or not; needs rsyslogd and rsyslog-openssl (`make bench` runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
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

from auditlog_throughput import pipeline_capacity  # noqa: E402

from auditlog.chain import RecordText  # noqa: E402
from auditlog.fileset import audit_files, iter_lines  # noqa: E402
from auditlog.syslog.forwarder import BATCH_BYTES, BATCH_RECORDS, Forwarder, make_destination  # noqa: E402
from auditlog.syslog.transport import TlsOptions  # noqa: E402
from auditlog.writer import AuditWriter  # noqa: E402
from tests.support.certs import Pki, make_pki  # noqa: E402
from tests.support.rsyslog import Rsyslog  # noqa: E402

FILE_BYTES = 16 << 20  # rotate every 16 MiB, so the drain reads gzipped files too


def load_records(live: Path) -> list[RecordText]:
    """The records of a file set, open again for sealing (their seq and chain are ignored)."""
    out = []
    for _, path in audit_files(live):
        for _, _, raw in iter_lines(path):
            out.append(RecordText.of(json.loads(raw)))
    return out


def write_all(live: Path, records: list[RecordText]) -> dict[str, Any]:
    """Seal and write `records` as fast as the writer takes them; its records/s from first submit to on disk."""
    with AuditWriter(live, max_bytes=FILE_BYTES, backup_count=1000, max_age_days=0,
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


# (records, bytes) per batch: the agent's default, the forwarder's earlier default, and a larger one.
DEFAULT_BATCH = (BATCH_RECORDS, BATCH_BYTES)
SMALL_BATCH = (500, 256 * 1024)
LARGE_BATCH = (5000, 4 << 20)


def forwarder(scheme: str, server: Rsyslog, pki: Pki, live: Path, checkpoint: Path,
              batch: tuple[int, int] = DEFAULT_BATCH) -> Forwarder:
    """A forwarder as the agent builds it, to the private rsyslog."""
    dest = make_destination(f"{scheme}://127.0.0.1:{server.ports[scheme]}", node_name="bench",
                            tls=TlsOptions(ca=pki.ca) if scheme == "tls" else None)
    dest = dataclasses.replace(dest, batch_records=batch[0], batch_bytes=batch[1])
    return Forwarder(dest, live=live, checkpoint=checkpoint)


def wait_sent(fwd: Forwarder, last_seq: int, timeout: float) -> float:
    """perf_counter time at which `fwd` has delivered `last_seq` (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while (fwd.stats().last_seq_sent or 0) < last_seq:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{fwd.destination.name}: {fwd.stats()} after {timeout:.0f} s")
        time.sleep(0.005)
    return time.perf_counter()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
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


def capacity(scheme: str, pki: Pki, live: Path, count: int, work: Path) -> dict[str, Any]:
    """Records/s the forwarder delivers to a receiver that only reads (a process of its own, stopped by pid)."""
    listener = socket.create_server(("127.0.0.1", 0))
    sink = multiprocessing.get_context("fork").Process(
        target=_discard, args=(listener, pki if scheme == "tls" else None), daemon=True)
    sink.start()
    try:
        dest = make_destination(f"{scheme}://127.0.0.1:{listener.getsockname()[1]}", node_name="bench",
                                tls=TlsOptions(ca=pki.ca) if scheme == "tls" else None)
        fwd = Forwarder(dest, live=live, checkpoint=work / f"ck-capacity-{scheme}.json")
        c0, t0 = time.process_time(), time.perf_counter()
        fwd.start()
        done = wait_sent(fwd, count, 600)
        cpu = time.process_time() - c0
        fwd.stop()
        return {"records_per_s": round(count / (done - t0)), "seconds": round(done - t0, 3),
                "forwarder_cpu_s": round(cpu, 3), "errors": fwd.stats().errors}
    finally:
        listener.close()
        if sink.pid is not None:
            os.kill(sink.pid, 9)
        sink.join(5)


def received(server: Rsyslog, scheme: str, count: int) -> int:
    """How many messages rsyslog wrote out, once it has written `count` or stopped making progress for 10 s.

    A TCP ACK means "in rsyslog's socket buffer", not "processed": stopped right
    after the last ACK, rsyslog may drop what its queue still holds at shutdown.
    """
    seen, progress_at = -1, time.monotonic()
    while time.monotonic() - progress_at < 10:
        try:
            now_seen = server.out(scheme).read_bytes().count(b"\n")
        except FileNotFoundError:
            now_seen = 0
        if now_seen >= count:
            break
        if now_seen != seen:
            seen, progress_at = now_seen, time.monotonic()
        time.sleep(0.05)
    server.stop()  # flushes its output
    return len(server.received(scheme))


def drain(scheme: str, pki: Pki, live: Path, count: int, work: Path,
          batch: tuple[int, int] = DEFAULT_BATCH) -> dict[str, Any]:
    name = f"{scheme}-{batch[0]}"
    server = Rsyslog(work / f"rsyslog-drain-{name}", pki)
    server.start()
    try:
        fwd = forwarder(scheme, server, pki, live, work / f"ck-drain-{name}.json", batch)
        assert server.proc is not None
        r0, c0, t0 = cpu_seconds(server.proc.pid), time.process_time(), time.perf_counter()
        fwd.start()
        done = wait_sent(fwd, count, 600)
        cpu = {"forwarder": round(time.process_time() - c0, 3), "rsyslog": round(cpu_seconds(server.proc.pid) - r0, 3)}
        fwd.stop()
        stats = fwd.stats()
        return {"batch_records": batch[0], "batch_bytes": batch[1],
                "records_per_s": round(count / (done - t0)), "seconds": round(done - t0, 3), "cpu_s": cpu,
                "delivered_rsyslog_count": received(server, scheme, count), "errors": stats.errors, "lost": stats.lost}
    finally:
        server.stop()


def live_run(scheme: str, pki: Pki, records: list[RecordText], work: Path) -> dict[str, Any]:
    server = Rsyslog(work / f"rsyslog-live-{scheme}", pki)
    server.start()
    live = work / f"live-{scheme}" / "audit.jsonl"
    try:
        fwd = forwarder(scheme, server, pki, live, work / f"ck-live-{scheme}.json")
        fwd.start()
        result: dict[str, Any] = {}
        writer = threading.Thread(target=lambda: result.update(write_all(live, records)))
        t0 = time.perf_counter()
        writer.start()
        writer.join()
        written = time.perf_counter()
        done = wait_sent(fwd, len(records), 600)
        fwd.stop()
        return {"writer_records_per_s": result["records_per_s"],
                "forwarded_records_per_s": round(len(records) / (done - t0)),
                "forwarder_behind_writer_s": round(max(0.0, done - written), 3),
                "delivered_rsyslog_count": received(server, scheme, len(records)),
                "errors": fwd.stats().errors}
    finally:
        server.stop()


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npab-syslog-", dir="/tmp"))
    try:
        pki = make_pki(work / "pki", "bench")
        pipeline = pipeline_capacity(work / "pipeline" / "audit.jsonl", args.records, pin=False)
        records = load_records(work / "pipeline" / "audit.jsonl")
        line_bytes = sum(len(r.body(1)) for r in records[:1000]) / min(1000, len(records))
        live = work / "baseline" / "audit.jsonl"
        baseline = write_all(live, records)
        count = len(records)
        drains = {scheme: drain(scheme, pki, live, count, work) for scheme in ("tcp", "tls")}
        small = drain("tcp", pki, live, count, work, SMALL_BATCH)
        large = drain("tcp", pki, live, count, work, LARGE_BATCH)
        lives = {scheme: live_run(scheme, pki, records, work) for scheme in ("tcp", "tls")}
        capacities = {scheme: capacity(scheme, pki, live, count, work) for scheme in ("tcp", "tls")}
        writer_rate = baseline["records_per_s"]
        for c in capacities.values():
            c["vs_writer"] = round(c["records_per_s"] / writer_rate, 3)
        for scheme, d in drains.items():
            d["vs_writer"] = round(d["records_per_s"] / writer_rate, 3)
            d["vs_pipeline"] = round(d["records_per_s"] / pipeline["records_per_s_on_disk"], 3)
        summary = {
            "writer_distinct_records_per_s_baseline": writer_rate,
            "pipeline_distinct_records_per_s": pipeline["records_per_s_on_disk"],
            "tcp_drain_records_per_s": drains["tcp"]["records_per_s"],
            "tls_drain_records_per_s": drains["tls"]["records_per_s"],
            "tcp_drain_records_per_s_small_batch": small["records_per_s"],
            "tcp_drain_records_per_s_large_batch": large["records_per_s"],
            "target": "forwarder drain records/s >= the writer's distinct-record rate (keeps up with the writer)",
            "target_met": {s: d["records_per_s"] >= writer_rate for s, d in drains.items()},
            "capacity_records_per_s": {s: c["records_per_s"] for s, c in capacities.items()},
            "capacity_target_met": {s: c["records_per_s"] >= writer_rate for s, c in capacities.items()},
            "target_met_pipeline_rate": {s: d["records_per_s"] >= pipeline["records_per_s_on_disk"]
                                         for s, d in drains.items()},
            "every_record_delivered": all(p["delivered_rsyslog_count"] == count
                                          for p in (*drains.values(), small, large, *lives.values())),
        }
        print(json.dumps({"benchmark": "syslog_throughput",
                          "settings": {"records": count, "record_bytes_mean": round(line_bytes),
                                       "file_bytes": FILE_BYTES,
                                       "receiver": "rsyslogd on 127.0.0.1 (imtcp; TLS: ossl driver)"},
                          "baseline_writer": baseline, "baseline_pipeline": pipeline,
                          "drain": drains, "drain_tcp_small_batch": small, "drain_tcp_large_batch": large,
                          "live": lives, "capacity": capacities, "summary": summary},
                         indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
