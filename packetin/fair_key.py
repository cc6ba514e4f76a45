"""The fair-share key of a policy packet-in: (rule id, applied-to Pod), read off the raw packet-in.

The applied-to Pod is the one the rule protects: the sender of egress traffic (the
packet-in's in_port) and the receiver of ingress traffic (the frame's destination
address: the in_port is the sender's). Which way a rule points is the policy
layer's knowledge, so the agent passes `direction_of(rule_id)` in; it is asked
once per rule id and the answer kept.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Callable

from packetin.frames import destination_address
from packetin.model import PacketIn

__all__ = ["applied_to_key", "destination_address"]

_MAX_CACHED = 65536  # rule ids whose direction is kept; a full cache starts over


def applied_to_key(direction_of: Callable[[int], str | None]) -> Callable[[PacketIn], Hashable]:
    """The key function for FairShareSettings: (rule id, in_port) for egress rules, (rule id,
    destination address) for ingress rules, both when the direction is not known."""
    directions: dict[int, str] = {}

    def key(pin: PacketIn) -> Hashable:
        rule_id = pin.rule_id
        direction = directions.get(rule_id)
        if direction is None:
            direction = direction_of(rule_id) or ""
            if direction:  # an unknown rule may be known soon: ask again next time
                if len(directions) >= _MAX_CACHED:
                    directions.clear()
                directions[rule_id] = direction
        if direction == "egress":
            return (rule_id, pin.in_port)
        if direction == "ingress":
            return (rule_id, destination_address(pin.packet))
        return (rule_id, pin.in_port, destination_address(pin.packet))

    return key
