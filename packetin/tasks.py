"""Stopping an asyncio task and waiting until it has really stopped."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: "asyncio.Task[object] | None") -> None:
    """Cancel `task` (if any) and wait for it to finish; its cancellation is not re-raised."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
