"""`npaudit status` and `npaudit stats`: the running agent's state, and counts over a window of the audit files.

`status` asks the running agent over its local API (one read-only op), which says
whether its eBPF tier runs; when it does not, status probes here (in this process,
on this host) whether it could, since the probe compiles and loads the program and
must not disturb the agent's own output. `stats` counts the
audit files itself (no agent needed) and adds the agent's packet-in counters when
one answers.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

from policy_agent.config import AgentConfig

ApiCall = Callable[[Path, dict[str, Any]], dict[str, Any]]
EbpfProbe = Callable[[], tuple[bool, str]]

EXIT_USAGE = 2
STATUS_HELP = ("the running agent: OpenFlow, OVS, meters, eBPF tier, traces, policy, audit chain head, syslog, "
               "recent problems")
STATS_HELP = ("counts over a window of the audit files (by disposition, policy, rule, Pod), plus the running "
              "agent's packet-in drops, meter drops and packets the eBPF offload dropped")


def add_parser(sub: Any, load_config: Callable[[str | None], AgentConfig]) -> None:
    """Register `npaudit status` and `npaudit stats` on the CLI's subparsers."""
    st = sub.add_parser("status", help=STATUS_HELP, description=STATUS_HELP,
                        epilog="exit status: 0 the agent answered; 1 no agent answers (one line on stderr)")
    st.add_argument("--config", help="the agent's config (for its state_dir, where the API socket is)")
    st.add_argument("-o", "--output", choices=("table", "json"), default="table")
    st.add_argument("--no-ebpf-probe", dest="ebpf_probe", action="store_false",
                    help="skip probing the eBPF tier here (the probe compiles and loads it: a few seconds)")
    st.set_defaults(func=lambda args: run_status(load_config(args.config), args.output,
                                                 probe=_probe_ebpf if args.ebpf_probe else None))
    sa = sub.add_parser("stats", help=STATS_HELP, description=STATS_HELP,
                        epilog="Times: 30s, 10m, 2h, 7d (before now) or RFC 3339. Pods count at either end of a "
                               "record. Agent counters are since the agent started. Exit status 0; 2 for a bad "
                               "time or path.")
    sa.add_argument("paths", nargs="*", type=Path,
                    help="audit files or directories (default: audit.path of --config, else /var/log/npaudit)")
    sa.add_argument("--config", help="the agent's config (for audit.path and the API socket)")
    sa.add_argument("--since", metavar="TIME", help="records at or after TIME (default: all in the files)")
    sa.add_argument("--until", metavar="TIME", help="records at or before TIME")
    sa.add_argument("--top", type=int, default=10, metavar="N", help="table rows per policy, rule and Pod")
    sa.add_argument("-o", "--output", choices=("table", "json"), default="table")
    sa.set_defaults(func=lambda args: run_stats(load_config(args.config), args.paths, since=args.since,
                                                until=args.until, output=args.output, top=args.top,
                                                now=dt.datetime.now(dt.timezone.utc)))


def _probe_ebpf() -> tuple[bool, str]:
    from meters.ebpf.loader import probe

    result = probe()
    return result.ok, result.reason


def _ask_agent(cfg: AgentConfig, api: ApiCall | None) -> tuple[dict[str, Any] | None, str]:
    """The agent's status snapshot, or None and one line saying why there is none."""
    from policy_agent.sources.local_api import STATUS_OP, call

    try:
        reply = (api or call)(cfg.api_socket, {"op": STATUS_OP})
    except OSError as exc:
        return None, (f"no agent answers at {cfg.api_socket} ({exc.strerror or exc}); is `npaudit agent` "
                      "running with this config?")
    except Exception as exc:  # OutcomeUnknown, a bad frame: still one line
        return None, f"agent at {cfg.api_socket}: {exc}"
    status = reply.get("status")
    if not reply.get("ok") or not isinstance(status, dict):
        errors = reply.get("errors") or ["no status in the reply"]
        return None, f"agent at {cfg.api_socket}: {'; '.join(map(str, errors))}"
    return status, ""


