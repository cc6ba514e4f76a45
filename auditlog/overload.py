"""Overload mode of the audit pipeline: when to trade record detail for keeping up, never counts.

Above `high_mark` (how full the pipeline's input or output queue is, 0..1) the pipeline
aggregates with a key without ports; above `peers_mark` also without the peer (the
end the rule does not protect); at or below `low_mark` it returns to full detail. In
between it keeps its level (hysteresis), except that PEERS steps back to PORTS once
below `high_mark`. `pressed()` (optional) is input pressure that the queues do not show yet
(the OpenFlow reader's reads coming back full, packetin/reader.py): while it is True the
level is at least PORTS, as if the backlog were at `high_mark` (so PEERS holds while it lasts). The clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FULL, PORTS, PEERS = 0, 1, 2
LEVEL_NAMES = ("full", "ports", "peers")  # npaudit.aggregate.coarsened says "ports" or "peers"


@dataclass(frozen=True)
class OverloadStats:
    level: int
    entered: int      # times the pipeline left full detail
    seconds: float    # time spent coarsened, up to the last update
    entered_pressed: int = 0  # of `entered`, times input pressure left it, with both queues below high_mark


class Overload:
    """The level of detail, from `backlog()` (0..1) each time `update(now)` is called."""

    def __init__(self, backlog: Callable[[], float], *, high_mark: float, peers_mark: float,
                 low_mark: float, pressed: Callable[[], bool] | None = None) -> None:
        if not 0 <= low_mark < high_mark <= peers_mark:
            raise ValueError(f"overload marks need 0 <= low < high <= peers, got {low_mark}, {high_mark}, {peers_mark}")
        self._backlog = backlog
        self._pressed = pressed
        self.pressed_updates = 0  # updates at which input pressure held the level up
        self.high_mark, self.peers_mark, self.low_mark = high_mark, peers_mark, low_mark
        self.level = FULL
        self.entered = 0
        self.entered_pressed = 0
        self._seconds = 0.0
        self._since: float | None = None  # when the current coarse spell started

    def update(self, now: float) -> int:
        fill = self._backlog()
        pressed = fill < self.high_mark and self._pressed is not None and self._pressed()
        if pressed:
            fill = self.high_mark
            self.pressed_updates += 1
        level = self.level
        if fill >= self.peers_mark:
            new = PEERS
        elif fill >= self.high_mark:
            new = PEERS if level == PEERS else PORTS
        elif fill <= self.low_mark:
            new = FULL
        else:
            new = FULL if level == FULL else PORTS
        if new != level:
            if level == FULL:
                self.entered += 1
                self.entered_pressed += pressed
                self._since = now
            elif new == FULL and self._since is not None:
                self._seconds += max(0.0, now - self._since)
                self._since = None
            self.level = new
        return new

    def stays_full(self) -> bool:
        """Whether update() now would keep full detail, asked without update's side effects: at FULL, the backlog
        under high_mark, and no input pressure (a `pressed` that can say so without side effects: its `quiet`)."""
        if self.level != FULL or self._backlog() >= self.high_mark:
            return False
        quiet = getattr(self._pressed, "quiet", None)
        return self._pressed is None or (quiet is not None and quiet())

    def stats(self, now: float) -> OverloadStats:
        ongoing = max(0.0, now - self._since) if self._since is not None else 0.0
        return OverloadStats(self.level, self.entered, self._seconds + ongoing, self.entered_pressed)
