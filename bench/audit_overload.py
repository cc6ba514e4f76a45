#!/usr/bin/env python3
"""Audit overload mode on a real OVS, in one run: a flood in which every packet-in is a new
audit key, through the real agent with overload mode off (the baseline: full detail always)
and on. Prints JSON.

Real-OVS phases: the e2e cluster's agent (tests/support/cluster.py: the agent process, its
embedded OVS, Pods through CNI) with the new-key flood of tests/e2e/test_overload_e2e.py: Pod
x/a sends UDP with the fast sender (tests/support/udp_flood.py, unpaced) to y/a, a new
destination port per datagram over 1024-65535, into a logged Drop on that range. For the
run the policy_deny meter is raised (--meter-rate), the policy category's token bucket is
opened wide and its fair shares are off (admission is policy, not capacity; said in the
JSON), the debug tap is off; queues and overload marks are the agent's defaults. Per phase:
packet-ins OVS emitted (controller flows' n_packets minus meter band drops), lost in OVS
(rconn_overflow, the agent's npaudit_ovs_packetin_lost_total), packet-ins in records (sum
of npaudit.aggregate.packets) and their fraction of the emitted, lost at the agent (its
demux queue full) and admission drops, records/s (records over the flood's seconds),
coarsened records and full-detail records/s; and, before OVS, the frames the kernel
dropped at ovs-vswitchd's full packet socket (never packet-ins). Each mode runs on a
"shared" node (nothing pinned) and a "busy" one (the agent and the sender share CPU 1,
ovs-vswitchd has CPU 0: the agent cannot build a full record per packet-in).

A synthetic phase also offers NXT_PACKET_IN2 bytes in-process at --synthetic-rate through
the agent's reader, demux and pipeline (OVS out of the way), and a figure feeds the pipeline
in-process at full detail, with and without the overload check, for the cost of the check
itself. A last figure is the read path's own CPU per packet-in (main thread, thread_time,
same run, best of three alternating): new-key NXT_PACKET_IN2 bytes shaped like OVS 3.1's
(conntrack fields and all) through the agent's reader, demux, policy handler and pipeline,
at full detail with and without the grouping hooks (their cost), and in overload one by
one (as before grouping) and grouped. Run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from _bridge import RULE_ID, machine, pin_process  # noqa: E402
from flood import cpu  # noqa: E402
from auditlog_throughput import bench_context, count_records, pipeline_capacity  # noqa: E402

from auditlog.record_fast import aggregator  # noqa: E402
from auditlog.overload import Overload  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from auditlog.writer import AuditWriter  # noqa: E402
from packetin.demux import Demux, FairShareSettings  # noqa: E402
from packetin.reader import PacketInReader  # noqa: E402
from policy_agent.policy_packetins import PolicyPacketIns  # noqa: E402
from packetin.fair_key import applied_to_key  # noqa: E402
from packetin.gctune import settle_heap  # noqa: E402
from packetin.model import Category  # noqa: E402
from policy_agent.config.loader import AuditConfig, PacketInConfig  # noqa: E402
from policy_agent.ovs.pids import read_pid  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.overload_scenario import (FIRST_PORT, PORTS, new_key_flood_cluster, settled,  # noqa: E402
                                             start_flood_pods)
from tests.support.udp_flood import send_flood  # noqa: E402


def agent_path(writer: AuditWriter, overload_on: bool) -> tuple[Demux, AuditPipeline]:
    """The agent's demux and pipeline with its defaults (policy queue, fair shares, overload marks);
    only the category's token bucket is opened wide (admission is policy, not capacity)."""
    packetin, marks = PacketInConfig(), AuditConfig().overload
    context = bench_context()
    demux = Demux()
    overload = Overload(lambda: max(demux.queue_fill(Category.POLICY), writer.queue_fill()),
                        high_mark=marks.high_mark, peers_mark=marks.peers_mark,
                        low_mark=marks.low_mark) if overload_on else None
    pipeline = AuditPipeline(context, writer, aggregator(window=1.0), overload=overload)
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


