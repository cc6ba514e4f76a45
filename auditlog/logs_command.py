"""`npaudit logs`: one run from its parsed request to an exit status (query, read, print, follow).

Exit status: 0 when the run worked, matches or not (nothing is printed on stdout
when nothing matched; table output says "no matching records" on stderr); 2 with
one line on stderr for a bad filter, time, option or path.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

from auditlog.fileset import DEFAULT_BASE, split_name
from auditlog.follow import Follower, position_at_end
from auditlog.logread import LogReader, Position
from auditlog.query import Filter, Match, Query, QueryError, parse_time
from auditlog.query_output import make_output

__all__ = ["EXIT_USAGE", "LogsRequest", "run_logs"]

EXIT_USAGE = 2


@dataclass(frozen=True)
class LogsRequest:
    """What the command line asked for; `output` None means table on a terminal, else json."""

    paths: Sequence[Path]
    base: str = DEFAULT_BASE
    filters: Sequence[Filter] = ()
    since: str | None = None
    until: str | None = None
    last: int | None = None
    follow: bool = False
    output: str | None = None


def _query(req: LogsRequest, now: dt.datetime) -> Query:
    if req.last is not None and req.last < 0:
        raise QueryError(f"--last {req.last}: not a number of records (0 or more)")
    if req.follow and req.until is not None:
        raise QueryError("--until cannot be used with --follow (a followed log has no end)")
    since = parse_time("--since", req.since, now) if req.since is not None else None
    until = parse_time("--until", req.until, now) if req.until is not None else None
    return Query(req.filters, since=since, until=until)


def _live_file(req: LogsRequest, reader: LogReader | None) -> Path:
    """The one live file --follow watches."""
    if reader is not None and reader.sets:
        if len(reader.sets) > 1:
            raise QueryError("--follow reads one file set; these paths name "
                             + ", ".join(str(p) for p in reader.sets))
        return next(iter(reader.sets))
    if len(req.paths) != 1:
        raise QueryError("--follow reads one file set: give one directory or live file")
    path = req.paths[0]
    live = path / req.base if path.is_dir() else path.with_name(split_name(path.name)[0])
    if not live.parent.is_dir():  # the live file itself may come later: a node before its first record
        raise FileNotFoundError(2, "no such directory", str(live.parent))
    return live


def run_logs(req: LogsRequest, *, out: IO[bytes], err: IO[str], now: dt.datetime, tty: bool,
             colour: bool, stop: threading.Event | None = None) -> int:
    """Print the records `req` selects to `out` (then follow until `stop` is set, with --follow)."""
    form = req.output or ("table" if tty else "json")
    output = make_output(form, out, colour=colour and tty)
    reader = None
    try:
        query = _query(req, now)
        history = not req.follow or req.since is not None or req.last is not None
        reader = LogReader(req.paths, req.base) if history else None
        live = _live_file(req, reader) if req.follow else None
    except (QueryError, OSError) as exc:
        if reader is not None:
            reader.close()
        where = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else exc
        print(f"npaudit logs: {where}", file=err)
        return EXIT_USAGE
    shown = 0
    start: Position | None = None
    if reader is not None:
        with reader:
            shown = output.write(reader.select(query, req.last))
            output.flush()
            start = reader.end
        for note in reader.notes:
            print(f"npaudit logs: note: {note}", file=err)
    if live is None:
        if start is not None and start.file is not None:
            start.file.close()
        if shown == 0 and form == "table":
            print("no matching records", file=err)
        return 0
    follower = Follower(live, query, start if start is not None else position_at_end(live))
    try:
        def emit(matches: list[Match]) -> None:
            output.write(matches)
            output.flush()
        follower.run(emit, stop or threading.Event())
    finally:
        follower.close()
        for note in follower.notes:
            print(f"npaudit logs: note: {note}", file=err)
    return 0
