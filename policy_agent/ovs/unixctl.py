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
    requests = [ovs.jsonrpc.Message.create_request(command, list(args)) for command, args in commands]
    try:
        try:
            # All sent at once, then all answers read: the daemon answers each in turn, so the thread waits
            # for the daemon about once, not once per command.
            replies = _transact_all(conn, requests, deadline)
        except _Unanswered as exc:
            what = f"{commands[exc.index][0]} on {ctl_path}"
            if exc.errno == errno.ETIMEDOUT:
                raise OvsError(f"{what}: no reply within {timeout:g}s") from exc
            raise OvsError(f"{what}: {_reason(exc.errno)}") from exc
    finally:
        client.close()
    answers: list[str | OvsError] = []
    for (command, _), reply in zip(commands, replies):
        if reply.error is not None:
            answers.append(OvsError(f"{command} on {ctl_path} failed: {str(reply.error).strip()}"))
        else:
            answers.append("" if reply.result is None else str(reply.result))
    return answers


class _Unanswered(OSError):
    """The exchange failed (errno) while the request at `index` (the first unanswered) waited."""

    def __init__(self, error: int, index: int) -> None:
        super().__init__(error, _reason(error))
        self.index = index


def _transact_all(conn: Any, requests: list[Any], deadline: float) -> list[Any]:
    """The replies to `requests`, in their order; _Unanswered on a failed exchange or ETIMEDOUT."""
    import ovs.jsonrpc

    def first_unanswered() -> int:
        return next(i for i, r in enumerate(requests) if r.id not in replies)

    replies: dict[Any, Any] = {}
    for request in requests:
        error = conn.send(request)
        if error:
            raise _Unanswered(error, 0)
    while len(replies) < len(requests):
        error, reply = conn.recv()
        if error == errno.EAGAIN:
            if deadline - time.monotonic() <= 0:
                raise _Unanswered(errno.ETIMEDOUT, first_unanswered())
            _block(conn, deadline)
        elif error:
            raise _Unanswered(error, first_unanswered())
        elif reply is not None and reply.type in (ovs.jsonrpc.Message.T_REPLY, ovs.jsonrpc.Message.T_ERROR):
            replies[reply.id] = reply
    return [replies[r.id] for r in requests]


def _block(conn: Any, deadline: float) -> None:
    """Flush what is unsent and wait until the connection can be read, or the deadline."""
    import ovs.poller

    conn.run()
    poller = ovs.poller.Poller()
    conn.wait(poller)
    conn.recv_wait(poller)
    poller.timer_wait(max(1, int((deadline - time.monotonic()) * 1000)))
    poller.block()


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
