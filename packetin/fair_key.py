"""The fair-share key of a policy packet-in: (rule id, applied-to Pod), read off the raw packet-in.

The applied-to Pod is the one the rule protects: the sender of egress traffic (the
packet-in's in_port) and the receiver of ingress traffic (the frame's destination
address: the in_port is the sender's). Which way a rule points is the policy
layer's knowledge, so the agent passes `direction_of(rule_id)` in; it is asked
once per rule id and the answer kept. The demux asks for a read's keys in one call
(`AppliedToKey.keys`, in C where packetin/_layout_fast.c is built).
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Callable

from packetin.frames import destination_address
from packetin.layouts import pure_python
from packetin.model import PacketIn

try:
    from packetin._layout_fast import applied_to_keys as _c_applied_to_keys
except ImportError:  # not built: the keys one by one in Python (packetin/layouts.py says it is not built)
    _c_applied_to_keys = None  # type: ignore[assignment]

__all__ = ["AppliedToKey", "applied_to_key", "destination_address"]

_MAX_CACHED = 65536  # rule ids whose direction is kept; a full cache starts over
# The directions kept, as these very objects: the C keys (packetin/_layout_fast.c) tell them apart by identity.
EGRESS, INGRESS = sys.intern("egress"), sys.intern("ingress")
_PIN_TYPE = PacketIn
_RULE, _IN_PORT, _PACKET = (PacketIn._fields.index(f) for f in ("rule_id", "in_port", "packet"))


class AppliedToKey:
    """The key function for FairShareSettings: (rule id, in_port) for egress rules, (rule id, destination
    address) for ingress rules, both when the direction is not known. `keys(pins)` gives a read's keys at once
    (packetin/demux.py): in C where built, the same keys (an equal key in a run is the same object)."""

    __slots__ = ("_direction_of", "_directions", "keys")

    def __init__(self, direction_of: Callable[[int], str | None], *, fast: bool | None = None) -> None:
        """`fast`: the C keys (None: where built and NPAUDIT_PURE_PYTHON is not set)."""
        self._direction_of = direction_of
        self._directions: dict[int, str] = {}
        c = _c_applied_to_keys if (fast if fast is not None else not pure_python()) else None
        if fast and c is None:
            raise RuntimeError("packetin._layout_fast is not built")
        self.keys: Callable[[list[PacketIn]], list[Hashable]]
        if c is None:
            self.keys = self._py_keys
        else:
            directions = self._directions

            def keys(pins: list[PacketIn]) -> list[Hashable]:
                return c(pins, directions, EGRESS, INGRESS, self, _PIN_TYPE, _RULE, _IN_PORT, _PACKET)
            self.keys = keys

    def __call__(self, pin: PacketIn) -> Hashable:
        rule_id = pin.rule_id
        directions = self._directions
        direction = directions.get(rule_id)
        if direction is None:
            direction = self._direction_of(rule_id) or ""
            if direction:  # an unknown rule may be known soon: ask again next time
                if len(directions) >= _MAX_CACHED:
                    directions.clear()
                direction = directions[rule_id] = EGRESS if direction == EGRESS else INGRESS \
                    if direction == INGRESS else direction
        if direction is EGRESS:
            return (rule_id, pin.in_port)
        if direction is INGRESS:
            return (rule_id, destination_address(pin.packet))
        return (rule_id, pin.in_port, destination_address(pin.packet))

    def _py_keys(self, pins: list[PacketIn]) -> list[Hashable]:
        return list(map(self, pins))


def applied_to_key(direction_of: Callable[[int], str | None]) -> AppliedToKey:
    """The fair-share key of a policy packet-in (see AppliedToKey); `direction_of(rule_id)`: "egress",
    "ingress" or None (not known: asked again next time)."""
    return AppliedToKey(direction_of)