# --- status ---

def run_status(cfg: AgentConfig, output: str = "table", *, api: ApiCall | None = None,
               probe: EbpfProbe | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the running agent's status; 1 with one line when no agent answers."""
    out, err = out or sys.stdout, err or sys.stderr
    status, why = _ask_agent(cfg, api)
    if status is None:
        print(f"error: {why}", file=err)
        return 1
    if probe is not None and _get(status, "ebpf", "active") is not True:
        ok, reason = probe()
        status["ebpf"] = {**status.get("ebpf", {}), "probe": {"ok": ok, "reason": reason}}
    if output == "json":
        print(json.dumps(status, indent=2), file=out)
    else:
        print(status_table(status), file=out)
    return 0


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _duration(seconds: float) -> str:
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}d{hours}h" if days else f"{hours}h{minutes:02d}m" if hours else
            f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


def _clock(epoch: Any) -> str:
    if not isinstance(epoch, (int, float)):
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_table(status: dict[str, Any]) -> str:
    """One line per subsystem, then the recent problems; every value from the agent printed safely."""
    from auditlog.query_output import safe_text
    from policy_agent.sources.apply_intent import describe as settlement_line

    agent, of, ovs = status.get("agent") or {}, status.get("openflow") or {}, status.get("ovs") or {}
    supported = _get(status, "meters", "supported")
    meters = ("supported" if supported else "unknown (no OpenFlow connection yet)" if supported is None else
              "NOT supported: packet-ins are limited by the agent's token buckets only")
    ebpf = str(_get(status, "ebpf", "state") or "-")
    probe = _get(status, "ebpf", "probe")
    if isinstance(probe, dict):
        ebpf += "; probe here: " + ("it can run" if probe.get("ok") else f"cannot run ({probe.get('reason')})")
    policy = status.get("policy")
    head = _get(status, "audit", "head")
    rows = [
        ("agent", f"up, pid {agent.get('pid')}, npaudit {agent.get('version')}, node {agent.get('node')}, "
                  f"uptime {_duration(agent.get('uptime_seconds') or 0)} (since {_clock(agent.get('started'))})"),
        ("openflow", f"{'connected' if of.get('connected') else 'NOT connected'} to {of.get('target')}, "
                     f"{of.get('connects')} handshakes"),
        ("ovs", f"{ovs.get('version') or 'version unknown'}, datapath {ovs.get('datapath_type') or '-'}, "
                f"bridge {ovs.get('bridge')} ({ovs.get('mode')})"),
        ("meters", meters),
        ("ebpf", ebpf),
        ("traceflow", _traceflow_line(status.get("traceflow"))),
        ("policy", "not started" if not isinstance(policy, dict) else
         ", ".join(f"{policy.get(k)} {k}" for k in ("tiers", "policies", "rules", "namespaces", "pods"))),
        ("audit", "disabled" if not _get(status, "audit", "enabled") else
         f"{_get(status, 'audit', 'path')}, head seq {_get(head, 'seq')} chain {str(_get(head, 'chain'))[:16]}…"),
        ("syslog", _syslog_line(status.get("syslog") or {})),
        ("apply", settlement_line(status.get("apply_settlement"))),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {safe_text(value)}" for name, value in rows]
    problems = status.get("problems") or []
    lines.append(f"{'problems'.ljust(width)}  {len(problems) or 'none'}{' (newest last)' if problems else ''}")
    for p in problems:
        lines.append(f"  {_clock(p.get('time'))} {safe_text(p.get('level'))} {safe_text(p.get('logger'))}: "
                     f"{safe_text(p.get('message'))}")
    return "\n".join(lines)


def _traceflow_line(traceflow: Any) -> str:
    if not isinstance(traceflow, dict):
        return "-"  # an agent from before traces were counted in its status
    outcomes = {k: n for k, n in (traceflow.get("outcomes") or {}).items() if n}
    runs = (f"{sum(outcomes.values())} traces since start: " + ", ".join(f"{k} {n}" for k, n in outcomes.items())
            if outcomes else "no traces since start")
    return (f"{runs}; {traceflow.get('suppressed', 0)} packet-ins of trace packets suppressed (not audited), "
            f"{traceflow.get('stray', 0)} stray copies")


def _syslog_line(syslog: dict[str, Any]) -> str:
    dests = syslog.get("destinations") or []
    if not dests:
        return "no destinations configured"
    parts = [f"{d.get('destination')} {'connected' if d.get('connected') else 'NOT connected'}, "
             f"backlog {d.get('backlog_records') if d.get('backlog_records') is not None else '-'} records"
             for d in dests]
    return f"{len(dests)} destination{'s' if len(dests) > 1 else ''}: " + "; ".join(parts) + \
        " (npaudit syslog status for more)"


# --- stats ---

@dataclass
class Tally:
    """Records and packets of one group."""

    records: int = 0
    packets: int = 0


@dataclass
class RecordCounts:
    """What `npaudit stats` counts in the audit files."""

    records: int = 0
    packets: int = 0
    offloaded_packets: int = 0
    unreadable: int = 0  # lines that are no JSON object
    # What loss records in the files state went missing: "category reason source" -> count (unit in the key).
    losses: dict[str, int] = field(default_factory=dict)
    first: str | None = None
    last: str | None = None
    by: dict[str, dict[str, Tally]] = field(default_factory=lambda: {k: {} for k in GROUPS})

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "packets": self.packets, "offloaded_packets": self.offloaded_packets,
                "unreadable_lines": self.unreadable, "first": self.first, "last": self.last,
                "losses_stated": dict(sorted(self.losses.items())),
                **{f"by_{kind}": {key: {"records": t.records, "packets": t.packets}
                                  for key, t in _ranked(groups)} for kind, groups in self.by.items()}}


