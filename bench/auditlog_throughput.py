#!/usr/bin/env python3
"""Audit pipeline under load and at rest, on a real OVS, in one run. Prints JSON.

(a) aggregated flood: one dropped flow flooding; packet-ins/s OVS emitted vs
    packets/s accounted for in records (sum of npaudit.aggregate.packets).
(b) distinct flows: every packet-in a new key, so aggregation cannot help;
    records/s written to the file. OVS here emits only ~25k packet-ins/s at one
    per frame (each frame is a slow-path upcall), so (b) runs twice: one
    packet-in per frame (the destination port varies), and `--copies` packet-ins
    per frame whose copies carry different rule ids (a packet meeting several
    logged rules), which lets OVS offer more distinct keys per second than the
    target. A third figure feeds the pipeline in-process, OVS out of the way:
    the pipeline's own records/s.
(c) latency at a low rate: from the packet leaving the source Pod to its
    record being readable in the file, p50/p99, with the hand-offs, beside a
    bare reader's floor, for the writer's inline path and its thread only
    (interleaved rounds); and the in-process capacity A/B of the same two
    writer modes (the inline path must not cost throughput).
The baseline in the same run is the raw consumer (frames and counts only).
Consumer: channel -> demux -> AuditPipeline (decode, aggregate, ECS record) ->
AuditWriter (thread, batching, hash chain) -> file. Run as root: `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge import RULE_ID, bench_bridge, consumer_path, print_report, run_phase, until_sigterm  # noqa: E402
from _latency_probe import LOW_RATE_SENDER, Round, breakdown, consume_floor, consume_latency, floor  # noqa: E402
from packetin_throughput import consume_raw  # noqa: E402

from auditlog.record_fast import aggregator  # noqa: E402
from auditlog.overload import Overload  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from auditlog.record import RecordContext  # noqa: E402
from auditlog.writer import AuditWriter  # noqa: E402
from packetin.gctune import settle_heap  # noqa: E402
from packetin.model import PacketIn  # noqa: E402
from policy_agent.policy.model import Action, Direction  # noqa: E402
from policy_agent.policy.rules import RuleInfo, RuleRegistry  # noqa: E402


# The Pods at both ends of the bench's traffic: the bridge's Pods a and b, and the
# addresses of the recorded packet-in the in-process phase replays.
BENCH_PODS = {"10.244.9.2": ("frontend", "client-5d8f7c9b4-x2k8q"), "10.244.9.3": ("backend", "postgres-0"),
              "10.99.0.2": ("frontend", "client-5d8f7c9b4-x2k8q"), "10.99.0.3": ("backend", "postgres-0")}
LATENCY_TARGET = "p50 <= 1.0 ms, p99 <= 2 ms (issue 10; OVN's ovn-controller here: p50 0.7 / p99 3.5 ms)"
DISTINCT_RULES = 8  # rule ids RULE_ID .. RULE_ID+7 (bench_bridge's distinct_rules copies)


class _BenchPods:
    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return BENCH_PODS.get(ip)


def bench_context() -> RecordContext:
    """The enrichment context of the bench's flows: logged securityops Drops, Pods on both ends."""
    rules = RuleRegistry()
    rules.replace({RULE_ID + i: RuleInfo(rule_id=RULE_ID + i, policy_kind="AntreaClusterNetworkPolicy", namespace="",
                                         policy_name="bench", rule_name=f"drop-udp-{i}", tier="securityops",
                                         priority=1.0 + i, action=Action.DROP, direction=Direction.EGRESS,
                                         log_label="bench", logged=True)
                   for i in range(DISTINCT_RULES)})
    return RecordContext(node="bench", cluster="bench", rules=rules, pods=_BenchPods())


