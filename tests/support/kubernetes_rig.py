"""A KubernetesSource rig for the source's tests: a fake engine that records what the source applies, a
fake clock, and the source wired to the fake API server (tests/support/fake_apiserver.py)."""
from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import Any, Coroutine

from kubernetes import client

from policy_agent.sources.kubernetes import KubernetesSource
from policy_agent.sources.kubernetes_watch import backoff_delay
from policy_agent.policy.model import Namespace, Pod, Policy, Tier
from tests.support.fake_apiserver import FakeApiServer
from tests.support.fake_apiserver import server  # noqa: F401 (fixture)

NODE = "node-a"  # the node the source runs on


# --- fake engine --------------------------------------------------------------------------

class FakeEngine:
    """The engine's state as a user would query it, plus every call for ordering checks."""

    def __init__(self) -> None:
        self.namespaces: dict[str, Namespace] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.tiers: dict[str, Tier] = {}
        self.policies: dict[tuple[str, str, str], Policy] = {}
        self.calls: list[tuple[str, list[Any]]] = []

    async def apply(self, namespaces: Any = (), pods: Any = (), tiers: Any = (), policies: Any = ()) -> None:
        objs = [*namespaces, *pods, *tiers, *policies]
        self.calls.append(("apply", objs))
        for o in objs:
            self._store(o)[self._key(o)] = o

    async def delete(self, namespaces: Any = (), pods: Any = (), tiers: Any = (), policies: Any = ()) -> None:
        objs = [*namespaces, *pods, *tiers, *policies]
        self.calls.append(("delete", objs))
        for o in objs:
            self._store(o).pop(self._key(o), None)

    def _store(self, o: Any) -> dict[Any, Any]:
        return {Namespace: self.namespaces, Pod: self.pods, Tier: self.tiers, Policy: self.policies}[type(o)]

    @staticmethod
    def _key(o: Any) -> Any:
        return o.name if isinstance(o, (Namespace, Tier)) else o.key

    def deleted(self) -> list[Any]:
        return [o for op, objs in self.calls if op == "delete" for o in objs]


# --- helpers ------------------------------------------------------------------------------

def run(coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
    """asyncio.run with a hard cap, so a hang fails the test instead of the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


JITTER = 0.5  # the source's rand(): backoff delays and watch timeouts are then exact


class FakeTime:
    """The watchers' clock and wait: the clock moves only when the test advances it, and
    every wait (backoff, absent-CRD recheck) is recorded per resource, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        resource = threading.current_thread().name.removeprefix("k8s-watch-")
        with self._lock:
            self.waits[resource].append(seconds)
        # A moment of real time only so a retry loop does not hog the interpreter.
        return stop.wait(0.002)


def fake_time_source(api: client.ApiClient, engine: FakeEngine, fake: FakeTime, **kw: Any) -> KubernetesSource:
    return KubernetesSource(api, engine, node_name=NODE, clock=fake.monotonic, wait=fake.wait,
                            rand=lambda: JITTER, **kw)


def backoffs(n: int, cap: float = 30.0) -> list[float]:
    """The first n retry delays the source must wait, in order."""
    return [backoff_delay(i, cap, lambda: JITTER) for i in range(1, n + 1)]


def watch_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("k8s-watch-")}


class Rig:
    def __init__(self, server: FakeApiServer, **kw: Any) -> None:
        cfg = client.Configuration(host=server.url)
        cfg.proxy = None  # loopback only, whatever the environment says
        self.api = client.ApiClient(cfg)
        self.engine = FakeEngine()
        self.time = FakeTime()
        self.source = fake_time_source(self.api, self.engine, self.time, **kw)
        self.server = server

    async def __aenter__(self) -> Rig:
        self.source.start()
        # The first client call of a process builds the client's validators (about 1 s).
        await asyncio.wait_for(self.source.synced.wait(), 20.0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.source.close()
        self.api.close()

    def stat(self, resource: str, what: str) -> int:
        return self.source.stats[resource][what]