GROUPS = ("disposition", "policy", "rule", "pod")


def _ranked(groups: dict[str, Tally]) -> list[tuple[str, Tally]]:
    return sorted(groups.items(), key=lambda item: (-item[1].records, -item[1].packets, item[0]))


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def _group_keys(record: dict[str, Any]) -> dict[str, list[str]]:
    from auditlog.query import get_field

    ruleset = get_field(record, "rule", "ruleset")
    rule = get_field(record, "rule", "name") or get_field(record, "rule", "id")
    pods = []
    for side in ("source", "destination"):
        pod = get_field(record, "npaudit", side, "pod")
        if isinstance(pod, dict) and pod.get("name"):
            pods.append(f"{pod.get('namespace') or ''}/{pod['name']}".lstrip("/"))
    return {"disposition": [str(get_field(record, "npaudit", "disposition") or "-")],
            "policy": [str(ruleset or "-")],
            "rule": [f"{ruleset or '-'} {rule or '-'}"],
            "pod": sorted(set(pods))}


def count_records(matches: Iterable[tuple[bytes, dict[str, Any] | None]]) -> RecordCounts:
    """Counts of the matching lines (raw, record if parsed) of `LogReader.select`."""
    import orjson

    from auditlog.loss_records import is_loss_record
    from auditlog.query import get_field, record_time

    counts = RecordCounts()
    for raw, record in matches:
        if record is None:
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = None
        if not isinstance(record, dict):
            counts.unreadable += 1
            continue
        if is_loss_record(record):  # not a record of traffic: what the trail says it is missing
            _count_losses(counts.losses, record)
            continue
        packets = _int(get_field(record, "npaudit", "aggregate", "packets"))
        counts.records += 1
        counts.packets += packets
        counts.offloaded_packets += _int(get_field(record, "npaudit", "aggregate", "offloaded_packets"))
        stamp = record_time(raw, record)
        if stamp is not None:
            counts.first = stamp if counts.first is None or stamp < counts.first else counts.first
            counts.last = stamp if counts.last is None or stamp > counts.last else counts.last
        for kind, keys in _group_keys(record).items():
            for key in keys:
                tally = counts.by[kind].setdefault(key, Tally())
                tally.records += 1
                tally.packets += packets
    return counts


