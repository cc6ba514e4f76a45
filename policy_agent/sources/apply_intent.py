"""An apply's intent, written before the switch takes it, and its settlement at the next start.

A change the applied store keeps goes in three steps: the store content it leads to, with
the next generation, is written durably as the intent (`applied.intent` in the state
directory); the switch takes the change's flows together with a generation marker
(ovs/tables.py: one flow whose cookie names the generation) in one atomic bundle; the
intent is renamed onto the store. An agent killed between the first and the last step
leaves the intent behind, and the switch (fail_mode=secure) enforces whichever policy it
holds while the agent is down. At the next start, before anything is installed,
`settle_at_start` reads the marker and makes the store agree with the switch:

- the switch holds the intent's generation: the change was in force, the intent becomes
  the store (rolled forward), and the restarted agent keeps enforcing it;
- anything else (an older marker, none at all): the change never took effect, the intent
  is discarded (rolled back).

Either way one line is logged and the settlement is kept for `npaudit status`, so an
`npaudit apply` that ended "outcome unknown" resolves to one answer, never to a change
enforced and then reverted behind the operator's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Protocol

from auditlog.atomic_file import commit, fsync_directory, write_atomically
from packetin import messages
from policy_agent.errors import AgentError
from policy_agent.ovs import tables
from policy_agent.sources.applied_store import FILE_MODE, AppliedStore, StoreChange, generation_of
# The settlement's outcomes and its line in `npaudit status` live in a module of their own (status reads them without
# this module's OpenFlow imports); re-exported here.
from policy_agent.sources.apply_outcome import NOTHING, ROLLED_BACK, ROLLED_FORWARD, describe  # noqa: F401

log = logging.getLogger(__name__)

INTENT_NAME = "applied.intent"
STORE_NAME = "applied.yaml"


# Test-only fault injection: seconds to wait after the switch took a change and before the
# intent becomes the store, so a test can kill the agent in that window for certain. Read only
# when set; never set it outside tests (every apply then waits that long).
PAUSE_BEFORE_STORE_ENV = "NPAUDIT_TEST_PAUSE_BEFORE_STORE"


def decide(intent: int | None, switch: int | None, store: int) -> tuple[str, str]:
    """(outcome, why) for an intent of generation `intent` (None: none left behind), the switch's
    marker `switch` (None: no marker flow; compared modulo 2**24, as the cookie keeps it) and the
    store's generation `store`."""
    if intent is None:
        return NOTHING, "no apply was interrupted"
    if intent <= store:
        return NOTHING, f"the store holds generation {store} already; intent {intent} was left over"
    if switch is not None and switch == intent & tables.GENERATION_MASK:
        return ROLLED_FORWARD, (f"OVS enforces generation {intent} (the interrupted apply): the store "
                                f"takes it, the change stays in force")
    held = "no generation marker" if switch is None else f"generation {switch}"
    return ROLLED_BACK, (f"OVS holds {held}, not the interrupted apply's {intent}: it never took effect, "
                         f"the store keeps generation {store}")


@dataclass(frozen=True)
class Settlement:
    """What the start-up settlement found and did (`npaudit status` shows it)."""

    outcome: str
    reason: str
    intent: int | None
    switch: int | None
    store: int
    time: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FlowStats(Protocol):
    async def multipart(self, msg: Any) -> list[bytes]: ...


async def switch_generation(channel: FlowStats) -> int | None:
    """The generation the switch's marker flow names; None when it has none."""
    parts = await channel.multipart(messages.flow_desc_request(tables.T_GENERATION))
    found = [tables.marker_generation(cookie) for table, _, cookie in messages.parse_flow_cookies(parts)
             if table == tables.T_GENERATION]
    return next((g for g in found if g is not None), None)


