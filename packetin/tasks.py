"""Stopping an asyncio task and waiting until it has really stopped, or leaving one behind."""

from __future__ import annotations

import asyncio
from typing import Any


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
