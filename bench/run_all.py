#!/usr/bin/env python3
"""Run every bench and write bench/RESULTS.md: machine facts, the headline same-run ratios, each bench's JSON.

Every bench/*.py whose name does not start with "_" (and is not this file) is a
bench: it is run with its defaults, one after another, and its stdout's last
JSON document is its result. A bench that fails, times out or prints no JSON is
listed as such with the end of its stderr; the others still run. Exit status 1
if any bench failed. The page says when and where it was measured and whether
the machine was busy (load average before and after): the figures are only
comparable within one run, which is why every bench measures its own baseline.
Run as root: `make bench` (or `.venv/bin/python bench/run_all.py --only pod_throughput`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

BENCH_DIR = Path(__file__).resolve().parent
# The figures issue 14 asks for, where a bench states them (path components; "*" matches any key).
HEADLINES: dict[str, list[tuple[str, str]]] = {
    "packetin_throughput": [("packet-ins delivered vs OVS ceiling ({1})", "summary.*.agent_vs_ceiling")],
    "auditlog_throughput": [
        ("records/s, distinct flows", "summary.distinct_flows.records_per_s"),
        ("records/s, distinct flows, one packet-in per frame", "summary.distinct_flows_one_per_frame.records_per_s"),
        ("aggregated flood: packets accounted vs OVS ceiling", "summary.aggregated_flood.accounted_vs_ceiling"),
        ("packet to record latency p50 ms, writer {2}", "summary.latency.*.end_to_end.p50_ms"),
        ("packet to record latency p99 ms, writer {2}", "summary.latency.*.end_to_end.p99_ms"),
        ("packet to bare reader (floor) p99 ms", "summary.latency.floor_bare_reader.sent_to_read.p99_ms"),
        ("agent part (read -> written) p99 ms, writer {2}", "summary.latency.*.agent_read_to_written.p99_ms"),
        ("packet to record latency target met", "summary.latency.target_met"),
        ("records/s, writer inline path / thread only",
         "summary.capacity_writer_ab.inline_vs_thread_only_records_per_s_best"),
        ("CPU per record, writer inline path / thread only",
         "summary.capacity_writer_ab.inline_vs_thread_only_cpu_seconds_best")],
    "cni_latency": [("CNI ADD agent-side p99 ms, {1}", "against_targets.agent_side_add_p99_ms_at_*.measured"),
                    ("CNI ADD agent-side p99 target met, {1}", "against_targets.agent_side_add_p99_ms_at_*.met"),
                    ("npaudit apply of a one-rule change at 1,000 rules, wall p50 ms",
                     "against_targets.one_rule_change_apply_wall_p99_ms.p50"),
                    ("npaudit apply of a one-rule change at 1,000 rules, wall p99 ms",
                     "against_targets.one_rule_change_apply_wall_p99_ms.measured"),
                    ("npaudit apply of a one-rule change at 1,000 rules, wall p99 <= 200 ms met",
                     "against_targets.one_rule_change_apply_wall_p99_ms.met"),
                    ("one-rule change at 1,000 rules, agent side p99 ms",
                     "against_targets.one_rule_change_agent_side_p99_ms.measured")],
    "cli_startup": [("start-up wall ms, {1} (median)", "median_wall_ms.python_floor"),
                    ("start-up wall ms, {1} (median)", "median_wall_ms.version"),
                    ("start-up wall ms, {1} (median)", "median_wall_ms.*_agent"),
                    ("start-up CPU ms above a bare interpreter's, {1} (median)", "cpu_over_floor_ms.*_agent"),
                    ("slowest command above the floor", "slowest_over_floor")],
    "cni_state_fsync": [("CNI state write waited for by ADD, now / before ({1})", "ratio_current_to_baseline.*")],
    "xdp_offload": [("flood: vswitchd CPU without / with the eBPF tier entry",
                     "vswitchd_cpu_ratio_no_entry_over_with_entry"),
                    ("flood: vswitchd CPU % ({1})", "vswitchd_cpu_percent.*")],
    "syslog_throughput": [("syslog forwarder keeps up with the pipeline's distinct-flow rate ({2})",
                           "summary.keeps_up.*"),
                          ("syslog steady delivered / written records/s ({1})",
                           "sustained.*.steady_delivered_vs_written"),
                          ("syslog, rsyslogd on the same 2 cores: delivered / written ({1})",
                           "sustained_rsyslog_on_node.*.steady_delivered_vs_written"),
                          ("syslog, rsyslogd on the same 2 cores: CPU cores busy ({1})",
                           "sustained_rsyslog_on_node.*.cpu_cores_busy"),
                          ("syslog forwarder CPU s per 100k records following one plain file ({1})",
                           "capacity_one_file.*.forwarder_cpu_s_per_100k")],
    "pod_throughput": [("TCP between Pods: logging on vs off", "logging_on_vs_off_ratio"),
                       ("TCP between Pods Mbit/s ({1})", "mbit_per_s_median.*"),
                       ("TCP between Pods: >= 0.95 met", "target_met")],
    "flow_encoder": [("flow_mod encoding os-ken / ours ({0})", "*.ratio")],
    "fuzz": [("fuzz cases, {1}", "targets.*.cases"), ("fuzz uncaught exception, {1}", "targets.*.failure")],
    "meter_accuracy": [("OVS meter: delivered / configured rate at {1} pps", "ratio_by_rate.*"),
                       ("OVS meter within 2% at {1} pps", "within_2_percent.*")],
    "flood": [("flood: vswitchd CPU offload off / on", "vswitchd_cpu_ratio_off_over_on"),
              ("flood: quiet Pod ping p99 during / without flood ({1})", "runs.*.quiet_ping.p99_ratio"),
              ("flood: frames unaccounted ({1})", "runs.*.accounting.unaccounted")],
    "audit_overload": [("overload: packet-ins in records / emitted by OVS, worst ({1}, overload {3})",
                        "summary.*.accounted_vs_emitted_worst.*"),
                       ("overload: packet-ins lost in the agent's queue, real OVS ({1}, overload {3})",
                        "summary.*.lost_at_agent_worst.*"),
                       ("overload: packet-ins lost in the agent's queue, synthetic (overload {2})",
                        "summary.synthetic_lost_in_agent_queue.*"),
                       ("overload: full-detail records/s in process ({2})",
                        "summary.full_detail_records_per_s_in_process_best.*")],
    "traceflow_latency": [("trace client p99 ms ({1})", "targets.*.client_p99_ms"),
                          ("trace p99 target met ({1})", "targets.*.met"),
                          ("trace across nodes: client p99 vs one node, same cluster",
                           "cross_node.client_p99_vs_same_node")],
    "megaflow_purge": [("megaflow purge p50 ms, {1} megaflows", "purge.*.purge_ms.p50"),
                       ("baseline: unixctl round trip p50 ms", "baseline_unixctl_version_ms.p50")],
    "agent_cpu": [("agent CPU us per packet-in at {2} distinct pps", "summary.by_rate.*.agent_us_per_packet_in"),
                  ("bare OpenFlow reader (floor) CPU us per packet-in at {2} pps",
                   "summary.by_rate.*.floor_us_per_packet_in"),
                  ("agent / floor CPU per packet-in at {2} pps", "summary.by_rate.*.agent_vs_floor"),
                  ("packet-ins in records / emitted at {2} pps", "summary.by_rate.*.in_records_vs_emitted"),
                  ("packet-ins at full detail (not in coarsened records) at {2} pps",
                   "summary.by_rate.*.full_detail_fraction")],
    "agent_latency": [("17 pps: sender -> record readable through the real agent, p50 / p99 ms",
                       "agent.sent_to_readable.p[59][09]_ms"),
                      ("17 pps: sender -> line readable, bare reader appending (floor), p50 / p99 ms",
                       "floor_bare_reader_appending.sent_to_readable.p[59][09]_ms")],
    "gzip_codec": [("gzip of a rotated audit file: CPU us per record, {1}", "codecs.*.us_per_record_min")],
    "agent_path": [("in-process packet-in -> record CPU us per packet-in, {1} a read",
                    "by_per_read.*.this.us_per_packet_in_min")],
    "cold_calls": [("a lone record's step {1} after a 58 ms quiet spell, median us", "median_us.*.cold"),
                   ("the same step {1} back to back, median us", "median_us.*.warm")],
    "cluster_scale": [("cross-node TCP: logging on vs off", "throughput.cross_node_logging_on_vs_off_ratio"),
                      ("cross-node TCP: logging on vs off, adjacent pairs {3}",  # the spread: q1, q3, min, max
                       "throughput.logging_on_vs_off_adjacent_pairs.cross_node.q[13]"),
                      ("cross-node TCP: logging on vs off, adjacent pairs {3}",
                       "throughput.logging_on_vs_off_adjacent_pairs.cross_node.m[ai][nx]"),
                      ("cross-node TCP per CPU-second: logging on vs off",
                       "throughput.logging_on_vs_off_per_cpu_second_adjacent_pairs.cross_node.median"),
                      ("TCP cross-node / same-node (logging off)", "throughput.cross_node_vs_same_node_ratio"),
                      ("TCP Mbit/s ({2})", "throughput.mbit_per_s_median.*"),
                      ("policy change in force on all nodes p99 ms ({2})",
                       "propagation.in_force_on_all_nodes_p99_ms.*"),
                      ("agent RSS MB, 10k Pods and 1k policies listed", "rss.rss_mb"),
                      ("CNI ADD agent-side p99 ms ({2})", "cni_add.agent_side_p99_ms.*"),
                      ("target met ({1})", "targets_met.*")],
    "soak_flood": [("soak: agent RSS max MB", "rss_mb.max"),
                   ("soak: packet-ins received - admitted - dropped", "accounting.agent.difference"),
                   ("soak: OVS sent - lost in OVS - agent received", "accounting.ovs_vs_agent.difference"),
                   ("soak: targets met", "targets_met")],
}
# For benches not listed above: leaves (outside per-phase lists) whose key says it is a comparison.
GENERIC_KEYS = ("*ratio*", "*_vs_*", "vs_*", "*target_met*", "meets_target", "*accuracy*", "*error*percent*")
GENERIC_MAX = 12


def benches(directory: Path) -> list[Path]:
    """The benches in `directory`: public *.py files, this runner excluded, by name."""
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith("_") and p.name != "run_all.py")


def last_json(text: str) -> Any:
    """The last JSON document in `text` that runs to its end (benches print one, maybe after progress lines)."""
    decoder = json.JSONDecoder()
    stripped = text.rstrip()
    starts = [0] + [i + 1 for i, ch in enumerate(stripped) if ch == "\n"]
    for start in starts:  # the first line start from which the rest is one document
        if stripped[start:start + 1] not in ("{", "["):
            continue
        try:
            value, end = decoder.raw_decode(stripped, start)
        except ValueError:
            continue
        if end == len(stripped):
            return value
    raise ValueError("no JSON document at the end of the output")


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, value) of every non-container in nested dicts; lists are not entered (per-phase samples)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, path + (str(key),))
    elif not isinstance(value, list):
        yield path, value


def headlines(name: str, result: Any) -> list[tuple[str, Any]]:
    """The (label, value) figures of one bench's result."""
    found: list[tuple[str, Any]] = []
    if name in HEADLINES:
        for label, pattern in HEADLINES[name]:
            parts = pattern.split(".")
            for path, value in leaves(result):
                if len(path) == len(parts) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(path, parts)):
                    found.append((label.format(*path), value))
        return found
    for path, value in leaves(result):
        if any(fnmatch.fnmatchcase(path[-1], pat) for pat in GENERIC_KEYS) and len(found) < GENERIC_MAX:
            found.append((".".join(path), value))
    return found


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        ovs = subprocess.run(["ovs-vswitchd", "--version"], capture_output=True, text=True,
                             timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        ovs = "not installed"
    return {"cpu_model": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "os": _os_name(), "ovs": ovs, "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def _os_name() -> str:
    try:
        return next(line.split("=", 1)[1].strip('"') for line in Path("/etc/os-release").read_text().splitlines()
                    if line.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        return platform.system()


def run_bench(path: Path, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    entry: dict[str, Any] = {"name": path.stem, "command": f"{Path(sys.executable).name} bench/{path.name}"}
    print(f"run_all: {path.stem} ...", file=sys.stderr, flush=True)
    try:
        res = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                             cwd=path.parent.parent)
        out, err, code = res.stdout, res.stderr, res.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")) \
            + f"\ntimed out after {timeout:.0f}s"
        code = None
    entry.update(exit_code=code, seconds=round(time.monotonic() - started, 1))
    try:
        entry["result"] = last_json(out)
    except ValueError as exc:
        entry["error"] = str(exc)
    if code != 0 or "result" not in entry:
        entry["stderr_tail"] = "\n".join(err.strip().splitlines()[-15:])
    print(f"run_all: {path.stem}: exit {code} in {entry['seconds']}s", file=sys.stderr, flush=True)
    return entry


def _fmt(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def render(facts: dict[str, Any], entries: list[dict[str, Any]], started: str, note: str) -> str:
    lines = ["# npaudit benchmark results", "",
             f"Generated by `bench/run_all.py` (`make bench`) on {started}. {note}".rstrip(), "",
             "Figures are comparable within this run only: each bench measures its own baseline "
             "(the OVS ceiling, the raw consumer, the writer alone, logging off) beside its figure.", "",
             "## Machine", "", "| fact | value |", "|---|---|"]
    lines += [f"| {key.replace('_', ' ')} | {_fmt(value)} |" for key, value in facts.items()]
    lines += ["", "## Same-run figures", "", "| bench | figure | value |", "|---|---|---|"]
    for entry in entries:
        if "result" not in entry or entry["exit_code"] != 0:
            lines.append(f"| {entry['name']} | **failed** (exit {entry['exit_code']}) | see below |")
            continue
        figures = headlines(entry["name"], entry["result"]) or [("(no comparison figure in its JSON)", "-")]
        lines += [f"| {entry['name']} | {label} | {_fmt(value)} |" for label, value in figures]
    for entry in entries:
        lines += ["", f"## {entry['name']}", "",
                  f"`{entry['command']}`: exit {entry['exit_code']}, {entry['seconds']} s", ""]
        if "result" in entry:
            lines += ["```json", json.dumps(entry["result"], indent=2), "```"]
        if "error" in entry:
            lines.append(f"No result: {entry['error']}.")
        if entry.get("stderr_tail"):
            lines += ["", "stderr (end):", "", "```", entry["stderr_tail"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=BENCH_DIR / "RESULTS.md")
    ap.add_argument("--only", default="", help="comma-separated bench names to run (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated bench names not to run")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per bench")
    ap.add_argument("--note", default="", help="a sentence for the header (e.g. that the machine was shared)")
    args = ap.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    skip = {n for n in args.skip.split(",") if n}
    found = benches(args.bench_dir)
    unknown = (only | skip) - {p.stem for p in found}
    if unknown:
        print(f"run_all: no such bench: {', '.join(sorted(unknown))} (have: {', '.join(p.stem for p in found)})",
              file=sys.stderr)
        return 2
    chosen = [p for p in found if (not only or p.stem in only) and p.stem not in skip]
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    facts = machine()
    entries = [run_bench(path, args.timeout) for path in chosen]
    facts["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.write_text(render(facts, entries, started, args.note))
    failed = [e["name"] for e in entries if e["exit_code"] != 0 or "result" not in e]
    print(f"run_all: wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
