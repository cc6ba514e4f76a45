"""Where a writer's chain resumes: the newest sealed record on disk, and a chain-restart record if damage follows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from auditlog.chain import GENESIS, chain_restart_record
from auditlog.fileset import audit_files, scan_tail


def resume_point(live: Path, context: Mapping[str, Any] | None, clock: Callable[[], float]
                 ) -> tuple[int, str, dict[str, Any] | None]:
    """(seq, chain) of the newest whole record of the file set of `live` (0, GENESIS when none), and the
    chain-restart record (a dict) when bytes that are no complete record follow it. A live file whose last
    line is torn gets its newline, so the next record has a line of its own. `clock` is read only then."""
    damage: tuple[Path, int, int, int] | None = None  # path, offset, line, bytes
    after_seq, after_chain = 0, GENESIS
    for index, path in reversed(audit_files(live)):
        tail = scan_tail(path)
        if index == 0 and not tail.ends_with_newline:
            with open(path, "ab") as f:  # end the torn line so the next record has a line of its own
                f.write(b"\n")
        if tail.damage is not None:
            damage = (path, tail.damage[0], tail.damage[1], tail.size - tail.damage[0])
        if tail.last is not None:
            after_seq, after_chain = tail.last
            break
    if damage is None:
        return after_seq, after_chain, None
    path, offset, line, nbytes = damage
    return after_seq, after_chain, chain_restart_record(file=path.name, line=line, offset=offset, nbytes=nbytes,
                                                        context=context, after_seq=after_seq, now=clock())
