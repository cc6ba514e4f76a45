"""What every policy source drives: the PolicyEngine's object methods, as a Protocol."""

from __future__ import annotations

from typing import Iterable, Protocol

from policy_agent.policy.model import Namespace, Pod, Policy, Tier


class PolicySink(Protocol):
    """Objects in (new or changed) and out; each call returns once the change is realised."""

    async def apply(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                    tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None: ...

    async def delete(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                     tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None: ...
