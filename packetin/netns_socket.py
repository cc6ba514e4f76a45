"""Open a socket inside another network namespace (e.g. to reach 127.0.0.1 of the OVS namespace)."""

from __future__ import annotations

import ctypes
import os
import socket
import threading

_CLONE_NEWNET = 0x40000000


def socket_in_netns(netns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """Create a socket that lives in network namespace `netns` (a name under /run/netns).

    setns() changes only the calling thread, so it runs in a throwaway thread:
    the caller's namespace never changes. The socket keeps its namespace for life.
    """
    result: dict[str, object] = {}

    def worker() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            result["sock"] = socket.socket(family, kind)
        except BaseException as exc:  # handed to the caller below
            result["error"] = exc
        finally:
            os.close(fd)

    t = threading.Thread(target=worker, name=f"netns-{netns}")
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["sock"]  # type: ignore[return-value]
