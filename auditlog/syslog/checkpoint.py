"""The forwarder's persisted position in the audit file set: (dev, inode, offset, seq), written atomically."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from auditlog.atomic_file import write_atomically
from auditlog.syslog.errors import CheckpointError

_VERSION = 1


@dataclass(frozen=True)
class Position:
    """Just after the record `seq`, which ends at byte `offset` (uncompressed) of file (dev, ino)."""

    dev: int
    ino: int
    offset: int
    seq: int

    @property
    def identity(self) -> tuple[int, int]:
        return self.dev, self.ino


def load_checkpoint(path: Path) -> Position | None:
    """The position saved at `path`, None if there is none yet; CheckpointError if it is unreadable."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"syslog checkpoint {path}: {exc}") from exc
    try:
        if data.pop("version") != _VERSION:
            raise ValueError("unknown version")
        position = Position(**data)
        if not all(type(v) is int and v >= 0 for v in asdict(position).values()):
            raise ValueError("fields must be non-negative integers")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"syslog checkpoint {path}: not a checkpoint ({exc})") from exc
    return position


def save_checkpoint(path: Path, position: Position) -> None:
    """Replace the checkpoint at `path` with `position` (0600, whole or not at all, fsynced)."""
    data = json.dumps({"version": _VERSION, **asdict(position)}, sort_keys=True).encode("ascii")
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        write_atomically(path, data)
    except OSError as exc:
        raise CheckpointError(f"syslog checkpoint {path}: cannot write: {exc}") from exc
