"""Whether a process the test started still runs, read from /proc without racing its exit."""

from __future__ import annotations

from pathlib import Path


def state(pid: int) -> str | None:
    """The process state letter of `pid` (R, S, T, Z, ...), None once it is gone.

    A process reaped between the open of /proc/PID/stat and its read makes the read fail with ESRCH
    (ProcessLookupError), not FileNotFoundError: both mean gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it has exited, its parent has yet to reap it)."""
    return state(pid) not in (None, "Z", "X")
