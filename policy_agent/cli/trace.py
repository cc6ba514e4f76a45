"""`npaudit trace`: ask the running agent to trace one packet and print the path and what decided it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from policy_agent.cli.common import CONFIG_HELP, ApiCall, agent_address

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing's names here
if TYPE_CHECKING:
    from policy_agent.config.client import AgentAddress
    from policy_agent.config.loader import AgentConfig


EXIT_DELIVERED, EXIT_STOPPED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_NOT_RUN = 0, 1, 2, 3, 4
_EXIT = {"delivered": EXIT_DELIVERED, "forwarded": EXIT_DELIVERED, "dropped": EXIT_STOPPED, "rejected": EXIT_STOPPED,
         "unknown-destination": EXIT_STOPPED, "timeout": EXIT_TIMEOUT, "no-report": EXIT_TIMEOUT}
HELP = "trace one packet from a Pod through the OVS pipeline: each table, the deciding rule, the outcome"
EPILOG = ("exit status: 0 delivered (or forwarded to the node gateway); 1 dropped, rejected or unknown destination; "
          "2 usage error or unknown Pod; 3 timeout, or the destination's node did not report its part; 4 the trace "
          "could not run (no agent, switch error). A Pod of another node (Geneve): the packet crosses the tunnel, "
          "that node's agent traces it and reports back; both nodes' observations are shown")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trace", help=HELP, description=HELP + ". The packet is tagged, never delivered, "
                       "creates no conntrack state and no audit record.", epilog=EPILOG)
    p.add_argument("--from", dest="source", required=True, metavar="NS/POD", help="the source Pod")
    p.add_argument("--to", dest="destination", required=True, metavar="NS/POD|IP", help="destination Pod or IPv4")
    p.add_argument("--protocol", choices=("tcp", "udp", "icmp", "sctp"), default="tcp")
    p.add_argument("--port", type=int, help="destination port (default 80; none for icmp)")
    p.add_argument("--source-port", type=int, help="source port (default: random ephemeral)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the trace (default 5)")
    p.add_argument("--live", action="store_true",
                   help="trace the next real packet matching --from/--to/--protocol/--port (and --source-port "
                        "when given) instead of injecting one; it is forwarded, committed and audited as ever")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--config", help=f"the agent's config (for its state_dir, where the API socket is) {CONFIG_HELP}")
    p.set_defaults(func=lambda args: run_trace(agent_address(args.config), request_of(args), args.output))


def request_of(args: Any) -> dict[str, Any]:
    req: dict[str, Any] = {"op": "trace", "from": args.source, "to": args.destination, "protocol": args.protocol,
                           "timeout": args.timeout}
    if args.port is not None:
        req["port"] = args.port
    if args.source_port is not None:
        req["source_port"] = args.source_port
    if args.live:
        req["live"] = True
    return req


def run_trace(cfg: AgentAddress | AgentConfig, request: dict[str, Any], output: str = "table", *,
              api: ApiCall | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from policy_agent.rpc import call

    out, err = out or sys.stdout, err or sys.stderr
    try:
        reply = (api or call)(cfg.api_socket, request)
    except OSError as exc:
        print(f"npaudit trace: no agent answers at {cfg.api_socket} ({exc.strerror or exc}); is `npaudit agent` "
              "running with this config?", file=err)
        return EXIT_NOT_RUN
    except Exception as exc:  # OutcomeUnknown, a bad frame: still one line
        print(f"npaudit trace: agent at {cfg.api_socket}: {exc}", file=err)
        return EXIT_NOT_RUN
    trace = reply.get("trace")
    if not reply.get("ok") or not isinstance(trace, dict):
        errors = "; ".join(map(str, reply.get("errors") or ["no trace in the reply"]))
        print(f"npaudit trace: {errors}", file=err)
        return EXIT_USAGE if reply.get("usage") else EXIT_NOT_RUN
    if output == "json":
        print(json.dumps(trace, indent=2), file=out)
    else:
        print(trace_table(trace), file=out)
    return _EXIT.get(str((trace.get("outcome") or {}).get("result")), EXIT_NOT_RUN)


def trace_table(trace: dict[str, Any]) -> str:
    """The trace as a header line, one row per table met, and the outcome; agent values printed safely."""
    from auditlog.safe_text import safe_text

    src, dst = trace.get("from") or {}, trace.get("to") or {}
    sport = trace.get("source_port") if trace.get("source_port") is not None else "any"
    ports = f" {sport} -> {trace.get('destination_port')}" if trace.get("destination_port") is not None else ""
    where = f" on node {dst.get('node')}" if dst.get("node") else ""
    lines = [safe_text(f"trace {src.get('pod')} ({src.get('ip')}, port {src.get('port')}) -> "
                       f"{dst.get('pod') or 'no Pod'} ({dst.get('ip')}){where} {trace.get('protocol')}{ports}, "
                       + ("live" if trace.get("live") else f"tag {trace.get('tag')}"))]
    observations = [o for o in trace.get("observations") or [] if isinstance(o, dict)]
    nodes = any("node" in o for o in observations)  # a trace across nodes: each row says whose
    rows = [(("NODE",) if nodes else ()) + ("TABLE", "NAME", "ACTION", "DETAIL")]
    for obs in observations:
        rows.append((str(obs.get("node")),) * nodes + (str(obs.get("table")), str(obs.get("name")),
                                                       str(obs.get("action")), str(obs.get("detail"))))
    widths = [max(len(safe_text(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        lines.append("  ".join(safe_text(v).ljust(w) for v, w in zip(r[:-1], widths)) + "  " + safe_text(r[-1]))
    outcome = trace.get("outcome") or {}
    lines.append(safe_text(f"outcome: {outcome.get('result')}: {outcome.get('detail')} "
                           f"({trace.get('elapsed_ms')} ms)"))
    return "\n".join(lines)
