"""`npaudit bundle`: its options and the command; the bundle is built in policy_agent/bundle/."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Callable, TextIO

from policy_agent.cli.common import CONFIG_HELP, load_config, version

EXIT_USAGE = 2
_MIB = 1 << 20


def _progress_bar(out: TextIO) -> Callable[[int, int, str], None]:
    def show(done: int, total: int, name: str) -> None:
        width = 24
        filled = width * done // max(total, 1)
        end = "\n" if done == total else ""
        out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name[:40]:<40}{end}")
        out.flush()
    return show


def cmd_bundle(args: argparse.Namespace) -> int:
    import secrets
    import socket

    from auditlog.query import QueryError, parse_time
    from policy_agent.bundle.archive import HostCollector, collect, write_bundle
    from policy_agent.bundle.collector import MANIFEST, BundleOptions, BundleRefused, assemble, plan
    from policy_agent.bundle.redact import Redactor

    cfg = load_config(args.config)
    now = dt.datetime.now(dt.timezone.utc)
    try:
        since = parse_time("--since", args.since, now) if args.since else None
    except QueryError as exc:
        print(f"npaudit bundle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    max_mb = args.max_size if args.max_size is not None else cfg.bundle.max_size_mb
    if max_mb <= 0:
        print(f"npaudit bundle: --max-size {max_mb}: must be > 0 (MiB)", file=sys.stderr)
        return EXIT_USAGE
    options = BundleOptions(now=now, max_bytes=int(max_mb * _MIB), since=since,
                            include_audit=args.include_audit, redact=args.redact)
    if args.old_output:
        print("npaudit bundle: -o/--output FILE is deprecated, use --output-file FILE", file=sys.stderr)
    output = Path(args.output_file or args.old_output or f"npaudit-bundle-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz")
    try:
        planned = plan(cfg, options, version=version(), node=cfg.node_name or socket.gethostname())
        progress = _progress_bar(sys.stderr) if sys.stderr.isatty() else None
        collected = collect(planned, HostCollector(), options.max_bytes, progress)
        redactor = Redactor(secrets.token_bytes(32)) if args.redact else None  # the key dies with this process
        files, manifest = assemble(planned, collected, cfg, options, redactor)
    except BundleRefused as exc:
        print(f"npaudit bundle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # what the bundle was to hold could not be read (not root, most often)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"npaudit bundle: cannot read {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        write_bundle(output, files, manifest, now=now, min_free=cfg.bundle.min_free_mb * _MIB)
    except BundleRefused as exc:
        print(f"npaudit bundle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"npaudit bundle: {output}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 1
    skipped = sum(1 for c in collected if c.fetched is None)
    print(f"{output}: {len(files) + 1} files ({skipped} items unavailable, see {MANIFEST})"
          + (", redacted" if args.redact else ""))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("bundle", help="write a support bundle (tar.gz with manifest.json)",
                       description="Collect version, config, agent status and metrics, OVS state and the "
                                   "applied policy into a tar.gz with manifest.json (sizes, sha256, what was "
                                   "left out and why). Audit records only with --include-audit and "
                                   "bundle.allow_audit_logs: true in the config.",
                       epilog="exit status: 0 written; 1 could not write; 2 refused or bad option")
    b.add_argument("--output-file", metavar="FILE",
                   help="the tar.gz to write (default npaudit-bundle-<UTC time>.tar.gz)")
    # -o is an output format in every other verb (as in kubectl); as a file name here it still works.
    b.add_argument("-o", "--output", dest="old_output", metavar="FILE",
                   help="deprecated spelling of --output-file (-o is an output format elsewhere)")
    b.add_argument("--since", help="audit records from this time on: 30s, 10m, 2h, 7d or RFC 3339")
    b.add_argument("--include-audit", "--include-audit-logs", dest="include_audit", action="store_true",
                   help="add audit records (also needs bundle.allow_audit_logs: true)")
    b.add_argument("--redact", action="store_true",
                   help="replace IPs, Pod, namespace, node, label, policy and rule names with keyed pseudonyms")
    b.add_argument("--max-size", type=float, metavar="MB",
                   help="most MiB of content before compression (default bundle.max_size_mb)")
    b.add_argument("--config", help=f"the agent's config {CONFIG_HELP}")
    b.set_defaults(func=cmd_bundle)
