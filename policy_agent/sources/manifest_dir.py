"""A watched manifest directory: loaded at start, re-read when any file in it changes.

A change that does not validate is reported (naming object and field) and the
previous set stays in force; a valid one is applied, and objects that left the
directory are deleted.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable, Hashable, TypeVar

from packetin.tasks import cancel_and_wait
from policy_agent.policy.manifests import ManifestError, ObjectSet, load_path
from policy_agent.sources.sink import PolicySink

log = logging.getLogger(__name__)

_SUFFIXES = (".yaml", ".yml", ".json")

T = TypeVar("T")


def _fingerprint(directory: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        files = sorted(f for f in directory.iterdir() if f.suffix in _SUFFIXES and f.is_file())
    except OSError:
        return ()
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((f.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _gone(before: tuple[T, ...], after: tuple[T, ...], key: Callable[[T], Hashable]) -> list[T]:
    """What `before` held that `after` no longer does."""
    keep = {key(o) for o in after}
    return [o for o in before if key(o) not in keep]


class ManifestDirectory:
    """Polls one directory every `poll_interval` seconds and applies it as one set."""

    def __init__(self, directory: Path, engine: PolicySink, poll_interval: float) -> None:
        self.directory = directory
        self._engine = engine
        self._interval = poll_interval
        self._applied = ObjectSet()
        self._seen: tuple[tuple[str, int, int], ...] | None = None
        self.errors: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def sync(self) -> bool:
        """Load the directory if it changed; True when a new set was applied."""
        fingerprint = _fingerprint(self.directory)
        if fingerprint == self._seen:
            return False
        self._seen = fingerprint
        try:
            objs = await asyncio.to_thread(load_path, self.directory)
        except ManifestError as exc:
            self.errors = exc.errors
            for line in exc.errors:
                log.error("manifest directory %s rejected, previous policy stays: %s", self.directory, line)
            return False
        self.errors = []
        old = self._applied
        await self._engine.apply(objs.namespaces, objs.pods, objs.tiers, objs.policies)
        await self._engine.delete(_gone(old.namespaces, objs.namespaces, lambda o: o.name),
                                  _gone(old.pods, objs.pods, lambda o: o.key),
                                  _gone(old.tiers, objs.tiers, lambda o: o.name),
                                  _gone(old.policies, objs.policies, lambda o: o.key))
        self._applied = objs
        log.info("manifest directory %s: %d policies, %d pods, %d namespaces", self.directory,
                 len(objs.policies), len(objs.pods), len(objs.namespaces))
        return True

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="manifest-dir")

    async def close(self) -> None:
        await cancel_and_wait(self._task)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.sync()
            except Exception:  # keep watching: the next change may fix it
                log.exception("manifest directory %s: sync failed", self.directory)
