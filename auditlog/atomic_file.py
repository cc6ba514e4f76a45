"""Files replaced whole or not at all: a private temporary beside the target, then a rename.

The one way the project writes a file that must never be seen half-written, and the safe way
to write where someone else can create names (a support bundle's `-o` in a shared directory):
- the temporary name is random and created exclusively without following a symlink
  (`tempfile.mkstemp`: O_CREAT|O_EXCL|O_NOFOLLOW), so a planted symlink or a file someone
  created and holds open never receives a byte;
- it is 0600 from its first byte (widened to `mode` only when a caller asks for more);
- the rename replaces whatever the target name held (a symlink there is replaced, never
  followed), and `durable` fsyncs the file before and its directory after the rename.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

PRIVATE = 0o600


def fsync_directory(path: Path) -> None:
    """Make a rename or unlink in `path` survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stage(path: Path, write: Callable[[BinaryIO], object], *, mode: int = PRIVATE, durable: bool = True,
          prefix: str | None = None) -> Path:
    """A new temporary file beside `path` holding what `write` wrote (fsynced if `durable`).

    Not in force until commit(). Its name is `prefix` (default `.<name>.`), random letters and
    `.tmp`; on any failure it is removed and the error raised.
    """
    fd, tmp = tempfile.mkstemp(prefix=prefix if prefix is not None else f".{path.name}.", suffix=".tmp",
                               dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode != PRIVATE:
                os.fchmod(f.fileno(), mode)
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def commit(staged: Path, path: Path, *, durable: bool = True) -> None:
    """Put a staged file in force at `path` (the staged file is removed if that fails)."""
    try:
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    if durable:
        fsync_directory(path.parent)


def write_atomically(path: Path, content: bytes | Callable[[BinaryIO], object], *, mode: int = PRIVATE,
                     durable: bool = True) -> None:
    """Replace `path` with `content` (bytes, or a function writing into the file) whole or not at all."""
    if callable(content):
        write = content
    else:
        def write(f: BinaryIO) -> None:
            f.write(content)
    commit(stage(path, write, mode=mode, durable=durable), path, durable=durable)
