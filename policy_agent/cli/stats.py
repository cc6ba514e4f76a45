"""`npaudit stats`: counts over a window of the audit files (auditlog/stats.py counts), plus the running agent's
packet-in counters when one answers (no agent needed for the file counts)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from policy_agent.cli.common import CONFIG_HELP, ApiCall, ask_status, dig, duration, load_config

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing's names here
if TYPE_CHECKING:
    from policy_agent.config.loader import AgentConfig

EXIT_USAGE = 2
HELP = ("counts over a window of the audit files (by disposition, policy, rule, Pod), plus the running "
        "agent's packet-in drops, meter drops and packets the eBPF offload dropped")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sa = sub.add_parser("stats", help=HELP, description=HELP,
                        epilog="Times: 30s, 10m, 2h, 7d (before now) or RFC 3339. Pods count at either end of a "
                               "record. Agent counters are since the agent started. Exit status 0; 2 for a bad "
                               "time or path.")
    sa.add_argument("paths", nargs="*", type=Path,
                    help="audit files or directories (default: audit.path of the config, else /var/log/npaudit)")
    sa.add_argument("--config", help=f"the agent's config (for audit.path and the API socket) {CONFIG_HELP}")
    sa.add_argument("--since", metavar="TIME", help="records at or after TIME (default: all in the files)")
    sa.add_argument("--until", metavar="TIME", help="records at or before TIME")
    sa.add_argument("--rule", metavar="RULE",
                    help="only the records of RULE (its rule.id, its name, or \"ruleset name\" as the rule table "
                         "shows it), with what loss records state it lost: packets that hit it = packets in its "
                         "records + its stated loss")
    sa.add_argument("--top", type=int, default=10, metavar="N", help="table rows per policy, rule and Pod")
    sa.add_argument("-o", "--output", choices=("table", "json"), default="table")
    sa.set_defaults(func=lambda args: run_stats(load_config(args.config), args.paths, since=args.since,
                                                until=args.until, output=args.output, top=args.top, rule=args.rule,
                                                now=dt.datetime.now(dt.timezone.utc)))


def agent_counters(status: dict[str, Any]) -> dict[str, Any]:
    """The packet-in part of an agent status, as `npaudit stats` shows it (counts since the agent started)."""
    by_category = dig(status, "packetin", "by_category") or {}
    return {
        "uptime_seconds": dig(status, "agent", "uptime_seconds"),
        "admission_drops": {cat: {k: n for k, n in counts.items() if k.startswith("dropped_")}
                            for cat, counts in by_category.items() if isinstance(counts, dict)},
        "ovs_lost": dig(status, "packetin", "ovs_lost"),
        "meter_drops": dig(status, "packetin", "meter_drops"),
        "offload": {"active": dig(status, "ebpf", "active"), "state": dig(status, "ebpf", "state"),
                    "offloaded_packets": dig(status, "ebpf", "offloaded_packets")},
    }


def run_stats(cfg: AgentConfig, paths: list[Path], *, since: str | None, until: str | None, output: str,
              now: dt.datetime, top: int = 10, api: ApiCall | None = None, out: TextIO | None = None,
              err: TextIO | None = None, rule: str | None = None) -> int:
    """Count the audit files over the window, add the agent's counters if it answers, print table or JSON."""
    from auditlog.fileset import DEFAULT_BASE
    from auditlog.logread import LogReader
    from auditlog.query import Query, QueryError, format_timestamp, parse_time
    from auditlog.stats import count_records

    out, err = out or sys.stdout, err or sys.stderr
    base = DEFAULT_BASE
    if not paths:
        live = Path(cfg.audit.path)
        paths, base = [live.parent], live.name
    try:
        start = parse_time("--since", since, now) if since is not None else None
        end = parse_time("--until", until, now) if until is not None else None
        query = Query(since=start, until=end)
        with LogReader(paths, base) as reader:
            counts = count_records(reader.select(query), rule=rule)
            notes = list(reader.notes)
    except (QueryError, OSError) as exc:
        where = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else exc
        print(f"npaudit stats: {where}", file=err)
        return EXIT_USAGE
    for note in notes:
        print(f"npaudit stats: note: {note}", file=err)
    status, why = ask_status(cfg, api)
    report = {"window": {"since": format_timestamp(start) if start else None,
                         "until": format_timestamp(end) if end else None},
              "files": counts.to_json(),
              "agent": agent_counters(status) if status is not None else None}
    if output == "json":
        print(json.dumps(report, indent=2), file=out)
    else:
        print(stats_table(report, top=top, agent_note=why), file=out)
    return 0