def vswitchd_socket_drops(cluster: Cluster) -> int:
    """Frames the kernel dropped because ovs-vswitchd's packet sockets were full (`ss` skmem d):
    lost before OVS saw them, so never packet-ins."""
    out = subprocess.run(["ip", "netns", "exec", f"npe-{cluster.tag}", "ss", "-0", "-a", "-m", "-p"],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(d) for line in out.splitlines() if "ovs-vswitchd" in line for d in re.findall(r",d(\d+)\)", line))


def real_agent_phase(overload_on: bool, seconds: float, meter_rate: int, busy: bool) -> dict:
    """One new-key flood through the real agent on its own OVS (see the module's docstring).
    `busy`: a busy node, the agent and the sender share CPU 1, ovs-vswitchd has CPU 0."""
    marks = AuditConfig().overload
    cluster = new_key_flood_cluster(meter_rate=meter_rate, overload=overload_on,
                                    queue_size=PacketInConfig().policy.queue_size,
                                    marks=(marks.high_mark, marks.peers_mark, marks.low_mark))
    try:
        cluster.start(timeout=120)
        netns, ip = start_flood_pods(cluster)
        counts0, records0 = settled(cluster)
        flows0, meter0 = cluster.controller_flow_packets(), cluster.meter_band_drops()
        socket0 = vswitchd_socket_drops(cluster)
        agent = psutil.Process(cluster.agent.pid)  # type: ignore[union-attr]
        vswitchd = psutil.Process(read_pid(cluster.dir / "ovs" / "ovs-vswitchd.pid"))
        if busy:
            pin_process(agent.pid, {1})
            pin_process(vswitchd.pid, {0})
        a0, v0, t0 = cpu(agent), cpu(vswitchd), time.monotonic()
        sent = send_flood(netns, ip, seconds, port=FIRST_PORT, ports=PORTS, cpus="1" if busy else "")
        elapsed, a1, v1 = time.monotonic() - t0, cpu(agent), cpu(vswitchd)
        counts1, records1 = settled(cluster, timeout=180)
        flows, meter = cluster.controller_flow_packets() - flows0, cluster.meter_band_drops() - meter0
        emitted, before_ovs = flows - meter, vswitchd_socket_drops(cluster) - socket0
        if cluster.agent.poll() is not None:  # type: ignore[union-attr]
            raise RuntimeError(f"the agent exited during the flood:\n{cluster.log()[-3000:]}")
    finally:
        cluster.close()

    def grew(name: str) -> int:
        return int(counts1.get(name, 0) - counts0.get(name, 0))

    records = {k: records1[k] - records0[k] for k in records1}
    in_records, lost_ovs, queue_full = records["packets"], grew("ovs_lost"), grew("dropped_queue_full")
    admission = grew("admission_dropped") - queue_full
    full_detail = records["records"] - records["coarsened_records"]
    return {"consumer": "agent", "overload": "on" if overload_on else "off", "node": "busy" if busy else "shared",
            "seconds": round(elapsed, 3), "frames_sent": sent, "frames_sent_per_s": round(sent / elapsed),
            # Frames never packet-ins: the kernel dropped them at vswitchd's full socket, or a meter band did.
            "frames_dropped_at_vswitchd_socket": before_ovs, "meter_band_dropped": meter,
            "frames_unaccounted_before_ovs": sent - before_ovs - flows,
            "packet_ins_ovs_emitted": emitted, "packet_ins_ovs_emitted_per_s": round(emitted / elapsed),
            "lost_in_ovs_rconn_overflow": lost_ovs, "packet_ins_in_records": in_records,
            "accounted_vs_emitted": round(in_records / emitted, 4) if emitted else None,
            "lost_at_agent_queue_full": queue_full, "admission_dropped": admission,
            "unaccounted": emitted - in_records - lost_ovs - queue_full - admission,
            "records": records["records"], "records_per_s": round(records["records"] / elapsed),
            "coarsened_records": records["coarsened_records"],
            "packet_ins_in_coarsened_records": records["coarsened_packets"],
            "full_detail_records_per_s": round(full_detail / elapsed),
            # Why overload began: spells, those input pressure began, and the full reads behind it.
            "overload_entered": grew("npaudit_audit_overload_entered_total"),
            "overload_entered_by_input_pressure": grew("npaudit_audit_overload_entered_pressed_total"),
            "openflow_reads_pressed": grew("npaudit_openflow_reads_pressed_total"),
            "openflow_reads": grew("npaudit_openflow_reads_total"),
            "agent_cpu_percent": round(100 * (a1 - a0) / elapsed, 1),
            "vswitchd_cpu_percent": round(100 * (v1 - v0) / elapsed, 1)}


