"""What a demux subscriber is (packetin/demux.py), and handlers made of others."""

from __future__ import annotations

from typing import Any, Callable

from packetin.groups import PacketInGroup
from packetin.model import PacketIn

Handler = Callable[[PacketIn], None]
# handle_run(items, start, end, failed) -> (stop, failures): items[start:stop] handled as the handler would have
# each one by one, stop at the first PacketInGroup (or end); `failed` called inside each failure's except.
RunHandler = Callable[[list[Any], int, int, Callable[[], None]], tuple[int, int]]


def one_by_one(handler: Handler) -> Callable[[PacketInGroup], None]:
    """A handle_group for a handler without one: each packet-in of the group to it."""
    def handle_group(group: PacketInGroup) -> None:
        for pin in group.packet_ins():
            handler(pin)
    return handle_group


def chain_handlers(first: Handler, then: Handler | None) -> Handler:
    """One subscriber calling `first`, then `then` (a debug tap) when there is one."""
    if then is None:
        return first

    def both(pin: PacketIn) -> None:
        first(pin)
        then(pin)
    return both
