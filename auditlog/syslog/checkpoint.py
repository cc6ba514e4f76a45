"""The forwarder's persisted position in the audit file set: (dev, inode, offset, seq), written atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

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
    """Replace the checkpoint at `path` with `position` (temporary file, fsync, rename, fsync of the directory)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(json.dumps({"version": _VERSION, **asdict(position)}, sort_keys=True).encode("ascii"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise CheckpointError(f"syslog checkpoint {path}: cannot write: {exc}") from exc