async def settle_at_start(state_dir: Path, read_switch: Callable[[], Awaitable[int | None]],
                          now: Callable[[], float] = time.time) -> Settlement:
    """Settle an apply a crash interrupted (see the module's docstring); call before the agent
    installs anything. AgentError when the switch cannot be asked or the store not written: an
    agent that guessed could revert a change in force, or keep one that never was."""
    intent_path, store_path = state_dir / INTENT_NAME, state_dir / STORE_NAME
    try:
        intent = await asyncio.to_thread(_generation, intent_path)
        store = await asyncio.to_thread(_generation, store_path) or 0
    except OSError as exc:
        raise AgentError(f"{state_dir}: cannot read the applied store or an apply's intent: {exc}") from exc
    switch = None
    if intent is not None and intent > store:
        try:
            switch = await read_switch()
        except Exception as exc:
            raise AgentError(f"{intent_path}: an apply was interrupted and OVS cannot be asked whether it "
                             f"took it ({exc or type(exc).__name__}); not starting rather than guessing") from exc
    outcome, why = decide(intent, switch, store)
    try:
        if outcome == ROLLED_FORWARD:
            await asyncio.to_thread(_put_in_place, intent_path, store_path)
        elif intent is not None:
            await asyncio.to_thread(_discard, intent_path)
    except OSError as exc:
        raise AgentError(f"{intent_path}: cannot settle the interrupted apply ({why}): {exc}") from exc
    if intent is not None:
        log.warning("apply of generation %d interrupted by the agent's end: %s: %s", intent,
                    outcome.replace("-", " "), why)
    kept = intent if outcome == ROLLED_FORWARD and intent is not None else store
    return Settlement(outcome, why, intent, switch, kept, now())


async def settled_store(state_dir: Path, channel: FlowStats) -> tuple[AppliedStore, Settlement]:
    """The applied store once an interrupted apply is settled against what the switch behind
    `channel` holds (the agent's start, before it installs anything)."""
    settlement = await settle_at_start(state_dir, lambda: switch_generation(channel))
    return await asyncio.to_thread(AppliedStore, state_dir / STORE_NAME), settlement


def _generation(path: Path) -> int | None:
    """The generation a store or intent file names; None when there is no such file."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return generation_of(f.readline())
    except FileNotFoundError:
        return None


def _put_in_place(intent: Path, store: Path) -> None:
    """The intent becomes the store (kept if that fails: the next start settles it again)."""
    os.replace(intent, store)
    fsync_directory(store.parent)


def _discard(path: Path) -> None:
    path.unlink(missing_ok=True)
    fsync_directory(path.parent)


class StoreIntent:
    """One apply or delete kept in the applied store, in the engine's three steps (engine.Durable).
    The store content is computed in `stage`, under the engine's lock, so concurrent changes
    each start from the one before."""

    def __init__(self, store: AppliedStore, op: str, text: str, known_tiers: Callable[[], Iterable[str]]) -> None:
        self._store = store
        self._op, self._text, self._tiers = op, text, known_tiers
        self._path = store.path.parent / INTENT_NAME
        self._change: StoreChange | None = None

    def stage(self) -> int:
        try:  # nothing is changed, in memory or on disk, when it fails
            change = self._store.change(self._op, self._text, self._tiers())
            self._path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self._path, change.content, mode=FILE_MODE)
        except Exception as exc:
            raise AgentError(f"applied store {self._store.path}: {exc}") from exc
        self._change = change
        return change.generation

    def commit(self) -> None:
        if self._change is None:
            raise AgentError("an apply's intent is committed only after it was staged")
        pause = os.environ.get(PAUSE_BEFORE_STORE_ENV)
        if pause:
            time.sleep(float(pause))
        try:
            commit(self._path, self._store.path)
        except OSError as exc:
            raise AgentError(f"applied store {self._store.path}: {exc}") from exc
        self._store.took(self._change)

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            _discard(self._path)


class StoreGeneration:
    """The store as it is (the start-up re-apply): nothing to write, its generation goes to the
    switch's marker in the same bundle as the flows it realises."""

    def __init__(self, store: AppliedStore) -> None:
        self._store = store

    def stage(self) -> int:
        return self._store.generation

    def commit(self) -> None:
        return None

    def abandon(self) -> None:
        return None