def count_records(path: Path) -> tuple[int, int]:
    """(records, packets accounted) over the live file and its rotations."""
    import gzip

    records = packets = 0
    for f in sorted(path.parent.glob(path.name + "*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            for line in fh:
                if line.strip():
                    records += 1
                    packets += json.loads(line)["npaudit"]["aggregate"]["packets"]
    return records, packets


def sample_written(writer: AuditWriter, samples: list[tuple[float, int]], done: threading.Event) -> None:
    """(time, records written) every 10 ms, for the span over which records were written."""
    while not done.wait(0.01):
        samples.append((time.monotonic(), writer.stats["written"]))
    samples.append((time.monotonic(), writer.stats["written"]))


def write_span(samples: list[tuple[float, int]]) -> float | None:
    """Seconds from the last sample before the first record to the first sample after the last
    (so the span errs long and the rate it gives errs low)."""
    total = samples[-1][1] if samples else 0
    if not total:
        return None
    start = max((t for t, n in samples if n == 0), default=samples[0][0])
    end = min(t for t, n in samples if n == total)
    return round(end - start, 3)


def consume_audit(target: str, netns: str, audit_path: str) -> None:
    context = bench_context()

    async def main() -> None:
        # The agent's defaults (100 MiB files, a 100k-record queue), except that nothing is pruned.
        writer = AuditWriter(Path(audit_path), backup_count=50)
        writer.start()
        pipeline = AuditPipeline(context, writer, aggregator(window=1.0))
        done = threading.Event()
        samples: list[tuple[float, int]] = []
        sampler = threading.Thread(target=sample_written, args=(writer, samples, done), daemon=True)
        async with consumer_path(target, netns, pipeline) as (channel, demux):
            pipeline.start()
            sampler.start()
            stats = await until_sigterm(demux)
        await asyncio.to_thread(writer.flush_wait, 30)
        done.set()
        sampler.join()
        await pipeline.close()
        await asyncio.to_thread(writer.close)
        records, packets = count_records(Path(audit_path))
        print(json.dumps({"delivered": stats["delivered"], "decoded": channel.packet_ins, "records": records,
                          "packets_in_records": packets, "writer_dropped": writer.stats.get("dropped_queue_full", 0),
                          "write_span_s": write_span(samples), "pipeline": pipeline.stats}), flush=True)

    asyncio.run(main())


# One packet per destination port, so each is the first packet of a new audit key.
LATENCY_KINDS = ("floor", "thread_only", "inline")  # bare reader; writer thread always; the agent's default


def latency_round(bridge: dict, kind: str, audit_path: Path, n: int, rate: float) -> Round:
    """One consumer of `kind`, n packets at `rate`, each to its own port (each a new audit key):
    (sent, the destination ports of the records in the file, the consumer's stamps and CPU)."""
    if kind == "floor":
        audit_path.parent.mkdir(parents=True, exist_ok=True)
    extra = ["--audit", str(audit_path)]  # the floor appends its lines there (the file-append floor)
    extra += ["--thread-only"] if kind == "thread_only" else []
    proc = subprocess.Popen([sys.executable, __file__, "--consumer", "floor" if kind == "floor" else "latency",
                             "--target", bridge["targets"]["tcp"], "--netns", bridge["ovs"].netns, *extra],
                            stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"latency consumer {kind} did not start")
        out = subprocess.run(["ip", "netns", "exec", bridge["a"].netns, sys.executable, "-c", LOW_RATE_SENDER,
                              bridge["b"].ip, str(n), str(rate)], capture_output=True, text=True, check=True).stdout
        sent = {int(port): float(t) for port, t in (line.split() for line in out.splitlines())}
        time.sleep(0.2)  # the last packet's way through
    finally:
        proc.send_signal(signal.SIGTERM)
        consumer_out, _ = proc.communicate(timeout=30)
    in_file = set()
    if audit_path.exists():  # read after the round: no reader polls the file while packets are timed
        with open(audit_path, "rb") as f:
            in_file = {json.loads(line).get("destination", {}).get("port") for line in f if line.strip()}
    got = json.loads(consumer_out.strip().splitlines()[-1])
    return sent, in_file, got["stamps"], got["cpu_s"]


def latency(bridge: dict, work: Path, n: int, rate: float, rounds: int) -> dict:
    """Packet leaves the Pod -> its record readable in the file (each packet a new flow), with the
    hand-offs on the way (bench/_latency_probe.py), for the writer's inline path and for its thread
    only, beside the floor (a bare reader), in `rounds` interleaved rounds of n / rounds packets."""
    got: dict[str, list[Round]] = {kind: [] for kind in LATENCY_KINDS}
    per_round = max(1, n // rounds)
    for r in range(rounds):
        for i in range(len(LATENCY_KINDS)):
            kind = LATENCY_KINDS[(i + r) % len(LATENCY_KINDS)]  # rotated: no kind always runs first
            got[kind].append(latency_round(bridge, kind, work / f"latency-{kind}-{r}" / "audit.jsonl",
                                           per_round, rate))
    out: dict = {"rate_per_s": rate, "rounds": rounds, "end_to_end_is": "sender -> the writer's stamp when the "
                 "write(2) of the record returned (no reader wake-up in it; the file is read after each round)",
                 "floor_bare_reader": floor(got["floor"])}
    for kind in LATENCY_KINDS[1:]:
        out[kind] = breakdown(got[kind])
    inline = out["inline"].get("end_to_end")
    out["target"] = LATENCY_TARGET
    out["target_met"] = bool(inline and inline["p50_ms"] <= 1.0 and inline["p99_ms"] <= 2.0)
    out["target_issue_22"] = "p50 <= 0.6 ms, p99 <= 1 ms, beside the same run's file-append floor"
    out["target_issue_22_met"] = bool(inline and inline["p50_ms"] <= 0.6 and inline["p99_ms"] <= 1.0)
    append = out["floor_bare_reader"].get("sent_to_written_file_append")
    if inline and append:
        out["inline_vs_file_append_floor"] = {q: round(inline[q] / append[q], 2) if append[q] else None
                                              for q in ("p50_ms", "p99_ms")}
    out["target_met_is"] = ("the agent's default (inline) end to end, sender -> written; the floor and "
                            "agent_read_to_written say how much of it is the sender and OVS vs the agent")
    return out


def distinct_packet_ins(n: int) -> Iterator[PacketIn]:
    """n decoded packet-ins of n distinct keys (recorded OVS bytes; destination port and rule
    varied), made on the fly as the channel makes them: n live objects would make a bench about GC."""
    from packetin import wire

    raw = (Path(__file__).resolve().parent.parent / "tests" / "unit" / "data" / "ovs31_packet_in2_stream.bin").read_bytes()
    t = wire.decode_packet_in2(wire.Framer().feed(raw)[0], time.time())
    frame = bytearray(t.packet)
    frame[23] = 17  # make it UDP so the destination port is a key field
    frames = []  # 64k frames (bytes: no work for the garbage collector), one per destination port
    for port in range(1024, 1024 + 64000):
        frame[36:38] = port.to_bytes(2, "big")
        frames.append(bytes(frame))
    make = PacketIn
    for i in range(n):
        # (rule, destination port) differs for every packet-in up to 64k x DISTINCT_RULES
        rule_id = RULE_ID + (i // 64000) % DISTINCT_RULES
        yield make(t.reason, t.table_id, t.cookie, t.in_port, rule_id, t.reg7, t.userdata, frames[i % 64000],
                   t.total_len, time.time())


def pipeline_capacity(path: Path, n: int, pin: bool,
                      overload: Callable[[AuditWriter], Overload | None] = lambda writer: None,
                      inline: bool = True) -> dict:
    """Records/s the pipeline writes with OVS out of the way: n packet-ins of n distinct keys
    (distinct_packet_ins) fed straight in (with `overload`'s Overload, if it gives one)."""
    packet_ins = functools.partial(distinct_packet_ins, n)
    context = bench_context()
    affinity = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, {1})  # one core, as the consumer in the OVS phases; threads made now inherit it
    try:
        # The agent's writer defaults (100 MiB files, a 100k-record queue; a drop would show below).
        writer = AuditWriter(path, backup_count=50, **({} if inline else {"inline_gap": None}))
        writer.start()
        pipeline = AuditPipeline(context, writer, aggregator(window=1.0), overload=overload(writer))
        settle_heap()  # as the agent does once it has started
        t0 = time.perf_counter()
        c0 = time.process_time()
        for pin_in in packet_ins():
            pipeline(pin_in)
        fed = time.perf_counter() - t0
        writer.flush_wait(120)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        writer.close()
    finally:
        os.sched_setaffinity(0, affinity)
    records, packets = count_records(path)
    return {"records": records, "packets_accounted": packets, "coarsened": pipeline.stats["coarsened"],
            "writer_dropped": writer.stats["dropped_queue_full"], "write_batches": writer.stats["batches"],
            "pinned_to_one_cpu": pin,
            "records_per_s_fed": round(n / fed), "records_per_s_on_disk": round(records / elapsed),
            "cpu_seconds_both_threads": round(cpu, 3)}


def capacity_ab(work: Path, n: int, pin: bool, rounds: int) -> dict:
    """pipeline_capacity with the writer's inline path and with its thread only, interleaved."""
    runs: dict[str, list[dict]] = {"thread_only": [], "inline": []}
    for r in range(rounds):
        for kind in (("thread_only", "inline") if r % 2 == 0 else ("inline", "thread_only")):
            runs[kind].append(pipeline_capacity(work / f"capacity-{kind}-{r}" / "audit.jsonl", n, pin,
                                                inline=kind == "inline"))

    def best(kind: str, field: str, pick: Callable = max) -> float:
        return pick(run[field] for run in runs[kind])

    # Best of the rounds: on a shared machine other processes only ever make a round slower.
    rate = best("inline", "records_per_s_on_disk") / best("thread_only", "records_per_s_on_disk")
    cpu = best("inline", "cpu_seconds_both_threads", min) / best("thread_only", "cpu_seconds_both_threads", min)
    return {**runs, "inline_vs_thread_only_records_per_s_best": round(rate, 3),
            "inline_vs_thread_only_cpu_seconds_best": round(cpu, 3),
            "records_per_s_kept": rate >= 0.95, "cpu_per_record_kept": cpu <= 1.05,
            "target": "inline records/s >= 0.95 x thread only and CPU <= 1.05 x, same run (CPU is the "
                      "steadier figure on a shared machine)"}


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--copies", type=int, default=4, help="packet-ins per frame for the floods (see packetin bench)")
    ap.add_argument("--rate", type=float, default=60000, help="flood frames/s offered")
    ap.add_argument("--latency-packets", type=int, default=1000, help="per latency consumer kind")
    ap.add_argument("--latency-rounds", type=int, default=2)
    ap.add_argument("--capacity-records", type=int, default=200_000)
    ap.add_argument("--latency-rate", type=float, default=50.0)
    ap.add_argument("--no-pin", dest="pin", action="store_false")
    ap.add_argument("--latency-only", action="store_true",
                    help="only (c), the latency at a low rate, and the writer modes' capacity A/B")
    ap.add_argument("--consumer", choices=["raw", "audit", "latency", "floor"], help=argparse.SUPPRESS)
    ap.add_argument("--thread-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--netns", default="", help=argparse.SUPPRESS)
    ap.add_argument("--audit", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consumer == "raw":
        consume_raw(args.target, args.netns)
        return 0
    if args.consumer == "audit":
        consume_audit(args.target, args.netns, args.audit)
        return 0
    if args.consumer == "latency":
        consume_latency(args.target, args.netns, args.audit, bench_context(), inline=not args.thread_only)
        return 0
    if args.consumer == "floor":
        consume_floor(args.target, args.netns, args.audit)
        return 0

    if not 1 <= args.copies <= DISTINCT_RULES:
        ap.error(f"--copies must be 1..{DISTINCT_RULES} (one bench rule per copy)")
    work = Path(tempfile.mkdtemp(prefix="npab-audit-", dir="/tmp"))
    if args.latency_only:
        with bench_bridge(1) as bridge:
            lat = latency(bridge, work, args.latency_packets, args.latency_rate, args.latency_rounds)
        ab = capacity_ab(work, args.capacity_records, args.pin, args.rounds)
        print_report("auditlog_throughput", args, [], {"latency": lat, "capacity_writer_ab": ab}, work)
        return 0
    phases = []
    def measure(bridge: dict, mode: str, distinct: bool, rate: float) -> None:
        env = {**bridge, "target": bridge["targets"]["tcp"], "rate": rate, "pin": args.pin}
        for r in range(args.rounds):
            base = run_phase(__file__, "raw", env, args.seconds, distinct=distinct)
            audit = run_phase(__file__, "audit", env, args.seconds, distinct=distinct,
                              extra=("--audit", str(work / f"{mode}-{r}" / "audit.jsonl")))
            for p in (base, audit):
                p["mode"] = mode
            phases.extend((base, audit))

    # (a) One flow, several packet-ins per frame: the highest packet-in rate OVS reaches.
    with bench_bridge(args.copies) as bridge:
        measure(bridge, "aggregated", distinct=False, rate=args.rate)
    # (b) Several packet-ins per frame, each copy another rule, every frame a new port.
    with bench_bridge(args.copies, distinct_rules=True) as bridge:
        measure(bridge, "distinct", distinct=True, rate=args.rate)
    # (b), (c) One packet-in per frame, every frame a new key.
    with bench_bridge(1) as bridge:
        measure(bridge, "distinct_one_per_frame", distinct=True, rate=args.rate * args.copies)
        lat = latency(bridge, work, args.latency_packets, args.latency_rate, args.latency_rounds)
    capacity = pipeline_capacity(work / "capacity" / "audit.jsonl", args.capacity_records, args.pin)
    ab = capacity_ab(work, args.capacity_records, args.pin, args.rounds)

    def best(mode: str, consumer: str, field: str) -> float:
        return max(p[field] for p in phases if p["mode"] == mode and p["consumer"] == consumer)

    def audit_phases(mode: str) -> list[dict]:
        return [p for p in phases if p["mode"] == mode and p["consumer"] == "audit"]

    def distinct(mode: str, per_frame: int) -> dict:
        ps = audit_phases(mode)
        return {
            "packet_ins_per_frame": per_frame,
            # Over the span in which records were written (a consumer that falls behind
            # writes past the end of the flood), not over the flood's length.
            "records_per_s": max(round(p["records"] / max(p["seconds"], p["write_span_s"] or 0)) for p in ps),
            "packets_in_per_s": max(round(p["delivered"] / p["seconds"]) for p in ps),
            "ovs_ceiling_per_s_baseline": best(mode, "raw", "ovs_emitted_per_s"),
            "records_equal_packet_ins": all(p["records"] == p["delivered"] for p in ps),
            "accounted_equals_admitted": all(p["packets_in_records"] == p["delivered"] for p in ps),
            "lost_in_ovs_with_audit_consumer": max(p["lost_in_ovs_rconn_overflow"] for p in ps),
            "audit_consumer_cpu_percent": max(p["consumer_cpu_percent"] for p in ps),
            "target": ">= 50k records/s (OVN's ovn-controller: ~48k ACL lines/s here)",
        }

    agg = audit_phases("aggregated")
    summary = {
        "aggregated_flood": {
            "ovs_ceiling_per_s_baseline": best("aggregated", "raw", "ovs_emitted_per_s"),
            "packets_accounted_per_s": max(round(p["packets_in_records"] / p["seconds"]) for p in agg),
            "accounted_equals_admitted": all(p["packets_in_records"] == p["delivered"] for p in agg),
            # The same phase's OVS count: 1.0 means every packet-in OVS emitted is in a record
            # (the ceiling above comes from other phases, and OVS's rate swings between them).
            "accounted_vs_ovs_emitted_same_phase_worst": min(
                round(p["packets_in_records"] / p["ovs_emitted"], 4) for p in agg),
            "records": [p["records"] for p in agg],
            "target": ">= 0.90 of the OVS packet-in ceiling",
        },
        "distinct_flows": distinct("distinct", args.copies),
        "distinct_flows_one_per_frame": distinct("distinct_one_per_frame", 1),
        "pipeline_capacity_distinct": capacity,
        "capacity_writer_ab": ab,
        "latency": lat,
    }
    summary["aggregated_flood"]["accounted_vs_ceiling"] = round(
        summary["aggregated_flood"]["packets_accounted_per_s"] / summary["aggregated_flood"]["ovs_ceiling_per_s_baseline"], 4)
    print_report("auditlog_throughput", args, phases, summary, work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
