#!/usr/bin/env python3
"""Audit overload mode on a real OVS, in one run: a flood in which every packet-in is a new
audit key, consumed with overload mode off (the baseline: full detail always) and on. Prints JSON.

Per phase: packet-ins OVS emitted (flow n_packets x copies), packets accounted in records
(sum of npaudit.aggregate.packets) and their fraction of the emitted, lost in OVS
(rconn_overflow) and in the agent's demux queue, records written, coarsened records and
time in overload. The consumer is the agent's path with the agent's defaults (policy
queue 65,536, writer queue 100,000, fair shares, overload marks from config):
channel -> demux -> AuditPipeline -> AuditWriter -> file; only the category's token
bucket is opened wide (admission is policy, not capacity). A last figure feeds the
pipeline in-process (OVS out of the way) at full detail, with and without the overload
check, for the cost of the check itself. OVS here may emit less than the pipeline can take
at full detail (a shared 2-core machine), so a synthetic phase also offers packet-ins
in-process at --synthetic-rate through the same demux and pipeline. Run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge import bench_bridge, print_report, run_phase, until_sigterm  # noqa: E402
from auditlog_throughput import bench_context, count_records, distinct_packet_ins, pipeline_capacity  # noqa: E402

from auditlog.aggregate import Aggregator  # noqa: E402
from auditlog.overload import Overload  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from auditlog.writer import AuditWriter  # noqa: E402
from packetin.demux import Demux, FairShareSettings  # noqa: E402
from packetin.fair_key import applied_to_key  # noqa: E402
from packetin.gctune import settle_heap  # noqa: E402
from packetin.model import Category  # noqa: E402
from policy_agent.config import AuditConfig, PacketInConfig  # noqa: E402


def agent_path(writer: AuditWriter, overload_on: bool) -> tuple[Demux, AuditPipeline]:
    """The agent's demux and pipeline with its defaults (policy queue, fair shares, overload marks);
    only the category's token bucket is opened wide (admission is policy, not capacity)."""
    packetin, marks = PacketInConfig(), AuditConfig().overload
    context = bench_context()
    demux = Demux()
    overload = Overload(lambda: max(demux.queue_fill(Category.POLICY), writer.queue_fill()),
                        high_mark=marks.high_mark, peers_mark=marks.peers_mark,
                        low_mark=marks.low_mark) if overload_on else None
    pipeline = AuditPipeline(context, writer, Aggregator(window=1.0), overload=overload)
    share = packetin.fair_share

    def direction(rule_id: int) -> str | None:
        rule = context.rules.get(rule_id)
        return None if rule is None else rule.direction.value

    demux.subscribe(Category.POLICY, pipeline, rate=1e9, burst=1e9, queue_size=packetin.policy.queue_size,
                    now=time.monotonic(),
                    fair=FairShareSettings(applied_to_key(direction), share.key_rate, share.key_burst, share.max_keys))
    return demux, pipeline


def outcome(demux: Demux, pipeline: AuditPipeline, writer: AuditWriter, path: Path) -> dict:
    records, packets = count_records(path)
    stats = demux.stats()[Category.POLICY]
    snap = pipeline.snapshot()
    return {"delivered": stats["delivered"], "dropped_queue_full": stats["dropped_queue_full"],
            "dropped_admission": stats["dropped_rate_limit"] + stats["dropped_fair_share"],
            "records": records, "packets_in_records": packets,
            "writer_dropped": writer.stats.get("dropped_queue_full", 0), "coarsened_records": snap.coarsened,
            "overload_seconds": round(snap.overload.seconds, 3) if snap.overload else 0.0,
            "overload_entered": snap.overload.entered if snap.overload else 0}


def consume(target: str, netns: str, audit_path: str, overload_on: bool) -> None:
    """The OVS phases' consumer: the agent's path from the OpenFlow channel to the file."""
    from packetin.channel import ChannelSettings, OpenFlowChannel

    async def main() -> None:
        writer = AuditWriter(Path(audit_path), backup_count=50)  # the agent's queue and file sizes
        writer.start()
        demux, pipeline = agent_path(writer, overload_on)
        channel = OpenFlowChannel(ChannelSettings(target=target, netns=netns), demux.dispatch,
                                  on_malformed=demux.count_malformed)
        demux.start()
        pipeline.start()
        channel.start()
        await channel.wait_ready(10)
        settle_heap()
        await until_sigterm(demux)
        await channel.close()
        await demux.stop()
        await asyncio.to_thread(writer.flush_wait, 60)
        await pipeline.close()
        await asyncio.to_thread(writer.close)
        print(json.dumps({**outcome(demux, pipeline, writer, Path(audit_path)), "decoded": channel.packet_ins}),
              flush=True)

    asyncio.run(main())


