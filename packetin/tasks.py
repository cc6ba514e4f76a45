"""Stopping an asyncio task and waiting until it has really stopped, or leaving one behind; waiting with a
time limit that never swallows a cancel; threads the kernel knows by name.

Not asyncio.wait_for anywhere in the agent: on Python 3.11 it swallows a cancellation that arrives while what it
waits for is finishing (it returns that result instead of raising). A task looping around it then never stops,
and whoever awaits that task's end waits for ever: the agent once stayed up 35 s after SIGTERM, its loss
accounting task still ticking (a channel request's reply and the stop's cancel in the same loop turn). `within`
and `wait_event` wait in the calling task itself under asyncio.timeout, which tells its own expiry from a cancel;
tests/unit/project/test_no_wait_for.py keeps wait_for out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import suppress
from typing import Any, Awaitable, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# Seconds a cancelled task is given to end before it is cancelled again (and an ERROR says it did not end).
CANCEL_AGAIN_AFTER = 1.0

OS_NAME_MAX = 15  # bytes of a thread's name the kernel keeps (TASK_COMM_LEN - 1)
_PREFIX = "npaudit-"


async def cancel_and_wait(task: "asyncio.Task[object] | None", again_after: float = CANCEL_AGAIN_AFTER) -> None:
    """Cancel `task` (if any) and wait for it to finish; its cancellation is not re-raised, an exception it
    ended with is. A task still running `again_after` seconds after its cancel swallowed it somewhere (a
    library's wait_for, say): an ERROR names it and it is cancelled again, until it ends, so a stop that
    waits for it ends too."""
    if task is None:
        return
    task.cancel()
    while not task.done():
        await asyncio.wait({task}, timeout=again_after)
        if not task.done():
            log.error("task %r still running %g s after it was cancelled (its cancel was swallowed): "
                      "cancelled again", task.get_name(), again_after)
            task.cancel()
    if not task.cancelled():
        task.result()  # what it failed with, if it did


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`awaitable`'s result, or TimeoutError after `timeout` seconds (None: no limit); asyncio.wait_for without
    its swallowed cancel (above). It waits in the calling task: a future or task it waits for is cancelled
    with it, as wait_for's is."""
    async with asyncio.timeout(timeout):
        return await awaitable


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for `event` at most `timeout` seconds: True if it is set, False on timeout. Not wait_for (above): a
    test caught the audit window timer's loop around it never stopping."""
    try:
        await within(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


def forget(future: "asyncio.Future[Any]") -> None:
    """`future` is not waited for (a step left behind, a thread that outlives its caller): its end, whenever
    it comes, is read here, so asyncio does not log its exception as never retrieved."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


def os_thread_name(name: str) -> str:
    """The kernel's name for a thread called `name`: without the npaudit- prefix (the process says whose it is),
    cut to what the kernel keeps."""
    return name.removeprefix(_PREFIX).encode("ascii", "replace")[:OS_NAME_MAX].decode("ascii")


class AgentThread(threading.Thread):
    """A thread that gives its name to the kernel as well (/proc/<pid>/task/<tid>/comm): `top -H`, `ps -L`,
    perf and the benches' per-thread CPU then tell the agent's threads apart. Python 3.11 names only its
    own Thread object, so every thread would show as the process's name."""

    def run(self) -> None:
        with suppress(OSError):  # not Linux, or /proc not mounted: the thread runs all the same
            with open("/proc/thread-self/comm", "w", encoding="ascii") as comm:
                comm.write(os_thread_name(self.name))
        super().run()
