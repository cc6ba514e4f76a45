"""What the switch confirmed (flows, meters): the channel replays it after every reconnect."""

from __future__ import annotations

from typing import Hashable, Sequence, TypeVar

from meters.ovs import MeterSpec
from packetin.errors import OpenFlowError
from packetin.messages import FlowSpec
from packetin.refusals import raise_first

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class DesiredState:
    """Confirmed specs keyed by their OpenFlow identity; the replay order is meters, then flows
    (flows name meters, so those must exist first)."""

    def __init__(self) -> None:
        self.flows: dict[tuple[object, ...], FlowSpec] = {}
        self.meters: dict[int, MeterSpec] = {}
        # Flows of a bundle whose commit got no answer (connection lost): the switch may hold
        # them or not; the next replay removes those that are not desired.
        self.in_doubt: dict[tuple[object, ...], FlowSpec] = {}

    def __bool__(self) -> bool:
        return bool(self.meters or self.flows)

    def describe(self) -> str:
        return f"{len(self.meters)} meters, {len(self.flows)} flows"

    def replay_flows(self) -> tuple[list[FlowSpec], list[FlowSpec]]:
        """(flows to install, flows to delete): one bundle of them takes a table that holds
        nothing, or the old flows plus those in doubt, to exactly the desired flows."""
        return list(self.flows.values()), [f for k, f in self.in_doubt.items() if k not in self.flows]

    def forget_refused(self, install: Sequence[FlowSpec], delete: Sequence[FlowSpec],
                       refused: dict[int, OpenFlowError]) -> None:
        """Drop what the switch refused in a replay (indexes: `install` then `delete`): it would
        refuse it again on every reconnect."""
        for i in refused:
            if i < len(install):
                self.flows.pop(install[i].key, None)
            else:
                self.in_doubt.pop(delete[i - len(install)].key, None)


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
