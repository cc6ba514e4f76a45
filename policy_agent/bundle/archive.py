"""The support bundle's host side: the collector (commands, files, agent API, metrics) and the tar.gz writer."""

from __future__ import annotations

import collections
import datetime as dt
import io
import os
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO, Callable

from auditlog.atomic_file import write_atomically

from policy_agent.bundle.collector import (
    MANIFEST, ROOT, TAIL, ApiCall, AuditRecords, BundleRefused, Collected, Command,
    DirectoryCopy, FileCopy, Fetched, HttpGet, Inline, Item, Plan, Unavailable,
)

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
    """The tar.gz at `path` (0600, owned by the writer), written beside it first and renamed: never half a
    bundle, never into a file or symlink someone else put at or beside `path`."""
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

    def write(raw: BinaryIO) -> None:
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, data in [*files, (MANIFEST, manifest)]:
                info = tarfile.TarInfo(f"{ROOT}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o600, int(now.timestamp())
                info.uid = info.gid = 0
                info.uname = info.gname = ""  # no user names of this host inside
                tar.addfile(info, io.BytesIO(data))

    # A random, exclusively created 0600 name beside `path`, renamed over it: a name someone
    # planted there (a symlink, a file held open) never receives a byte of the bundle.
    write_atomically(path, write)