def stats_table(report: dict[str, Any], *, top: int = 10, agent_note: str = "") -> str:
    """The report as aligned sections: totals, each grouping's top rows, then the agent's counters."""
    from auditlog.safe_text import safe_text

    from auditlog.stats import GROUPS

    files, window = report["files"], report["window"]
    lines = [f"window   {window['since'] or 'start of the files'} .. {window['until'] or 'now'}"
             f"  (records {files['first'] or '-'} .. {files['last'] or '-'})",
             f"records  {files['records']}, packets {files['packets']}, offloaded packets "
             f"{files['offloaded_packets']}" + (f", unreadable lines {files['unreadable_lines']}"
                                                if files["unreadable_lines"] else "")]
    for kind in GROUPS:
        groups = list(files[f"by_{kind}"].items())
        shown = groups if kind == "disposition" else groups[:max(top, 0)]
        rows = [(kind.upper(), "RECORDS", "PACKETS")] + [(safe_text(k), str(v["records"]), str(v["packets"]))
                                                        for k, v in shown]
        width = max(len(r[0]) for r in rows)
        lines.append("")
        lines += [f"{r[0].ljust(width)}  {r[1].rjust(8)}  {r[2].rjust(9)}" for r in rows]
        if len(groups) > len(shown):
            lines.append(f"... {len(groups) - len(shown)} more (--top, or -o json for all)")
    stated = files.get("losses_stated") or {}
    account = files.get("rule")
    if account is not None:
        lines.append("")
        lines.append(f"rule {safe_text(account['selector'])}: packets that hit it {account['packets_hit']} = "
                     f"{account['packets_in_records']} in its records + {account['stated_loss']} stated lost "
                     f"(rules: {', '.join(safe_text(r) for r in account['rules']) or 'none found'})")
    lines.append("")
    lines.append("losses stated by loss records in the files: "
                 + (", ".join(f"{safe_text(k)} {n}" for k, n in stated.items()) or "none"))
    by_rule = files.get("rule_losses_stated") or {}
    if by_rule and account is None:
        lines.append("  the same losses by logged rule (packets its flows matched that no record holds): "
                     + ", ".join(f"{safe_text(k)} {n}" for k, n in by_rule.items()))
    lines.append("")
    agent = report.get("agent")
    if agent is None:
        lines.append(f"agent    not reached, file counts only: {safe_text(agent_note)}")
        return "\n".join(lines)
    lines.append(f"agent    counters since it started {duration(agent.get('uptime_seconds') or 0)} ago")
    for cat, drops in sorted(agent["admission_drops"].items()):
        lines.append(f"  packet-in admission drops ({safe_text(cat)}): "
                     + (", ".join(f"{k} {n}" for k, n in sorted(drops.items())) or "none"))
    lost = agent.get("ovs_lost") or {}
    lines.append("  packet-ins OVS dropped before sending: "
                 + (", ".join(f"{k} {'-' if n is None else n}" for k, n in sorted(lost.items())) or "-"))
    meter = agent.get("meter_drops")
    dropped = ("not read (no datapath meters, or no reading yet)" if meter is None else
               ", ".join(f"{safe_text(m)} {d.get('packets')} ({d.get('bytes')} bytes)"
                         for m, d in sorted(meter.items())) or "-")
    lines.append(f"  packet-ins OVS meters dropped: {dropped}")
    offload = agent.get("offload") or {}
    lines.append(f"  packets the eBPF offload dropped before OVS: {offload.get('offloaded_packets', '-')}"
                 + ("" if offload.get("active") else f" (offload not active: {safe_text(offload.get('state'))})"))
    return "\n".join(lines)
