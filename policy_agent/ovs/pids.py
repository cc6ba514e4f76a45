"""Which process a daemon's pid file names, and signals that reach that process only.

A pid file outlives its daemon when the daemon dies without removing it (a crash, SIGKILL, a node
rebooted with the file on disk), and the kernel hands its pid to another process sooner or later
(pid_max is 32768 on many hosts). A pid read from such a file and signalled as root stops whatever
process has that number now; taken as "the daemon runs", it keeps a dead daemon from being restarted.

OVS's daemons hold a write lock (fcntl) on their pid file for as long as they run, which is how
OVS's own tools tell a live pid file from a stale one. `look_pid` does the same: the pid in the file
counts only while that process holds the file's lock. `stop_pid` signals through a pidfd (Linux 5.3+)
opened before the caller's "still ours?" check, so the signal cannot reach a process that took the pid
after the check; where pidfds are missing it says so once in the log and signals by pid.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import signal
import struct
import time
from pathlib import Path
from typing import Callable

from policy_agent.errors import OvsError

log = logging.getLogger(__name__)

# struct flock on Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid (pid_t), padding.
_FLOCK = struct.Struct("hhqqi4x")
# What says "no such file or process"; any other error says only that we could not look.
_GONE = frozenset({errno.ENOENT, errno.ESRCH, errno.ENOTDIR})


class PidUnknown(OvsError):
    """A pid file or /proc could not be read (EMFILE, EACCES ...): whether the daemon runs is not known."""


def look_pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not); PidUnknown if /proc could not be read."""
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError as exc:
        if exc.errno in _GONE:
            return False
        raise PidUnknown(f"/proc/{pid}/stat: {exc.strerror or exc}") from exc


def pid_alive(pid: int) -> bool:
    try:
        return look_pid_alive(pid)
    except PidUnknown:
        return False


def lock_holder(fd: int) -> int | None:
    """The pid of the process holding a lock on the whole file open at `fd` (as F_GETLK reports it: 0 for
    a holder in a pid namespace we cannot see), None when no other process holds one."""
    answer = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    kind, _, _, _, holder = _FLOCK.unpack(answer)
    return None if kind == fcntl.F_UNLCK else holder


def look_pid(pidfile: Path) -> int | None:
    """The pid in `pidfile` while that process runs and holds the file's lock, None if not (no file, a
    stale file, a pid now another process's); PidUnknown if the file could not be read."""
    try:
        fd = os.open(pidfile, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise PidUnknown(f"{pidfile}: {exc.strerror or exc}") from exc
    try:
        text = os.read(fd, 64)
        holder = lock_holder(fd)
    except OSError as exc:
        raise PidUnknown(f"{pidfile}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    try:
        pid = int(text.strip())
    except ValueError:
        return None
    # A lock is let go as its holder exits, before it turns zombie: held by this pid, the pid runs and is ours.
    # Not held, or held by another: the daemon that wrote it is gone, and the pid may be anyone's now.
    return pid if holder == pid else None


def read_pid(pidfile: Path) -> int | None:
    """The pid in `pidfile` if that process runs and holds the file's lock (None also when that could not
    be read)."""
    try:
        return look_pid(pidfile)
    except PidUnknown:
        return None


_said_no_pidfd = False


def stop_pid(pid: int, still_ours: Callable[[], bool], timeout: float = 10.0) -> bool:
    """SIGTERM `pid` and wait for it to end, SIGKILL if it outlives `timeout`; False (nothing sent) when
    `still_ours()`, asked once the pid is pinned, says the pid is no longer the process the caller means.

    `still_ours` is asked after a pidfd for `pid` is open, so a True answer names the process that pidfd
    holds, and every signal goes through that pidfd: none can reach a process that takes the pid later."""
    global _said_no_pidfd
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError) as exc:  # no pidfd (kernel < 5.3): check, then signal by pid
        if not _said_no_pidfd:
            _said_no_pidfd = True
            log.warning("no pidfd here (%s): processes are signalled by pid, which a pid reused between "
                        "the check and the signal would misdirect", exc)
        if not still_ours():
            return False
        _signal_and_wait(pid, None, timeout)
        return True
    try:
        if not still_ours():
            return False
        _signal_and_wait(pid, pidfd, timeout)
        return True
    finally:
        os.close(pidfd)


def _signal_and_wait(pid: int, pidfd: int | None, timeout: float) -> None:
    def send(sig: int) -> None:
        try:
            if pidfd is None:
                os.kill(pid, sig)
            else:
                signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            pass  # it ended on its own meanwhile

    def ended(wait: float) -> bool:
        if pidfd is not None:  # readable once the process has ended (zombie or reaped)
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            return bool(poller.poll(max(0.0, wait) * 1000))
        deadline = time.monotonic() + wait
        while pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    send(signal.SIGTERM)
    if not ended(timeout):
        send(signal.SIGKILL)
        ended(timeout)
