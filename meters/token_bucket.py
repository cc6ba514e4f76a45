"""A token bucket that never reads the clock: every call is given `now`."""

from __future__ import annotations

import math


class TokenBucket:
    """Admits `rate` items per second on average and bursts of up to `burst`.

    The bucket starts full. `now` is any monotonic time in seconds; the caller
    owns the clock, so tests drive it without sleeping.
    """

    __slots__ = ("rate", "burst", "_tokens", "_last")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        # Written as "not (ok)" so that NaN, which compares False to everything, is refused.
        if not (0 < rate < math.inf):
            raise ValueError(f"token bucket rate must be a finite number > 0, got {rate}")
        if not (1 <= burst < math.inf):
            raise ValueError(f"token bucket burst must be a finite number >= 1, got {burst}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last = now

    def take(self, now: float, n: float = 1.0) -> bool:
        """Take `n` tokens if there are that many; a clock going backwards adds none."""
        elapsed = now - self._last
        if elapsed > 0:
            tokens = self._tokens + elapsed * self.rate
            self._tokens = tokens if tokens < self.burst else self.burst
            self._last = now
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def take_up_to(self, now: float, n: int) -> int:
        """Take as many whole tokens as are there, at most `n`; return how many."""
        elapsed = now - self._last
        if elapsed > 0:
            tokens = self._tokens + elapsed * self.rate
            self._tokens = tokens if tokens < self.burst else self.burst
            self._last = now
        got = min(n, int(self._tokens))
        if got > 0:
            self._tokens -= got
            return got
        return 0

    def tokens(self, now: float) -> float:
        """Tokens available at `now`, without taking any."""
        elapsed = max(0.0, now - self._last)
        return min(self.burst, self._tokens + elapsed * self.rate)
