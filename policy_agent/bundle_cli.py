"""`npaudit bundle`: its options, the host collector (commands, files, agent API) and the tar.gz writer."""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import io
import os
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, TextIO

from policy_agent.bundle import (
    MANIFEST, ROOT, TAIL, ApiCall, AuditRecords, BundleOptions, BundleRefused, Collected, Command,
    DirectoryCopy, FileCopy, Fetched, HttpGet, Inline, Item, Plan, Unavailable,
)

EXIT_USAGE = 2
_MIB = 1 << 20


class HostCollector:
    """Fetches items from this host: commands, files, the agent's local API and metrics endpoint."""

    def fetch(self, item: Item, limit: int) -> Fetched:
        source = item.source
        if isinstance(source, Inline):
            return Fetched(((item.name, source.data),))
        if isinstance(source, Command):
            return Fetched(((item.name, _run(source)),))
        if isinstance(source, FileCopy):
            data, size = _read(source.path, limit, item.keep)
            return Fetched(((item.name, data),), {"source_bytes": size} if size > limit else {})
        if isinstance(source, DirectoryCopy):
            if not source.path.is_dir():
                raise Unavailable(f"{source.path}: no such directory")
            return Fetched(tuple((f"{item.name}/{path.name}", _read(path, limit, item.keep)[0])
                                 for path in sorted(source.path.glob(source.pattern)) if path.is_file()))
        if isinstance(source, ApiCall):
            return Fetched(((item.name, _api(source)),))
        if isinstance(source, HttpGet):
            return Fetched(((item.name, _http(source.url, limit)),))
        if isinstance(source, AuditRecords):
            return _audit(item.name, source, limit)
        raise Unavailable(f"unknown source {type(source).__name__}")


