"""The one way the agent talks to an OVS daemon's unixctl socket (what ovs-appctl does, no subprocess).

Blocking: call it from a thread when on the event loop. Every failure (no socket, no
answer within the timeout, an error reply) raises OvsError naming the socket and command.
"""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path
from typing import Any, Sequence

from policy_agent.errors import OvsError

__all__ = ["call", "call_many", "vswitchd_version"]

DEFAULT_TIMEOUT = 5.0  # seconds for connecting and for the answer; a healthy vswitchd answers in milliseconds


def call(ctl_path: str | Path, command: str, args: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT) -> str:
    """The answer of the daemon at `ctl_path` to `command args...` (its text, as ovs-appctl prints it)."""
    (answer,) = call_many(ctl_path, [(command, args)], timeout)
    if isinstance(answer, OvsError):
        raise answer
    return answer


def call_many(ctl_path: str | Path, commands: Sequence[tuple[str, Sequence[str]]],
              timeout: float = DEFAULT_TIMEOUT) -> list[str | OvsError]:
    """The answers to several commands over one connection, in order (one connect, not one per command):
    an error reply is that command's OvsError in the list; no connection, or no answer within `timeout`
    (for them all), raises OvsError."""
    import ovs.jsonrpc
    import ovs.stream
    from ovs.unixctl.client import UnixctlClient

    names = ", ".join(command for command, _ in commands)
    deadline = time.monotonic() + timeout
    error, stream = ovs.stream.Stream.open_block(ovs.stream.Stream.open(f"unix:{ctl_path}"),
                                                 max(1, int(timeout * 1000)))
    if error:
        raise OvsError(f"{names} on {ctl_path}: cannot connect: {_reason(error)}")
    conn = ovs.jsonrpc.Connection(stream)
    client = UnixctlClient(conn)  # owns the connection: closing it closes the stream
    answers: list[str | OvsError] = []
    try:
        for command, args in commands:
            what = f"{command} on {ctl_path}"
            try:
                reply = _transact(conn, ovs.jsonrpc.Message.create_request(command, list(args)), deadline)
            except OSError as exc:
                if exc.errno == errno.ETIMEDOUT:
                    raise OvsError(f"{what}: no reply within {timeout:g}s") from exc
                raise OvsError(f"{what}: {_reason(exc.errno)}") from exc
            if reply.error is not None:
                answers.append(OvsError(f"{what} failed: {str(reply.error).strip()}"))
            else:
                answers.append("" if reply.result is None else str(reply.result))
    finally:
        client.close()
    return answers


def _transact(conn: Any, request: Any, deadline: float) -> Any:
    """The reply to `request` (UnixctlClient.transact with a deadline: the library's own waits
    forever for the answer); OSError with the errno of a failed exchange or ETIMEDOUT."""
    import ovs.jsonrpc
    import ovs.poller

    error = conn.send(request)
    while not error:
        error, reply = conn.recv()
        if error == errno.EAGAIN:
            left = deadline - time.monotonic()
            if left <= 0:
                error = errno.ETIMEDOUT
                break
            conn.run()
            poller = ovs.poller.Poller()
            conn.wait(poller)
            conn.recv_wait(poller)
            poller.timer_wait(max(1, int(left * 1000)))
            poller.block()
            error = 0
        elif not error and reply is not None and reply.id == request.id and reply.type in (
                ovs.jsonrpc.Message.T_REPLY, ovs.jsonrpc.Message.T_ERROR):
            return reply
    raise OSError(error, _reason(error))


def _reason(code: int | None) -> str:
    """The text of an errno from the ovs library (which says EOF, -1, for a connection the daemon closed)."""
    if code is None or code <= 0:
        return "the daemon closed the connection"
    return os.strerror(code)


_VERSION = re.compile(r"\(Open vSwitch\) (\S+)")


def vswitchd_version(ctl_path: str | Path, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """The running ovs-vswitchd's version (its unixctl `version`), None if it does not answer."""
    try:
        text = call(ctl_path, "version", timeout=timeout)
    except OvsError:
        return None
    found = _VERSION.search(text)
    return found[1] if found else text.strip() or None
