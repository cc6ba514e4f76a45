"""Time under the test's control: a hand-moved clock, a sleep that takes no wall time, a fixed jitter.

Code under test reads these where it would read time.monotonic, await asyncio.sleep or draw
from random, so timers, keepalives and backoffs are tested without sleeping.
"""

from __future__ import annotations

import asyncio
import random


class ManualClock:
    """A clock that moves only when the test says so; call it for the time."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ManualSleep:
    """An asyncio.sleep stand-in: every call is recorded in `delays`; a call for at most
    `instant` seconds returns at once (after one turn of the event loop), moving `clock` (if
    given) by its delay; a longer one waits until the test calls `wake`. No call ever waits
    on the wall clock."""

    def __init__(self, instant: float = 0.0, clock: ManualClock | None = None) -> None:
        self.instant = instant
        self.clock = clock
        self.delays: list[float] = []
        self._parked: list[asyncio.Future[None]] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if seconds <= self.instant:
            if self.clock is not None:
                self.clock.advance(seconds)
            await asyncio.sleep(0)
            return
        parked = asyncio.get_running_loop().create_future()
        self._parked.append(parked)
        try:
            await parked
        finally:
            if parked in self._parked:
                self._parked.remove(parked)

    @property
    def parked(self) -> int:
        """How many calls are waiting for `wake`."""
        return len(self._parked)

    async def wake(self, timeout: float = 2.0) -> None:
        """End every waiting call, once at least one is waiting (AssertionError after `timeout`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._parked:
            if loop.time() > deadline:
                raise AssertionError(f"nothing slept within {timeout}s")
            await asyncio.sleep(0.001)
        for parked in self._parked:
            if not parked.done():
                parked.set_result(None)
        self._parked.clear()


class FixedJitter(random.Random):
    """A random source whose random() is always `value`: jittered delays become exact."""

    def __init__(self, value: float = 0.5) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value