def _run(command: Command) -> bytes:
    try:
        done = subprocess.run(command.argv, capture_output=True, timeout=command.timeout, check=False)
    except FileNotFoundError as exc:
        raise Unavailable(f"{command.argv[0]}: not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"{' '.join(command.argv)}: no answer within {command.timeout:g}s") from exc
    if done.returncode != 0:
        error = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise Unavailable(f"{' '.join(command.argv)}: exit {done.returncode}: {error[-1] if error else ''}")
    return done.stdout


def _read(path: Path, limit: int, keep: str) -> tuple[bytes, int]:
    """At most `limit` (+ one byte) of the file, from the end that is kept, and the file's size."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if keep == TAIL and size > limit:
                f.seek(size - limit - 1)  # one byte more: cut() then drops a partial first line
            return f.read(limit + 1), size
    except OSError as exc:
        raise Unavailable(f"{path}: {exc.strerror}") from exc


def _api(call: ApiCall) -> bytes:
    import json

    from policy_agent.sources.local_api import OutcomeUnknown, call as api_call

    try:
        reply = api_call(call.socket, {"op": call.op}, timeout=10.0)
    except (OSError, OutcomeUnknown) as exc:
        raise Unavailable(f"agent not running or not reachable at {call.socket}: {exc}") from exc
    return json.dumps(reply, indent=2, sort_keys=True).encode() + b"\n"


def _http(url: str, limit: int) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5.0) as response:  # noqa: S310 (a URL from our config)
            return response.read(limit + 1)
    except (OSError, urllib.error.URLError) as exc:
        raise Unavailable(f"{url}: {exc}") from exc


def _audit(name: str, source: AuditRecords, limit: int) -> Fetched:
    """The newest records from `since` on that fit in `limit` bytes, oldest first."""
    from auditlog.logread import LogReader
    from auditlog.query import Query

    kept: collections.deque[bytes] = collections.deque()
    size = selected = 0
    try:
        with LogReader([source.live.parent], base=source.live.name) as reader:
            for raw, _ in reader.select(Query(since=source.since)):
                selected += 1
                kept.append(raw + b"\n")
                size += len(raw) + 1
                while size > limit and kept:
                    size -= len(kept.popleft())
    except OSError as exc:  # FileNotFoundError names the path; a PermissionError too
        raise Unavailable(f"audit files: {exc}") from exc
    return Fetched(((name, b"".join(kept)),), {"records_selected": selected})


def collect(plan: Plan, collector: object, limit: int,
            progress: Callable[[int, int, str], None] | None = None) -> list[Collected]:
    """Every planned item, fetched in order; an item that fails is noted, the rest go on."""
    out = []
    for n, item in enumerate(plan.items):
        if progress is not None:
            progress(n, len(plan.items), item.name)
        try:
            out.append(Collected(item, collector.fetch(item, limit)))  # type: ignore[attr-defined]
        except Unavailable as exc:
            out.append(Collected(item, None, str(exc)))
    if progress is not None:
        progress(len(plan.items), len(plan.items), "")
    return out


def write_bundle(path: Path, files: list[tuple[str, bytes]], manifest: bytes, *, now: dt.datetime,
                 min_free: int) -> None:
    """The tar.gz at `path` (0600), written beside it first and renamed: never half a bundle."""
    need = sum(len(data) for _, data in files) + len(manifest)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        stat = os.statvfs(parent)
    except OSError as exc:
        raise BundleRefused(f"{path}: cannot write there: {exc.strerror}") from exc
    free = stat.f_bavail * stat.f_frsize
    if free - need < min_free:
        raise BundleRefused(f"{path}: not written: {parent} has {free // _MIB} MiB free, the bundle needs up to "
                            f"{need // _MIB + 1} MiB and bundle.min_free_mb is {min_free // _MIB}")
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, data in [*files, (MANIFEST, manifest)]:
                info = tarfile.TarInfo(f"{ROOT}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o600, int(now.timestamp())
                info.uid = info.gid = 0
                info.uname = info.gname = ""  # no user names of this host inside
                tar.addfile(info, io.BytesIO(data))
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


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
    from auditlog.redact import Redactor
    from policy_agent.bundle import assemble, plan
    from policy_agent.cli import _load_config, _version

    cfg = _load_config(args.config)
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
    output = Path(args.output or f"npaudit-bundle-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz")
    try:
        planned = plan(cfg, options, version=_version(), node=cfg.node_name or socket.gethostname())
        progress = _progress_bar(sys.stderr) if sys.stderr.isatty() else None
        collected = collect(planned, HostCollector(), options.max_bytes, progress)
        redactor = Redactor(secrets.token_bytes(32)) if args.redact else None  # the key dies with this process
        files, manifest = assemble(planned, collected, cfg, options, redactor)
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bundle", help="write a support bundle (tar.gz with manifest.json)",
                       description="Collect version, config, agent status and metrics, OVS state and the "
                                   "applied policy into a tar.gz with manifest.json (sizes, sha256, what was "
                                   "left out and why). Audit records only with --include-audit and "
                                   "bundle.allow_audit_logs: true in the config.",
                       epilog="exit status: 0 written; 1 could not write; 2 refused or bad option")
    b.add_argument("-o", "--output", help="the tar.gz to write (default npaudit-bundle-<UTC time>.tar.gz)")
    b.add_argument("--since", help="audit records from this time on: 30s, 10m, 2h, 7d or RFC 3339")
    b.add_argument("--include-audit", "--include-audit-logs", dest="include_audit", action="store_true",
                   help="add audit records (also needs bundle.allow_audit_logs: true)")
    b.add_argument("--redact", action="store_true",
                   help="replace IPs, Pod, namespace, node, label, policy and rule names with keyed pseudonyms")
    b.add_argument("--max-size", type=float, metavar="MB",
                   help="most MiB of content before compression (default bundle.max_size_mb)")
    b.add_argument("--config", help="the agent's config (default: built-in defaults)")
    b.set_defaults(func=cmd_bundle)
