"""The one way to talk to ovs-vswitchd's unixctl socket (what `ovs-appctl` does): one command, one reply."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Sequence

from policy_agent.errors import OvsError

_VERSION = re.compile(r"\(Open vSwitch\) (\S+)")


def call(ctl_path: Path, command: str, args: Sequence[str] = (), timeout: float = 5.0) -> str:
    """The reply text of `command args...` on the unixctl socket `ctl_path`, within `timeout` seconds.

    OvsError naming the socket and the command when it cannot connect, the daemon answers
    with an error, or no reply comes in time. The exchange is UnixctlClient's
    (ovs.unixctl.client: one JSON-RPC request, its reply's result or error), with a deadline:
    UnixctlClient.create and transact would wait forever on a daemon that accepts and never answers.
    """
    import ovs.jsonrpc
    import ovs.poller
    import ovs.stream
    import ovs.timeval

    where = f"unixctl {ctl_path} {command}"
    deadline = ovs.timeval.msec() + max(0, int(timeout * 1000))
    error, stream = ovs.stream.Stream.open_block(ovs.stream.Stream.open(f"unix:{ctl_path}"),
                                                 max(0, int(timeout * 1000)))
    if error:
        raise OvsError(f"{where}: cannot connect ({os.strerror(error)})")
    conn = ovs.jsonrpc.Connection(stream)
    try:
        request = ovs.jsonrpc.Message.create_request(command, [str(arg) for arg in args])
        error = conn.send(request)
        reply = None
        while not error:
            error, reply = conn.recv()
            if error == errno.EAGAIN:
                if ovs.timeval.msec() >= deadline:
                    raise OvsError(f"{where}: no reply within {timeout:g}s")
                conn.run()
                poller = ovs.poller.Poller()
                conn.wait(poller)
                conn.recv_wait(poller)
                poller.timer_wait_until(deadline)
                poller.block()
                error, reply = 0, None
                continue
            if reply is not None and reply.type in (ovs.jsonrpc.Message.T_REPLY, ovs.jsonrpc.Message.T_ERROR) \
                    and reply.id == request.id:
                break
        if error or reply is None:
            raise OvsError(f"{where}: {os.strerror(error) if error > 0 else 'connection closed'}")
        if reply.error is not None:
            raise OvsError(f"{where}: {str(reply.error).strip()}")
        return str(reply.result)
    finally:
        conn.close()


def vswitchd_version(ctl_path: Path, timeout: float = 5.0) -> str | None:
    """The running ovs-vswitchd's version (its unixctl `version`), None if it does not answer."""
    try:
        text = call(ctl_path, "version", timeout=timeout)
    except OvsError:
        return None
    found = _VERSION.search(text)
    return found[1] if found else text.strip() or None