def _count_losses(losses: dict[str, int], record: dict[str, Any]) -> None:
    from auditlog.query import get_field

    items = get_field(record, "npaudit", "loss", "by_reason")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            key = " ".join(str(item.get(k, "-")) for k in ("category", "reason", "source", "unit"))
            losses[key] = losses.get(key, 0) + _int(item.get("count"))


def agent_counters(status: dict[str, Any]) -> dict[str, Any]:
    """The packet-in part of an agent status, as `npaudit stats` shows it (counts since the agent started)."""
    by_category = _get(status, "packetin", "by_category") or {}
    return {
        "uptime_seconds": _get(status, "agent", "uptime_seconds"),
        "admission_drops": {cat: {k: n for k, n in counts.items() if k.startswith("dropped_")}
                            for cat, counts in by_category.items() if isinstance(counts, dict)},
        "ovs_lost": _get(status, "packetin", "ovs_lost"),
        "meter_drops": _get(status, "packetin", "meter_drops"),
        "offload": {"active": _get(status, "ebpf", "active"), "state": _get(status, "ebpf", "state"),
                    "offloaded_packets": _get(status, "ebpf", "offloaded_packets")},
    }


def run_stats(cfg: AgentConfig, paths: list[Path], *, since: str | None, until: str | None, output: str,
              now: dt.datetime, top: int = 10, api: ApiCall | None = None, out: TextIO | None = None,
              err: TextIO | None = None) -> int:
    """Count the audit files over the window, add the agent's counters if it answers, print table or JSON."""
    from auditlog.fileset import DEFAULT_BASE
    from auditlog.logread import LogReader
    from auditlog.query import Query, QueryError, format_timestamp, parse_time

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
            counts = count_records(reader.select(query))
            notes = list(reader.notes)
    except (QueryError, OSError) as exc:
        where = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else exc
        print(f"npaudit stats: {where}", file=err)
        return EXIT_USAGE
    for note in notes:
        print(f"npaudit stats: note: {note}", file=err)
    status, why = _ask_agent(cfg, api)
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
    from auditlog.query_output import safe_text

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
    lines.append("")
    lines.append("losses stated by loss records in the files: "
                 + (", ".join(f"{safe_text(k)} {n}" for k, n in stated.items()) or "none"))
    lines.append("")
    agent = report.get("agent")
    if agent is None:
        lines.append(f"agent    not reached, file counts only: {safe_text(agent_note)}")
        return "\n".join(lines)
    lines.append(f"agent    counters since it started {_duration(agent.get('uptime_seconds') or 0)} ago")
    for cat, drops in sorted(agent["admission_drops"].items()):
        lines.append(f"  packet-in admission drops ({safe_text(cat)}): "
                     + (", ".join(f"{k} {n}" for k, n in sorted(drops.items())) or "none"))
    lost = agent.get("ovs_lost") or {}
    lines.append("  packet-ins OVS dropped before sending: "
                 + (", ".join(f"{k} {'-' if n is None else n}" for k, n in sorted(lost.items())) or "-"))
    meter = agent.get("meter_drops")
    shown = ("not read (no datapath meters, or no reading yet)" if meter is None else
             ", ".join(f"{safe_text(m)} {d.get('packets')} ({d.get('bytes')} bytes)"
                       for m, d in sorted(meter.items())) or "-")
    lines.append(f"  packet-ins OVS meters dropped: {shown}")
    offload = agent.get("offload") or {}
    lines.append(f"  packets the eBPF offload dropped before OVS: {offload.get('offloaded_packets', '-')}"
                 + ("" if offload.get("active") else f" (offload not active: {safe_text(offload.get('state'))})"))
    return "\n".join(lines)
