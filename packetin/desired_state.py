"""What the switch confirmed (flows, meters, groups): the channel replays it after every reconnect."""

from __future__ import annotations

from typing import Hashable, Sequence, TypeVar

from meters.ovs import MeterSpec
from packetin.errors import OpenFlowError
from packetin.messages import FlowSpec, GroupSpec
from packetin.refusals import raise_first

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class DesiredState:
    """Confirmed specs keyed by their OpenFlow identity; the replay order is meters, groups, flows
    (flows name meters and groups, so those must exist first)."""

    def __init__(self) -> None:
        self.flows: dict[tuple[object, ...], FlowSpec] = {}
        self.meters: dict[int, MeterSpec] = {}
        self.groups: dict[int, GroupSpec] = {}

    def __bool__(self) -> bool:
        return bool(self.meters or self.groups or self.flows)

    def describe(self) -> str:
        return f"{len(self.meters)} meters, {len(self.groups)} groups, {len(self.flows)} flows"


def settle(store: dict[K, V], keys: Sequence[K], installed: Sequence[V] | None,
           refused: dict[int, OpenFlowError]) -> None:
    """Bring the desired state in line with what the switch confirmed, then raise the
    first refusal. `installed` None = a delete: confirmed items leave the state;
    otherwise confirmed items enter it and refused ones leave it."""
    for i, key in enumerate(keys):
        if installed is None:
            if i not in refused:
                store.pop(key, None)
        elif i in refused:
            store.pop(key, None)
        else:
            store[key] = installed[i]
    raise_first(refused)
