"""`npaudit status`: the running agent's state.

It asks the running agent over its local API (one read-only op), which says
whether its eBPF tier runs; when it does not and --probe-kernel asks, status probes
here (in this process, on this host) whether it could: the probe compiles and loads
the program (seconds, most of what `status` took when it probed by default) and must
not disturb the agent's own output.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any, Callable, TextIO

from policy_agent.cli.common import CONFIG_HELP, ApiCall, agent_address, ask_status, dig, duration

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing's names here
if TYPE_CHECKING:
    from policy_agent.config.client import AgentAddress
    from policy_agent.config.loader import AgentConfig

EbpfProbe = Callable[[], tuple[bool, str]]

HELP = ("the running agent: OpenFlow, OVS, meters, eBPF tier, traces, policy, audit chain head, syslog, "
        "recent problems")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    st = sub.add_parser("status", help=HELP, description=HELP,
                        epilog="exit status: 0 the agent answered; 1 no agent answers (one line on stderr)")
    st.add_argument("--config", help=f"the agent's config (for its state_dir, where the API socket is) {CONFIG_HELP}")
    st.add_argument("-o", "--output", choices=("table", "json"), default="table")
    st.add_argument("--probe-kernel", dest="ebpf_probe", action="store_true",
                    help="when the agent's eBPF tier does not run, find out here whether it could (compiles "
                         "and loads the XDP program: a few seconds)")
    st.add_argument("--no-ebpf-probe", dest="ebpf_probe", action="store_false",
                    help="no probe (the default now; kept for scripts that pass it)")
    st.set_defaults(func=lambda args: run_status(agent_address(args.config), args.output,
                                                 probe=_probe_ebpf if args.ebpf_probe else None))


def _probe_ebpf() -> tuple[bool, str]:
    from meters.ebpf.loader import probe

    result = probe()
    return result.ok, result.reason


def run_status(cfg: AgentAddress | AgentConfig, output: str = "table", *, api: ApiCall | None = None,
               probe: EbpfProbe | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the running agent's status; 1 with one line when no agent answers."""
    out, err = out or sys.stdout, err or sys.stderr
    status, why = ask_status(cfg, api)
    if status is None:
        print(f"error: {why}", file=err)
        return 1
    if probe is not None and dig(status, "ebpf", "active") is not True:
        ok, reason = probe()
        status["ebpf"] = {**status.get("ebpf", {}), "probe": {"ok": ok, "reason": reason}}
    if output == "json":
        print(json.dumps(status, indent=2), file=out)
    else:
        print(status_table(status), file=out)
    return 0


def _clock(epoch: Any) -> str:
    if not isinstance(epoch, (int, float)):
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_table(status: dict[str, Any]) -> str:
    """One line per subsystem, then the recent problems; every value from the agent printed safely."""
    from auditlog.safe_text import safe_text
    from policy_agent.sources.apply_outcome import describe as settlement_line

    agent, of, ovs = status.get("agent") or {}, status.get("openflow") or {}, status.get("ovs") or {}
    supported = dig(status, "meters", "supported")
    meters = ("supported" if supported else "unknown (no OpenFlow connection yet)" if supported is None else
              "NOT supported: packet-ins are limited by the agent's token buckets only")
    ebpf = str(dig(status, "ebpf", "state") or "-")
    probe = dig(status, "ebpf", "probe")
    if isinstance(probe, dict):
        ebpf += "; probe here: " + ("it can run" if probe.get("ok") else f"cannot run ({probe.get('reason')})")
    policy = status.get("policy")
    head = dig(status, "audit", "head")
    rows = [
        ("agent", f"up, pid {agent.get('pid')}, npaudit {agent.get('version')}, node {agent.get('node')}, "
                  f"uptime {duration(agent.get('uptime_seconds') or 0)} (since {_clock(agent.get('started'))})"),
        ("openflow", f"{'connected' if of.get('connected') else 'NOT connected'} to {of.get('target')}, "
                     f"{of.get('connects')} handshakes"),
        ("ovs", f"{ovs.get('version') or 'version unknown'}, datapath {ovs.get('datapath_type') or '-'}, "
                f"bridge {ovs.get('bridge')} ({ovs.get('mode')})"),
        ("meters", meters),
        ("ebpf", ebpf),
        ("traceflow", _traceflow_line(status.get("traceflow"))),
        ("policy", "not started" if not isinstance(policy, dict) else
         ", ".join(f"{policy.get(k)} {k}" for k in ("tiers", "policies", "rules", "namespaces", "pods"))),
        ("audit", "disabled" if not dig(status, "audit", "enabled") else
         f"{dig(status, 'audit', 'path')}, head seq {dig(head, 'seq')} chain {str(dig(head, 'chain'))[:16]}…"),
        ("syslog", _syslog_line(status.get("syslog") or {})),
        ("apply", settlement_line(status.get("apply_settlement"))),
        ("nodes", _nodes_line(status.get("nodes"))),
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
    crossnode = (f"; other nodes' traces run here {traceflow.get('received', 0)}, their reports taken "
                 f"{traceflow.get('reports', 0)}") if traceflow.get("received") or traceflow.get("reports") else ""
    return (f"{runs}; {traceflow.get('suppressed', 0)} packet-ins of trace packets suppressed (not audited), "
            f"{traceflow.get('stray', 0)} stray copies{crossnode}")


def _nodes_line(nodes: Any) -> str:
    if not isinstance(nodes, dict):
        return "-"  # an agent from before it knew other nodes
    problems = nodes.get("problems") or []
    line = (f"this node's Pod subnet {nodes.get('subnet') or 'not known yet'}; "
            f"{nodes.get('count', 0)} other nodes routed")
    if problems:
        line += f"; {len(problems)} node problems: " + "; ".join(
            f"{p.get('node')}: {p.get('reason')}" for p in problems if isinstance(p, dict))
    if nodes.get("pods_outside"):
        line += f"; {nodes.get('pods_outside')} Pods with an address outside every node's subnet"
    return line


def _syslog_line(syslog: dict[str, Any]) -> str:
    dests = syslog.get("destinations") or []
    if not dests:
        return "no destinations configured"
    parts = [f"{d.get('destination')} {'connected' if d.get('connected') else 'NOT connected'}, "
             f"backlog {d.get('backlog_records') if d.get('backlog_records') is not None else '-'} records"
             for d in dests]
    return f"{len(dests)} destination{'s' if len(dests) > 1 else ''}: " + "; ".join(parts) + \
        " (npaudit syslog status for more)"
