"""Run a function inside another network namespace without moving the caller's thread."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Callable, TypeVar

T = TypeVar("T")
_CLONE_NEWNET = 0x40000000


def netns_path(netns: str) -> str:
    """A name made by `ip netns add` (under /run/netns) or an absolute path to a netns file."""
    return netns if netns.startswith("/") else f"/run/netns/{netns}"


def call_in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """`fn()` with the calling thread in `netns` (None: here).

    setns() changes only the calling thread, so `fn` runs in a throwaway thread
    and the caller's namespace never changes. Its result or exception is handed back.
    """
    if netns is None:
        return fn()
    result: dict[str, object] = {}

    def worker() -> None:
        try:
            fd = os.open(netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            result["error"] = exc

    thread = threading.Thread(target=worker, name=f"netns-{netns}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["value"]  # type: ignore[return-value]
