"""The event loop's wait after a quiet spell: a lone packet-in's record written from inside it.

After a quiet spell the event loop pays for its own turn before any callback runs (the selector's list, the
ready queue, the transport's read: ~100-120 µs of Python on cold caches, bench/RESULTS.md), and every line of
Python before a lone packet-in's write costs its record's latency tens of µs more. Issue 22 asks for a lone
packet's record readable within 0.6 ms at p50, where a reader that runs Python after its wake-up sits at 0.55-0.7
(the Python floor) and the same reader in C at ~0.45.

So the agent's event loop waits through QuietSelector (`new_event_loop`). Once the OpenFlow socket has brought
nothing for QUIET_AFTER, each wait first asks its source (the OpenFlow stream, packetin/connect.py) what a lone read
would find (`arm`: the C encoder's rules, Pod table and aggregator, the audit writer's chain head and file; None
when any layer would not take the read early), then waits in C (packetin/_quiet_fast.c): a wake-up that brings
the OpenFlow socket exactly one whole message has it encoded (encode_raw: nothing done unless it is a plain logged
packet-in whose record the layers would make), sealed and appended to the audit file before any Python runs, then
the thread asleep for 30 µs so that a reader the write woke runs first. Then, still inside the wait and before any
other callback, the source finishes the write (AuditWriter.lone_written) and handles the read as its lone read
(PacketInReader.lone: the decode, counts and aggregation, at the times it was read). What the C wait declines is
read by the loop as ever.

The arm stays true while the loop waits: nothing else runs on the loop's thread, admission only refills with
time, and the writer's state is checked again under its lock. Without the C module (no compiler) the loop is
asyncio's own, and new_event_loop says so (`QUIET`: "off" in npaudit_build_info); for a loop that is not this one
(a test's), nothing is armed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import select
import selectors
import time
import weakref
from typing import Any, Callable, Protocol

log = logging.getLogger(__name__)

try:
    from packetin import _quiet_fast
except ImportError:  # no compiler at install: the loop waits as asyncio's own does
    _quiet_fast = None  # type: ignore[assignment]

QUIET = "c" if _quiet_fast is not None else "off"
# Seconds without a read of the OpenFlow socket before a wait is armed: a wait armed after a read, with nothing
# else to do, wakes once more when this has passed, and a node whose packet-ins come closer than this (a flood;
# paced reads, their socket out of the poll set) never arms (an arm costs the layers' checks, ~10 µs).
QUIET_AFTER = 0.005

# (message, wall, mono, record, locked, line, written, errno): what the C wait did (packetin/_quiet_fast.c).
Early = tuple[bytes, float, float, Any, bool, "str | None", int, int]


class QuietSource(Protocol):
    """The OpenFlow stream as the wait sees it."""

    fd: int  # its socket (-1: none)

    def may_arm(self) -> bool:
        """Whether a lone read could be armed now at all (the socket in the poll set): cheap, asked per wait."""

    def last_read(self) -> float:
        """time.monotonic() of its last read."""

    def arm(self) -> tuple | None:
        """What a lone read would find now (packetin/_quiet_fast.c), else None."""

    def quiet_read(self, early: Early) -> None:
        """The read the wait made: its write finished, then handled as a lone read."""


class QuietSelector(selectors.EpollSelector):
    """asyncio's epoll selector, with the quiet wait (above) for its `source`."""

    def __init__(self) -> None:
        super().__init__()
        self.source: QuietSource | None = None
        self.armed_waits = 0  # waits armed
        self.quiet_reads = 0  # reads the armed wait took (its record written from inside it)
        self._wait: Callable[..., tuple[list[tuple[int, int]], Early | None]] | None = \
            _quiet_fast.wait if _quiet_fast is not None else None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        source, wait = self.source, self._wait
        if source is None or wait is None or timeout is not None and timeout <= 0 or not source.may_arm():
            return super().select(timeout)
        ready: list[tuple[selectors.SelectorKey, int]] = []
        start = time.monotonic()
        first = source.last_read() + QUIET_AFTER - start
        if first > 0:  # read lately: wait unarmed until it has been quiet QUIET_AFTER (or the timeout)
            if timeout is not None and timeout <= first:
                return super().select(timeout)
            ready = super().select(first)
            if ready or source is not self.source:
                return ready
        left = None if timeout is None else timeout - (time.monotonic() - start)
        if left is not None and left <= 0:
            return ready
        try:
            arm = source.arm()
        except Exception:  # a bug above: said, and the loop waits as asyncio's own would
            log.exception("the event loop's quiet wait could not be armed")
            arm = None
        if arm is None:
            return super().select(left)
        self.armed_waits += 1
        events, early = wait(self.fileno(), max(len(self.get_map()), 1), -1 if left is None else math.ceil(left * 1e3),
                             source.fd, arm)
        skip = -1
        if early is not None:
            self.quiet_reads += 1
            skip = source.fd
            source.quiet_read(early)  # may change the poll set (a paused read): the keys are looked up after
        keys = self.get_map()
        for fd, event in events:
            if fd == skip:
                continue
            key = keys.get(fd)
            if key is not None:
                mask = (selectors.EVENT_WRITE if event & ~select.EPOLLIN else 0) | \
                       (selectors.EVENT_READ if event & ~select.EPOLLOUT else 0)  # as EpollSelector.select
                ready.append((key, mask & key.events))
        return ready


_SELECTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, QuietSelector] = weakref.WeakKeyDictionary()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio event loop that waits through a QuietSelector (asyncio.Runner's loop_factory). Without the C module
    it is asyncio's own, and says so."""
    if _quiet_fast is None:
        log.warning("packetin._quiet_fast is not built (no compiler at install): a lone packet-in's record waits "
                    "for the event loop's turn after a quiet spell (~0.1-0.2 ms more; npaudit_build_info quiet_wait)")
        return asyncio.SelectorEventLoop(selectors.EpollSelector())
    selector = QuietSelector()
    loop = asyncio.SelectorEventLoop(selector)
    _SELECTORS[loop] = selector
    return loop


def selector_of(loop: asyncio.AbstractEventLoop) -> QuietSelector | None:
    """The QuietSelector `loop` waits through, None for any other loop (a test's, say: nothing is armed there)."""
    return _SELECTORS.get(loop) if _quiet_fast is not None else None
