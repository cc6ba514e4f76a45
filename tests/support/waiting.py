"""Waiting for a condition in tests: one synchronous and one asyncio poller, both failing loudly.

A timeout here is a hang guard, never a speed claim: it is only reached when the behaviour
under test is broken, and the AssertionError says what was awaited.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

What = str | Callable[[], str]  # what was awaited, or a callable describing the state at timeout


def _describe(what: What) -> str:
    return what() if callable(what) else what


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: What = "condition", *,
             interval: float = 0.05) -> None:
    """Poll `predicate` every `interval` seconds (blocking); AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {_describe(what)}")
        time.sleep(interval)


async def eventually(predicate: Callable[[], bool], timeout: float = 2.0, what: What = "condition", *,
                     interval: float = 0.005) -> None:
    """Poll `predicate` every `interval` seconds, yielding to the event loop; AssertionError after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {_describe(what)}")
        await asyncio.sleep(interval)
