"""The audit writer's directory and its claim on the file set: modes, and one writer per set."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import stat
from contextlib import suppress
from pathlib import Path

from auditlog.compressor import FILE_MODE
from auditlog.errors import AuditLogError

log = logging.getLogger("auditlog.writer")  # the writer's messages, as before the split
DIR_MODE = 0o750


class AuditWriterError(AuditLogError):
    """The audit file cannot be set up (directory, permissions, unreadable existing files)."""


def prepare_directory(path: Path) -> None:
    """Create the audit directory (0750) and its missing parents; narrow one that lets others create files."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        with suppress(FileExistsError):
            os.mkdir(directory, DIR_MODE)
            os.chmod(directory, DIR_MODE)  # the umask may have narrowed it
    # Whoever can write the directory can delete or rename audit files, whatever their mode.
    directory = path.parent
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if mode & 0o022:
        if mode & stat.S_ISVTX:  # /tmp and the like: shared on purpose, not ours to narrow
            raise AuditWriterError(f"audit directory {directory}: mode {mode:04o} lets others create "
                                   "files in it; give the audit log a directory of its own")
        os.chmod(directory, DIR_MODE)
        log.warning("audit directory %s was mode %04o (group or others could delete or rename audit "
                    "files): now %04o", directory, mode, DIR_MODE)


def take_ownership(path: Path) -> int:
    """Lock the file set for this writer; the fd holding the lock (closing it releases it)."""
    # Two writers on one file set would interleave two chains: refuse the second.
    fd = os.open(path.with_name(f".{path.name}.owner"), os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise AuditWriterError(f"audit log {path} is in use by another writer") from exc
    except OSError:
        os.close(fd)
        raise
    return fd


# Filesystems whose write(2) can block for as long as a server or a FUSE daemon is away: the
# event loop must never be the thread that meets that (no inline writes, see AuditWriter).
_MAY_HANG = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "9p", "afs", "lustre", "gpfs")


def filesystem_type(path: Path, mountinfo: str | None = None) -> str:
    """The type of the filesystem holding `path` (its nearest existing ancestor), from
    /proc/self/mountinfo: the longest mount point that is a prefix; "" if unknown."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return ""
    target = Path(os.path.realpath(path))
    best, fstype = -1, ""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        # mountinfo escapes space, tab, newline and backslash in octal.
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if (target == Path(mount) or Path(mount) in target.parents) and len(mount) > best:
            best, fstype = len(mount), right.split()[0]
    return fstype


def inline_writes_allowed(path: Path, wanted: bool, mountinfo: str | None = None) -> bool:
    """Whether the writer may write a lone record on the submitting thread (the event loop):
    `wanted` (audit.inline_writes) and not on a filesystem that can hang."""
    if not wanted:
        return False
    fstype = filesystem_type(path, mountinfo)
    if fstype in _MAY_HANG or fstype.startswith("fuse"):
        log.warning("audit log %s is on %s, whose writes can block while its server is away: every "
                    "record goes through the writer thread (no inline writes), so the event loop "
                    "never waits for the disk", path, fstype)
        return False
    return True
