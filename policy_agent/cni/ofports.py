"""OpenFlow port numbers the CNI server chooses for Pod ports itself (OVSDB `ofport_request`), so a
Pod's flows can be installed while vswitchd is still adding its port."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

log = logging.getLogger(__name__)

# OFPP_MAX is 0xff00: numbers above it are reserved. Below FIRST are left to ports vswitchd
# numbers itself (it counts from 1), so a port someone else adds rarely takes one of ours.
FIRST = 100
LAST = 0xFEFF


class OfportPool:
    """Free numbers in [first, last]: not held by a Pod (READY or ATTACHED state, or an ADD in
    flight) and not seen in OVSDB. `in_use` reads those at the first take(), in that thread.
    Numbers are handed out round-robin, so one just freed is the last to come back: vswitchd
    removes a deleted port a little after OVSDB committed the deletion."""

    def __init__(self, in_use: Callable[[], Iterable[int]], first: int = FIRST, last: int = LAST) -> None:
        self._in_use = in_use
        self._first, self._last = first, last
        self._lock = threading.Lock()
        self._held: set[int] | None = None  # None until seeded
        self._next = first

    def take(self) -> int:
        with self._lock:
            held = self._seeded()
            size = self._last - self._first + 1
            if len(held) >= size:
                raise RuntimeError(f"no free OpenFlow port number in {self._first}..{self._last}")
            n = self._next
            while n in held:
                n = n + 1 if n < self._last else self._first
            held.add(n)
            self._next = n + 1 if n < self._last else self._first
            return n

    def hold(self, n: int) -> None:
        """`n` is in use (a number vswitchd gave instead of the requested one, or another's)."""
        with self._lock:
            self._seeded().add(n)

    def release(self, n: int) -> None:
        with self._lock:
            if self._held is not None:
                self._held.discard(n)

    def _seeded(self) -> set[int]:
        if self._held is None:
            held = {n for n in self._in_use() if self._first <= n <= self._last}
            self._held = held
            if held:
                top = max(held)
                self._next = top + 1 if top < self._last else self._first
            log.info("OpenFlow port numbers: %d of %d..%d in use", len(held), self._first, self._last)
        return self._held
