"""A wake-up on the event loop when a watched process ends (a pidfd per pid, Linux 5.3+), so a watcher
need not poll to see a death."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable, Iterable

log = logging.getLogger(__name__)


def open_pidfd(pid: int) -> int:
    """os.pidfd_open(pid); OSError where the kernel or Python has none (then the watcher polls)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        raise OSError("os.pidfd_open is not available")
    return int(opener(pid))


class DeathNotices:
    """`watch(pids)` keeps one pidfd per pid on the running loop; when one of those processes ends its
    pidfd turns readable, is closed and `ended` is set. A pid whose pidfd cannot be opened (gone already,
    no pidfd on this kernel, another pid namespace) is not covered: watch() then returns False and the
    caller keeps polling."""

    def __init__(self, opener: Callable[[int], int] = open_pidfd) -> None:
        self._open = opener
        self._fds: dict[int, int] = {}  # pid -> its pidfd, registered with the loop
        self.ended = asyncio.Event()
        self._said = False  # the fallback to polling is logged once

    def watch(self, pids: Iterable[int]) -> bool:
        """Covers exactly `pids` (others are let go); True when every one of them is covered."""
        loop = asyncio.get_running_loop()
        wanted = set(pids)
        for pid in set(self._fds) - wanted:
            self._drop(loop, pid)
        covered = True
        for pid in wanted - set(self._fds):
            try:
                fd = self._open(pid)
            except OSError as exc:
                covered = False
                if not self._said:
                    self._said = True
                    log.info("no death notice for pid %d (%s): its end is seen by polling", pid, exc)
                continue
            self._fds[pid] = fd
            loop.add_reader(fd, self._on_end, pid)
        return covered

    def _on_end(self, pid: int) -> None:
        self._drop(asyncio.get_running_loop(), pid)  # an ended process's pidfd stays readable: never read it twice
        self.ended.set()

    def _drop(self, loop: asyncio.AbstractEventLoop, pid: int) -> None:
        fd = self._fds.pop(pid)
        loop.remove_reader(fd)
        os.close(fd)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for pid in list(self._fds):
            self._drop(loop, pid)
