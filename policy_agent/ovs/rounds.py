"""The agent's round number, kept in a file of the state dir: flow cookies carry it (ovs/tables.py), so the
flows of the previous run can be told apart and deleted once this run's flows are in."""

from __future__ import annotations

from pathlib import Path

from auditlog.atomic_file import write_atomically

ROUND_FILE = "round"
_ROUND_MAX = 0xFFFFFFFF  # the cookie's round field (tables.ROUND_MASK): 1 .. 2^32-1, then 1 again


def read_round(state_dir: Path) -> int:
    """The round of the previous run; 0 when there was none (or its file is unreadable)."""
    try:
        return int((state_dir / ROUND_FILE).read_text().strip())
    except (OSError, ValueError):
        return 0


def write_round(state_dir: Path, round_: int) -> None:
    """Whole or not at all, and on disk before any flow carries the round (a crash must not reuse it)."""
    write_atomically(state_dir / ROUND_FILE, f"{round_}\n".encode(), mode=0o640)


def next_round(state_dir: Path) -> tuple[int, int]:
    """(previous round, this run's round), this run's already written: never 0, never the previous one."""
    previous = read_round(state_dir)
    current = previous % _ROUND_MAX + 1
    write_round(state_dir, current)
    return previous, current
