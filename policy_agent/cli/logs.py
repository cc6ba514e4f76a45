"""`npaudit logs`: its options (hubble-style filters) and the command; the work is auditlog's."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from policy_agent.cli.common import CONFIG_HELP, audit_paths, quiet_stdout


class _LogsFilter(argparse.Action):
    """A `npaudit logs` filter option: appended in command-line order, negated after --not."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from auditlog.query import Filter

        negated = getattr(namespace, "negate_next", False)
        namespace.negate_next = False
        namespace.filters = [*(namespace.filters or []), Filter(self.dest, str(values), negated)]


class _LogsNot(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        namespace.negate_next = True


def cmd_logs(args: argparse.Namespace) -> int:

    from auditlog.fileset import DEFAULT_BASE
    from auditlog.logs_command import EXIT_USAGE, LogsRequest, run_logs

    if getattr(args, "negate_next", False):
        print("npaudit logs: --not must be followed by a filter", file=sys.stderr)
        return EXIT_USAGE
    paths, base = audit_paths(args.paths, args.config, DEFAULT_BASE)
    request = LogsRequest(paths=paths, base=base, filters=args.filters or (), since=args.since,
                          until=args.until, last=args.last, follow=args.follow, output=args.output)
    tty = sys.stdout.isatty()
    try:
        return run_logs(request, out=sys.stdout.buffer, err=sys.stderr, now=dt.datetime.now(dt.timezone.utc),
                        tty=tty, colour=tty and not os.environ.get("NO_COLOR"))
    except KeyboardInterrupt:  # the way out of --follow
        return 0
    except BrokenPipeError:  # `npaudit logs | head`: the reader has what it wanted
        quiet_stdout()
        return 0


_LOGS_FILTERS = (  # (option, its short form, metavar, help)
    ("pod", None, "[NS/]NAME", "source or destination Pod, name prefix"),
    ("from-pod", None, "[NS/]NAME", "source Pod, name prefix"),
    ("to-pod", None, "[NS/]NAME", "destination Pod, name prefix"),
    ("namespace", "-n", "NS", "namespace of the source or destination Pod"),
    ("from-namespace", None, "NS", "namespace of the source Pod"),
    ("to-namespace", None, "NS", "namespace of the destination Pod"),
    ("policy", None, "POLICY", "rule.ruleset: Kind:ns/name, ns/name or name"),
    ("rule", None, "RULE", "rule name or id"),
    ("tier", None, "TIER", "rule tier (rule.category), any case"),
    ("disposition", None, "D", "allow, drop, reject or pass (any case)"),
    ("verdict", None, "VERDICT", "as hubble spells it: FORWARDED (allow) or DROPPED (drop and reject); also "
                                 "allow, drop, reject, pass"),
    ("direction", None, "DIR", "ingress or egress"),
    ("ip", None, "CIDR", "source or destination address in CIDR (or one address)"),
    ("from-ip", None, "CIDR", "source address in CIDR"),
    ("to-ip", None, "CIDR", "destination address in CIDR"),
    ("port", None, "PORT", "source or destination port"),
    ("from-port", None, "PORT", "source port"),
    ("to-port", None, "PORT", "destination port"),
    ("protocol", None, "PROTO", "tcp, udp, icmp, ipv6-icmp, sctp or an IANA number"),
    ("label", None, "LABEL", "the rule's log label (labels.log_label)"),
    ("node", None, "NODE", "observer.hostname"),
)
# hubble observe's spellings of the same filters.
_HUBBLE_ALIASES = {"traffic-direction": "direction", "node-name": "node"}
HELP = "show audit records, filtered, and follow them (like hubble observe)"
# auditlog.query_output.FORMATS, spelled here so that parsing `logs` imports no record machinery.
FORMATS = ("table", "compact", "json")
OBSERVE_HELP = "`logs` with hubble observe's spellings (--verdict, --from-pod, --to-pod, --traffic-direction, ...)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`logs`, and `observe`: the same verb under hubble's name."""
    for verb, text in (("logs", HELP), ("observe", OBSERVE_HELP)):
        _add_parser(sub, verb, text)


def _add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], verb: str, text: str) -> None:
    lg = sub.add_parser(
        verb, help=text,
        description="Show audit records of the live and rotated (gzip) files, oldest first. Filters repeat "
                    "and combine: values of one kind are ORed, kinds are ANDed; --not negates the next filter, "
                    "and a record is hidden when it matches all the negated kinds (as in hubble observe).",
        epilog="Times: 30s, 10m, 2h, 7d (before now) or RFC 3339 (a time without offset is UTC). "
               "Exit status 0 (also when nothing matched), 2 for a bad filter, time or path.")
    lg.add_argument("paths", nargs="*", type=Path,
                    help="audit files or directories (default: audit.path of the config, else /var/log/npaudit)")
    lg.add_argument("--config", help=f"the agent's config (for audit.path) {CONFIG_HELP}")
    for name, short, metavar, what in _LOGS_FILTERS:
        aliases = [f"--{alias}" for alias, kind in _HUBBLE_ALIASES.items() if kind == name]
        lg.add_argument(*([short] if short else []), f"--{name}", *aliases, dest=name, action=_LogsFilter,
                        metavar=metavar, help=what + " (repeatable)")
    lg.add_argument("--not", action=_LogsNot, nargs=0, help="negate the next filter")
    lg.add_argument("--since", metavar="TIME", help="records at or after TIME")
    lg.add_argument("--until", metavar="TIME", help="records at or before TIME")
    lg.add_argument("--last", type=int, metavar="N", help="only the newest N matching records")
    lg.add_argument("-f", "--follow", action="store_true",
                    help="then print new records as they are written (from the end, unless --since/--last)")
    lg.add_argument("-o", "--output", choices=FORMATS,
                    help="table (default on a terminal), compact, or json: the record lines byte for byte "
                         "(default otherwise)")
    lg.set_defaults(func=cmd_logs, filters=None)
