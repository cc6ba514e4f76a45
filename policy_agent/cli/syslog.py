"""`npaudit syslog status|test`: the forwarders' state from the agent, and a marked test message per destination.

`status` asks the running agent over its local API (it alone knows what was
sent). `test` needs no agent: this process reads the config and sends one
test message to each destination itself, with the destination's own framing
and TLS settings, so it checks the receiver, the network path and the
certificates before (or while) the agent forwards. The message never enters
the audit files or a checkpoint (auditlog.syslog.rfc5424 says how it is marked).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence, TextIO

from policy_agent.cli.common import CONFIG_HELP, ApiCall, agent_address, load_config

if TYPE_CHECKING:  # the forwarder's modules load only when a subcommand runs, not to parse its options
    from auditlog.syslog.destination import Destination
    from auditlog.syslog.status import SyslogStatus
    from policy_agent.config.client import AgentAddress
    from policy_agent.config.loader import AgentConfig

SendTest = Callable[["Destination", float, str], None]

STATUS_HELP = "per destination: connected, last seq sent vs the writer's, backlog, last error (asks the running agent)"
TEST_HELP = ("send one marked test message (MSGID TEST, not an audit record, not in the hash chain) to each "
             "configured destination from this process (no agent needed); exit 0 if every one was delivered")
_COLUMNS = ("DESTINATION", "CONNECTED", "LAST SENT", "WRITER", "BACKLOG", "BACKLOG BYTES", "SENT", "LOST",
            "TRUNCATED", "ERRORS", "RESTARTS", "LAST ERROR")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `npaudit syslog status|test` on the CLI's subparsers."""
    sp = sub.add_parser("syslog", help="operate the syslog forwarder: status, test")
    actions = sp.add_subparsers(dest="syslog_command", required=True)
    st = actions.add_parser("status", help=STATUS_HELP, description=STATUS_HELP)
    st.add_argument("--config", help=f"the agent's config (for its state_dir, where the API socket is) {CONFIG_HELP}")
    st.add_argument("-o", "--output", choices=("table", "json"), default="table")
    st.set_defaults(func=lambda args: run_status(agent_address(args.config), args.output))
    te = actions.add_parser("test", help=TEST_HELP, description=TEST_HELP)
    te.add_argument("--config", help=f"the config whose syslog.destinations are tested {CONFIG_HELP}")
    te.add_argument("--destination", metavar="URL",
                    help="test only this destination (udp://, tcp://, tls:// or relp://HOST:PORT); its settings come "
                         "from the config when it is listed there, else the defaults (TLS: the system's trust store)")
    te.add_argument("--timeout", type=float, default=10.0, help="seconds to connect and be acknowledged")
    te.set_defaults(func=lambda args: run_test(load_config(args.config), args.destination, timeout=args.timeout))


# --- status ---

def run_status(cfg: AgentAddress | AgentConfig, output: str = "table", *, api: ApiCall | None = None,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the running agent's syslog status; 1 when no agent answers or its reply is unusable."""
    from policy_agent.rpc import SYSLOG_STATUS_OP, call

    out, err = out or sys.stdout, err or sys.stderr
    try:
        reply = (api or call)(cfg.api_socket, {"op": SYSLOG_STATUS_OP})
    except OSError as exc:
        print(f"error: no agent answers at {cfg.api_socket} ({exc.strerror or exc}); is `npaudit agent` running "
              f"with this config?", file=err)
        return 1
    if not reply.get("ok"):
        for line in reply.get("errors") or ["the agent refused the request"]:
            print(f"error: agent at {cfg.api_socket}: {line}", file=err)
        return 1
    from auditlog.syslog.status import SyslogStatus, SyslogStatusError  # the forwarder's stats: once there is a reply

    try:
        status = SyslogStatus.from_json(reply.get("syslog") or {})
    except SyslogStatusError as exc:
        print(f"error: agent at {cfg.api_socket}: {exc}", file=err)
        return 1
    if output == "json":
        print(json.dumps(status.to_json(), indent=2), file=out)
    elif not status.destinations:
        print("no syslog destinations configured (syslog.destinations in the agent's config)", file=out)
    else:
        print(status_table(status), file=out)
    return 0


def status_table(status: SyslogStatus) -> str:
    """One row per destination, columns aligned; "-" for what is not known."""
    rows = [_COLUMNS]
    for st in status.destinations:
        rows.append((st.destination, "yes" if st.connected else "no", _opt(st.last_seq_sent), _opt(status.writer_seq),
                     _opt(status.backlog_records(st)), _opt(st.backlog_bytes), str(st.sent), str(st.lost),
                     str(st.truncated), str(st.errors), str(st.restarts), st.last_error or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows)


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


# --- test ---

class Outcome(NamedTuple):
    """What happened to the test message at one destination (error None: delivered)."""

    destination: str
    error: str | None
    note: str = ""


def chosen_destinations(cfg: AgentConfig, url: str | None) -> tuple[list[Destination], str]:
    """The destinations to test and a note; SyslogError naming the URL or the config entry that is wrong."""
    from auditlog.syslog.destination import make_destination
    from auditlog.syslog.transport import parse_endpoint
    from policy_agent.config.loader import syslog_destination

    configured = [syslog_destination(d, cfg.node) for d in cfg.syslog.destinations]
    if url is None:
        return configured, ""
    endpoint = parse_endpoint(url)
    same = [d for d in configured if d.endpoint == endpoint]
    if same:
        return same, ""
    return [make_destination(url, node_name=cfg.node)], "not in the config: default settings"


def run_test(cfg: AgentConfig, url: str | None = None, *, timeout: float = 10.0, send: SendTest | None = None,
             clock: Callable[[], float] = time.time, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Send a test message to each chosen destination; 0 if all were delivered, 1 otherwise (or if there was none)."""
    from auditlog.syslog.errors import SyslogError
    from auditlog.syslog.destination import send_test_message

    out, err = out or sys.stdout, err or sys.stderr
    try:
        destinations, note = chosen_destinations(cfg, url)
    except SyslogError as exc:
        print(f"error: {exc}", file=err)
        return 1
    if not destinations:
        print("no syslog destinations configured (syslog.destinations; or give --destination URL): nothing sent",
              file=err)
        return 1
    test_id = secrets.token_hex(8)
    deliver = send or (lambda dest, now, tid: send_test_message(dest, now=now, test_id=tid, timeout=timeout))
    outcomes = []
    for dest in destinations:
        try:
            deliver(dest, clock(), test_id)
        except SyslogError as exc:
            outcomes.append(Outcome(dest.name, str(exc), note))
            continue
        ack = {"udp": "sent (UDP: no acknowledgement, look at the receiver)",
               "relp": "acknowledged by the receiver (RELP rsp 200)",
               "relp+tls": "acknowledged by the receiver (RELP rsp 200, over TLS)"}.get(dest.endpoint.scheme,
                                                                         "acknowledged by the receiver's TCP")
        outcomes.append(Outcome(dest.name, None, "; ".join(n for n in (ack, note) if n)))
    print(f"test message id {test_id} (MSGID TEST, [npaudit@32473 test=\"true\" id=\"{test_id}\"])", file=out)
    print(outcome_table(outcomes), file=out)
    return 0 if all(o.error is None for o in outcomes) else 1


def outcome_table(outcomes: Sequence[Outcome]) -> str:
    """One line per destination: name, ok or FAILED, then the note or the error."""
    width = max(len(o.destination) for o in outcomes)
    return "\n".join(f"{o.destination.ljust(width)}  {'ok    ' if o.error is None else 'FAILED'}  "
                     f"{o.error if o.error is not None else o.note}" for o in outcomes)
