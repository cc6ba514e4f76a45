"""A hand-moved clock for tests: code under test reads it where it would read time.monotonic or time.time."""

from __future__ import annotations


class ManualClock:
    """A clock that moves only when the test says so; call it for the time."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