def synthetic_flood(path: Path, rate: float, seconds: float, overload_on: bool, pin: bool) -> dict:
    """OVS out of the way: NXT_PACKET_IN2 messages of distinct keys (flood_messages) offered to
    the agent's reader at `rate` per second on the event loop, as the socket would hand them
    over, the consumer sharing the loop."""
    msgs = flood_messages(int(rate * seconds))

    async def main() -> dict:
        writer = AuditWriter(path, backup_count=50)
        writer.start()
        demux, pipeline = agent_path(writer, overload_on)
        reader = PacketInReader(demux.dispatch, lambda raw: None, on_groups=demux.dispatch_groups,
                                coarse=lambda: pipeline.coarse)
        demux.start()
        pipeline.start()
        settle_heap()
        t0 = time.monotonic()
        offered = 0
        while offered < rate * seconds:
            due = min(int((time.monotonic() - t0) * rate), int(rate * seconds)) - offered
            if due > 0:
                reader.on_messages(msgs[offered:offered + due])
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


class _NullWriter:
    """Takes every record (the writer thread is not what the read path figure measures)."""

    def submit(self, record: object) -> bool:
        return True


def flood_messages(n: int) -> list[bytes]:
    """n NXT_PACKET_IN2 of a new-key flood (a new UDP destination port each), as OVS 3.1 sends them."""
    from tests.support.packet_ins import frame, message

    return [message(frame("10.246.0.2", "10.246.0.3", "udp", 1024 + i % 64000, ident=i & 0xFFFF),
                    reg6=RULE_ID + (i // 64000) % 8, ct_tp_dst=1024 + i % 64000) for i in range(n)]


def read_path_cpu(msgs: list[bytes], per_read: int, overload: bool, grouping: bool) -> float:
    """Main-thread CPU µs per packet-in from reads of `per_read` messages to records: reader,
    demux, the policy handler and the pipeline (overload forced to the ports level, or never)."""
    demux = Demux()
    level = Overload(lambda: 0.06 if overload else 0.0, high_mark=0.05, peers_mark=0.25, low_mark=0.01)
    pipeline = AuditPipeline(bench_context(), _NullWriter(), aggregator(window=1.0), overload=level)
    demux.subscribe(Category.POLICY, PolicyPacketIns(lambda msg: 0, audit=pipeline), rate=1e9, burst=1e9,
                    queue_size=1 << 20, now=time.monotonic())
    reader = PacketInReader(demux.dispatch, lambda raw: None, on_groups=demux.dispatch_groups if grouping else None,
                            coarse=lambda: pipeline.coarse)
    reads = [msgs[i:i + per_read] for i in range(0, len(msgs), per_read)]
    drain = demux._drain  # the consumer task's work, without the event loop around it
    sub = demux._subs[Category.POLICY]  # type: ignore[attr-defined]
    settle_heap()
    t0 = time.thread_time()
    for read in reads:
        reader.on_messages(read)
        drain(sub, len(sub.queue))
    spent = time.thread_time() - t0
    if pipeline.stats["packet_ins"] != len(msgs):
        raise RuntimeError(f"read path lost packet-ins: {pipeline.stats['packet_ins']} of {len(msgs)}")
    return round(spent / len(msgs) * 1e6, 3)


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--meter-rate", type=int, default=1_000_000,
                    help="policy_deny meter rate and burst for the real-OVS phases, pps: above OVS's packet-in ceiling")
    ap.add_argument("--synthetic-rate", type=float, default=60000, help="packet-ins/s offered in-process")
    ap.add_argument("--capacity-records", type=int, default=100_000)
    ap.add_argument("--read-path-messages", type=int, default=60000)
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="in-process phases not pinned to CPU 1")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="npab-overload-", dir="/tmp"))
    phases = [real_agent_phase(mode == "on", args.seconds, args.meter_rate, busy)
              for _ in range(args.rounds) for busy in (False, True) for mode in ("off", "on")]
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

    # The read path's CPU per packet-in, same run, alternating, best of three.
    msgs = flood_messages(args.read_path_messages)
    variants = {"full_detail_without_grouping": (False, False), "full_detail_with_grouping_hooks": (False, True),
                "overload_one_by_one": (True, False), "overload_grouped": (True, True)}
    read_path: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(3):
        for name, (overload_on, grouping) in variants.items():
            read_path[name].append(read_path_cpu(msgs, 700, overload_on, grouping))
    read_best = {name: min(v) for name, v in read_path.items()}

    def by_mode(rows: list[dict], field: str, pick: Callable = min) -> dict:
        return {mode: pick(p[field] for p in rows if p["overload"] == mode) for mode in ("off", "on")}

    def real_ovs(rows: list[dict]) -> dict:
        return {"accounted_vs_emitted_worst": by_mode(rows, "accounted_vs_emitted"),
                "emitted_per_s_best": by_mode(rows, "packet_ins_ovs_emitted_per_s", max),
                "rconn_overflow_vs_emitted_worst": {
                    mode: max(round(p["lost_in_ovs_rconn_overflow"] / p["packet_ins_ovs_emitted"], 4) for p in rows
                              if p["overload"] == mode and p["packet_ins_ovs_emitted"]) for mode in ("off", "on")},
                "lost_at_agent_worst": by_mode(rows, "lost_at_agent_queue_full", max),
                "full_detail_records_per_s_best": by_mode(rows, "full_detail_records_per_s", max)}

    summary = {
        **{f"ovs_{node}_node": real_ovs([p for p in phases if p["node"] == node]) for node in ("shared", "busy")},
        "synthetic_accounted_vs_offered_worst": by_mode(synthetic, "accounted_vs_offered"),
        "synthetic_lost_in_agent_queue": by_mode(synthetic, "dropped_queue_full", max),
        "full_detail_records_per_s_in_process_best": {name: max(v) for name, v in capacity.items()},
        "read_path_cpu_us_per_packet_in_best": read_best,
        "read_path_overload_grouped_vs_one_by_one": round(read_best["overload_one_by_one"] /
                                                          read_best["overload_grouped"], 2),
        "read_path_full_detail_hooks_cost_ratio": round(read_best["full_detail_with_grouping_hooks"] /
                                                        read_best["full_detail_without_grouping"], 3),
        "target": ">= 0.99 of emitted packet-ins in records with overload on; 0 lost in the agent; "
                  "rconn_overflow <= 1%; full-detail records/s not below the baseline",
    }

    def met(node: dict) -> bool:
        return (node["accounted_vs_emitted_worst"]["on"] >= 0.99 and node["lost_at_agent_worst"]["on"] == 0
                and node["rconn_overflow_vs_emitted_worst"]["on"] <= 0.01)

    summary["target_met"] = {
        "shared_node_overload_on": met(summary["ovs_shared_node"]),
        "busy_node_overload_on": met(summary["ovs_busy_node"]),
        # Full detail: the grouping hooks' CPU on the read path within 5% of the path without them.
        "full_detail_read_path_within_5_percent": summary["read_path_full_detail_hooks_cost_ratio"] <= 1.05}
    print(json.dumps({"benchmark": "audit_overload", "machine": machine(),
                      "settings": {"seconds": args.seconds, "rounds": args.rounds, "pinned_in_process": args.pin,
                                   "synthetic_rate": args.synthetic_rate,
                                   "real_ovs": {"sender": "tests/support/udp_flood.py, unpaced, a new UDP "
                                                          f"destination port per datagram ({PORTS} ports)",
                                                "policy_deny_meter_pps": args.meter_rate,
                                                "policy_category_rate_burst": "1e9 (opened wide for the run)",
                                                "fair_share": "disabled for the run",
                                                "queues_and_overload_marks": "agent defaults",
                                                "nodes": "shared: no pinning; busy: the agent and the sender "
                                                         "share CPU 1, ovs-vswitchd on CPU 0"}},
                      "phases": phases + synthetic, "summary": summary}, indent=2))
    subprocess.run(["rm", "-rf", str(work)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
