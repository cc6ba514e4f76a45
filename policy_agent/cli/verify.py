"""`npaudit verify [PATH...]`: its options; the chain check is auditlog/verify.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from auditlog.fileset import DEFAULT_BASE, DEFAULT_DIR
from auditlog.verify_nodes import DEFAULT_WINDOW_BYTES, break_json
from policy_agent.cli.common import CONFIG_HELP, audit_paths, quiet_stdout

if TYPE_CHECKING:
    from auditlog.verify import VerifyResult

HELP = "check the audit log's hash chain (live and rotated files); exit 1 on a break"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = sub.add_parser("verify", help=HELP,
                       description="Check npaudit.seq and npaudit.chain across live and rotated (gzip) audit files.",
                       epilog="exit status: 0 intact; 1 at the first break; 2 nothing to read")
    v.add_argument("paths", nargs="*", type=Path,
                   help=f"audit files and/or directories (default: audit.path of the config, else {DEFAULT_DIR})")
    v.add_argument("--config", help=f"the agent's config (for audit.path) {CONFIG_HELP}")
    v.add_argument("--base", default=DEFAULT_BASE,
                   help=f"live file name to look for in a directory (default {DEFAULT_BASE})")
    v.add_argument("-o", "--output", choices=("text", "json"), default="text",
                   help="text (default), or json: the result as one JSON object")
    v.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")
    v.add_argument("--from-syslog", action="store_true",
                   help="every line is a forwarded RFC 5424 message: check the record in its MSG "
                   "(without this, lines starting with '<' are taken as such messages)")
    v.add_argument("--duplicate-window", type=int, default=DEFAULT_WINDOW_BYTES, metavar="BYTES",
                   help="bytes of recent records remembered per node to recognise re-sent copies "
                   f"(default {DEFAULT_WINDOW_BYTES}: the forwarder's window plus a receive buffer, "
                   "with room; an older repeat is reported, not passed)")
    v.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    from auditlog.verify import verify

    try:
        paths, base = audit_paths(args.paths, args.config, args.base)
        result = verify(paths, base=base, syslog=True if args.from_syslog else None,
                        duplicate_window=args.duplicate_window)
    except (OSError, ValueError) as exc:
        print(f"npaudit verify: {exc}", file=sys.stderr)
        return 2
    try:
        return report(result, sys.stdout, as_json=args.output == "json")
    except BrokenPipeError:  # `npaudit verify | head -1`: the verdict is the exit status all the same
        quiet_stdout()
        return 0 if result.ok else 1


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The result as `npaudit verify --json` prints it."""
    return {
        "ok": result.ok, "files": [str(p) for p in result.files], "records": result.records,
        "first_seq": result.first_seq, "last_seq": result.last_seq, "head_chain": result.head_chain,
        "duplicates": result.duplicates, "warnings": list(result.warnings),
        "break": break_json(result.first_break),
        "nodes": [n.to_json() for n in result.nodes],
    }


def report(result: VerifyResult, out: IO[str], *, as_json: bool = False) -> int:
    """Print the result (text, or one JSON object; per node where there are several or duplicates);
    the exit status: 0 intact, 1 at a break."""
    if as_json:
        print(json.dumps(to_json(result), sort_keys=True), file=out)
        return 0 if result.ok else 1
    for warning in result.warnings:
        print(f"WARNING: {warning}", file=out)
    per_node = len(result.nodes) > 1 or any(n.node is not None or n.duplicates for n in result.nodes)
    if result.first_break is not None:
        for brk in result.breaks:
            print(f"BREAK: {brk}", file=out)
        print(f"{result.records} records intact before it, in {len(result.files)} files", file=out)
        for node in result.nodes if per_node else ():
            print(node.summary(), file=out)
        return 1
    print(result.summary(), file=out)
    for node in result.nodes if per_node else ():
        print(node.summary() + (f", head chain {node.head_chain}" if node.head_chain else ""), file=out)
    if result.head_chain:
        print(f"head: seq {result.last_seq} chain {result.head_chain}", file=out)
    return 0
