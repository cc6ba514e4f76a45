"""A logger wrapper that says the same thing at most once per interval, with a count."""

from __future__ import annotations

import logging
import time
from typing import Callable


class RateLimitedLog:
    """Logs at most once per `interval` per key; the next line says how many were held back."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        held = self._suppressed.pop(key, 0)
        self._last[key] = now
        if held:
            msg = f"{msg} ({held} similar messages suppressed)"
        self._logger.log(level, msg, *args, exc_info=exc_info)