def synthetic_flood(path: Path, rate: float, seconds: float, overload_on: bool, pin: bool) -> dict:
    """OVS out of the way: packet-ins of distinct keys offered to the demux at `rate` per second
    on the event loop, as the reader would hand them over, the consumer sharing the loop."""
    async def main() -> dict:
        writer = AuditWriter(path, backup_count=50)
        writer.start()
        demux, pipeline = agent_path(writer, overload_on)
        demux.start()
        pipeline.start()
        source = distinct_packet_ins(int(rate * seconds))
        settle_heap()
        t0 = time.monotonic()
        offered = 0
        while offered < rate * seconds:
            due = min(int((time.monotonic() - t0) * rate), int(rate * seconds)) - offered
            if due > 0:
                demux.dispatch(list(itertools.islice(source, due)), time.monotonic())
                offered += due
            await asyncio.sleep(0)  # the consumer's turn (a slice), as between two socket reads
        elapsed = time.monotonic() - t0
        await demux.wait_idle()
        await demux.stop()
        await asyncio.to_thread(writer.flush_wait, 120)
        await pipeline.close()
        await asyncio.to_thread(writer.close)
        result = outcome(demux, pipeline, writer, path)
        return {"consumer": "synthetic", "overload": "on" if overload_on else "off", "offered": offered,
                "offered_per_s": round(offered / elapsed), **result,
                "accounted_vs_offered": round(result["packets_in_records"] / offered, 4),
                "records_per_s": round(result["records"] / elapsed)}

    affinity = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, {1})
    try:
        return asyncio.run(main())
    finally:
        os.sched_setaffinity(0, affinity)


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--copies", type=int, default=4, help="packet-ins per frame, each another rule id")
    ap.add_argument("--rate", type=float, default=60000, help="flood frames/s offered")
    ap.add_argument("--synthetic-rate", type=float, default=60000, help="packet-ins/s offered in-process")
    ap.add_argument("--capacity-records", type=int, default=100_000)
    ap.add_argument("--no-pin", dest="pin", action="store_false")
    ap.add_argument("--consumer", choices=["audit"], help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--netns", default="", help=argparse.SUPPRESS)
    ap.add_argument("--audit", default="", help=argparse.SUPPRESS)
    ap.add_argument("--overload", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consumer == "audit":
        consume(args.target, args.netns, args.audit, args.overload == "on")
        return 0

    work = Path(tempfile.mkdtemp(prefix="npab-overload-", dir="/tmp"))
    phases = []
    for copies in (args.copies, 1):
        with bench_bridge(copies, distinct_rules=copies > 1) as bridge:
            env = {**bridge, "target": bridge["targets"]["tcp"], "rate": args.rate, "pin": args.pin}
            for r in range(args.rounds):
                for mode in ("off", "on"):
                    phase = run_phase(__file__, "audit", env, args.seconds, distinct=True,
                                      extra=("--audit", str(work / f"{copies}-{mode}-{r}" / "audit.jsonl"),
                                             "--overload", mode))
                    phase.update(overload=mode, packet_ins_per_frame=copies,
                                 accounted_vs_emitted=round(phase["packets_in_records"] / phase["ovs_emitted"], 4)
                                 if phase["ovs_emitted"] else None,
                                 records_per_s=round(phase["records"] / phase["seconds"]))
                    phases.append(phase)
    synthetic = [synthetic_flood(work / f"synthetic-{mode}-{r}" / "audit.jsonl", args.synthetic_rate,
                                 args.seconds, mode == "on", args.pin)
                 for r in range(args.rounds) for mode in ("off", "on")]

    # Full detail in-process, alternating, best of three each: the overload check's own cost.
    never = Overload(lambda: 0.0, high_mark=0.5, peers_mark=0.8, low_mark=0.1)
    capacity: dict[str, list[int]] = {"without_overload": [], "with_overload_check": []}
    for r in range(3):
        for name, make in (("without_overload", lambda writer: None), ("with_overload_check", lambda writer: never)):
            capacity[name].append(pipeline_capacity(work / f"capacity-{name}-{r}" / "audit.jsonl",
                                                    args.capacity_records, args.pin, overload=make)
                                  ["records_per_s_fed"])

    def by_mode(rows: list[dict], field: str, pick: Callable = min) -> dict:
        return {mode: pick(p[field] for p in rows if p["overload"] == mode) for mode in ("off", "on")}

    summary = {
        "ovs_accounted_vs_emitted_worst": by_mode(phases, "accounted_vs_emitted"),
        "ovs_emitted_per_s_best": max(p["ovs_emitted_per_s"] for p in phases),
        "ovs_lost_rconn_overflow_vs_emitted_worst": {
            mode: max(round(p["lost_in_ovs_rconn_overflow"] / p["ovs_emitted"], 4) for p in phases
                      if p["overload"] == mode and p["ovs_emitted"]) for mode in ("off", "on")},
        "synthetic_accounted_vs_offered_worst": by_mode(synthetic, "accounted_vs_offered"),
        "lost_in_agent_queue": {mode: by_mode(phases, "dropped_queue_full", max)[mode]
                                + by_mode(synthetic, "dropped_queue_full", max)[mode] for mode in ("off", "on")},
        "full_detail_records_per_s_in_process_best": {name: max(v) for name, v in capacity.items()},
        "target": ">= 0.99 of emitted packet-ins in records with overload on; 0 lost in the agent; "
                  "rconn_overflow <= 1%; full-detail records/s not below the baseline",
    }
    print_report("audit_overload", args, phases + synthetic, summary, work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
