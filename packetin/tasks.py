"""Stopping an asyncio task and waiting until it has really stopped, or leaving one behind; threads the
kernel knows by name."""

from __future__ import annotations

import asyncio
import threading
from contextlib import suppress
from typing import Any

OS_NAME_MAX = 15  # bytes of a thread's name the kernel keeps (TASK_COMM_LEN - 1)
_PREFIX = "npaudit-"


async def cancel_and_wait(task: "asyncio.Task[object] | None") -> None:
    """Cancel `task` (if any) and wait for it to finish; its cancellation is not re-raised."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for `event` at most `timeout` seconds: True if it is set, False on timeout.

    Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives while the
    event's waiter is finishing (it returns the waiter's result instead of raising), and a
    loop around it then never stops (a test caught the audit window timer doing so).
    asyncio.timeout waits in the calling task itself and tells its own expiry from a cancel.
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
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
