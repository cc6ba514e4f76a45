"""The metrics listener's limits, decided without I/O: the descriptor budget, which connections stay, backoff.

Every method takes `now`; the listener's loop (policy_agent.http.endpoints) does the I/O.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import NamedTuple, Protocol

ANSWER_TIMEOUT = 30.0  # seconds a request may wait for the worker's exposition
# Seconds a connection that has sent nothing yet is passed over at the cap while another can make room: a
# client between its connect() and its request (a kubelet probe whose process waits for a CPU) is not pushed
# out by a flood of half-sent requests. The kubelet's probe timeout (1 s): a request later than that failed anyway.
FIRST_BYTE_GRACE = 1.0
BACKOFF_MIN, BACKOFF_MAX = 0.05, 1.0  # seconds accepting pauses after an accept error, doubling


class LimitSettings(Protocol):
    """The listener's settings as it reads them: ListenerLimits, or the agent's MetricsConfig."""

    @property
    def max_connections(self) -> int: ...

    @property
    def fd_reserve(self) -> int: ...

    @property
    def request_timeout(self) -> float: ...

    @property
    def idle_timeout(self) -> float: ...


@dataclass(frozen=True)
class ListenerLimits:
    """The metrics: section's listener settings (config/npaudit.yaml documents each)."""

    max_connections: int = 64
    fd_reserve: int = 128
    request_timeout: float = 10.0
    idle_timeout: float = 3.0


class Budget(NamedTuple):
    """What RLIMIT_NOFILE leaves the listener."""

    cap: int  # connections kept at once
    refuse_fd: int  # an accepted descriptor numbered this or higher is in the agent's reserve


def descriptor_budget(soft_limit: int, limits: LimitSettings) -> Budget:
    """The connection cap and the first reserved descriptor for a soft RLIMIT_NOFILE (RLIM_INFINITY: no limit).

    The reserve is at most half the limit, so a tiny limit still leaves probes a few connections.
    """
    if soft_limit == resource.RLIM_INFINITY or soft_limit <= 0:
        return Budget(limits.max_connections, 1 << 62)
    reserve = min(limits.fd_reserve, soft_limit // 2)
    usable = soft_limit - reserve
    return Budget(max(2, min(limits.max_connections, usable)), usable)


READING, WAITING, WRITING = "reading", "waiting", "writing"


@dataclass
class Slot:
    opened: float
    active: float  # the last byte received or sent
    state: str = READING  # reading the request head, waiting for the exposition, writing the answer
    heard: bool = False  # a byte came in


class Admission(NamedTuple):
    admitted: bool
    evict: int | None = None  # the connection to close first to make room


class ConnectionTable:
    """Which connections the listener keeps and when each must go; `now` is always passed in."""

    def __init__(self, cap: int, limits: LimitSettings, answer_timeout: float = ANSWER_TIMEOUT,
                 first_byte_grace: float = FIRST_BYTE_GRACE) -> None:
        self.cap = cap
        self._grace = first_byte_grace
        self._request_timeout = limits.request_timeout
        self._idle_timeout = limits.idle_timeout
        self._answer_timeout = answer_timeout
        self._slots: dict[int, Slot] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: int) -> bool:
        return key in self._slots

    def admit(self, key: int, now: float) -> Admission:
        """Take `key`; at the cap, the least recently active connection not waiting for the worker makes room.

        One that has sent nothing yet and is younger than the first-byte grace goes only when every other
        could not: a flood of half-sent requests pushes out its own, not a client about to send its request.
        (A flood of connections that send nothing is the old order: the oldest goes first.)
        """
        evict = None
        if len(self._slots) >= self.cap:
            idle = [(slot.active, k, self._in_grace(slot, now)) for k, slot in self._slots.items()
                    if slot.state != WAITING]
            if not idle:
                return Admission(False)
            evict = min(idle, key=lambda c: (c[2], c[0], c[1]))[1]
            del self._slots[evict]
        self._slots[key] = Slot(now, now)
        return Admission(True, evict)

    def _in_grace(self, slot: Slot, now: float) -> bool:
        return not slot.heard and now - slot.opened < self._grace

    def moved(self, key: int, now: float, state: str | None = None, heard: bool = False) -> None:
        """Bytes went in (`heard`) or out of `key` (and it is now in `state`, if given)."""
        slot = self._slots[key]
        slot.active = now
        slot.heard = slot.heard or heard
        if state is not None:
            slot.state = state

    def remove(self, key: int) -> None:
        self._slots.pop(key, None)

    def _deadline(self, slot: Slot) -> tuple[float, str]:
        if slot.state == WAITING:
            return slot.active + self._answer_timeout, "answer_timeout"
        idle = (slot.active + self._idle_timeout, "idle_timeout")
        if slot.state == READING:
            return min(idle, (slot.opened + self._request_timeout, "request_timeout"))
        return idle

    def expired(self, now: float) -> list[tuple[int, str]]:
        """The connections past a deadline, with the reason; removed from the table."""
        gone = []
        for key, slot in self._slots.items():
            at, reason = self._deadline(slot)
            if at <= now:
                gone.append((key, reason))
        for key, _ in gone:
            del self._slots[key]
        return gone

    def next_deadline(self) -> float | None:
        return min((self._deadline(slot)[0] for slot in self._slots.values()), default=None)


class AcceptBackoff:
    """How long accepting pauses after accept() failed: BACKOFF_MIN, doubling to BACKOFF_MAX; reset on success."""

    def __init__(self) -> None:
        self._delay = 0.0

    def failed(self) -> float:
        self._delay = BACKOFF_MIN if not self._delay else min(BACKOFF_MAX, self._delay * 2)
        return self._delay

    def succeeded(self) -> None:
        self._delay = 0.0
