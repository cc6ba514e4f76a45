"""List+watch of one Kubernetes resource on a thread of its own, fed into a bounded asyncio queue.

The thread does only the blocking client calls: list (following continue tokens),
then watch from the list's resourceVersion, resuming from the last event seen.
It hands the event loop a Snapshot (a full list), an Event, or Absent (the
server does not serve the resource). An expired resourceVersion (410) means
relist; a connection failure means retry with jittered exponential backoff; a
CRD the server does not serve (404) is checked again quietly. Time is injected
(clock, wait, rand) so the retry logic is testable without sleeping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from packetin.tasks import AgentThread

log = logging.getLogger(__name__)

BACKOFF_BASE = 0.2           # seconds before the first retry (then doubling, jittered, capped)
CONNECT_TIMEOUT = 10.0
LIST_READ_TIMEOUT = 60.0
WATCH_TIMEOUT = (300, 600)   # server-side watch timeout, drawn per watch like client-go's reflector
WATCH_READ_GRACE = 30.0      # a watch silent this long past its server timeout is a dead connection
SHORT_WATCH = 1.0            # a watch ending this fast with no event is treated as a failure

Clock = Callable[[], float]                      # monotonic seconds
Wait = Callable[[threading.Event, float], bool]  # block up to seconds or until the event is set; True if set


def backoff_delay(failures: int, cap: float, rand: Callable[[], float], base: float = BACKOFF_BASE) -> float:
    """Seconds to wait after `failures` consecutive failures: exponential, capped, jittered
    into [ceiling/2, ceiling] so agents of a whole cluster do not retry in step."""
    ceiling = min(cap, base * 2 ** min(max(failures, 1) - 1, 32))
    return ceiling / 2 + rand() * ceiling / 2


@dataclass(frozen=True)
class ListCall:
    """How to list (and, with watch=True, watch) one resource with the kubernetes client."""

    name: str             # for logs: kubectl's resource name
    list_fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    crd: bool = False     # may be absent from the server (Antrea not installed)
    # What of each object is kept (list items and watch events alike, as each page arrives): a
    # cluster's 10,000 Pods are never all held in full at once. Must keep metadata.resourceVersion.
    trim: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Snapshot:
    """A complete list of the resource."""

    items: list[dict[str, Any]]


@dataclass(frozen=True)
class Event:
    """One watch event (ADDED, MODIFIED, DELETED) with the object as the server sent it."""

    type: str
    obj: dict[str, Any]


class Absent:
    """The server does not serve the resource: treated as an empty list."""


Item = Snapshot | Event | Absent


class _Stopped(Exception):
    pass


def _resource_version(doc: Mapping[str, Any]) -> str | None:
    meta = doc.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


class ResourceWatcher:
    """One resource's list+watch thread. `queue` is filled with Items; a full queue blocks the
    thread (backpressure, nothing dropped). `on_failure` runs on the event loop per failed call."""

    def __init__(self, call: ListCall, queue: asyncio.Queue[Item], on_failure: Callable[[], None], *,
                 backoff_max: float, page_size: int, clock: Clock, wait: Wait,
                 rand: Callable[[], float]) -> None:
        self.call = call
        self._queue = queue
        self._on_failure = on_failure
        self._backoff_max = backoff_max
        self._page_size = page_size
        self._clock = clock
        self._wait = wait
        self._rand = rand
        self._stopping = threading.Event()
        self._watch_lock = threading.Lock()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.resource_version: str | None = None  # where the next watch starts; None = (re)list first

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = AgentThread(target=self._run, name=f"k8s-watch-{self.call.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end and shut the open watch's socket, so no read blocks it.
        Safe to repeat: a watch may open between a first stop and the thread seeing it."""
        self._stopping.set()
        with self._watch_lock:
            current = self._watch
        if current is not None:
            current.stop()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._list_and_watch()
        except _Stopped:
            pass

    def _list_and_watch(self) -> None:
        call = self.call
        failures = 0
        absent = False
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    items, rv = self._list()
                    if absent:
                        log.warning("kubernetes: %s is served again; watching it", call.name)
                        absent = False
                    self._put(Snapshot(items))
                    del items  # not kept while this thread watches: the consumer alone holds the list
                    self.resource_version = rv
                if self._watch_once():
                    failures = 0
            except _Stopped:
                raise
            except ApiException as exc:
                if self._stopping.is_set():
                    return
                if exc.status == 410:
                    log.info("kubernetes: %s resourceVersion %s expired; relisting", call.name,
                             self.resource_version)
                    self.resource_version = None
                    continue
                if exc.status == 404 and call.crd:
                    if not absent:
                        absent = True
                        self._put(Absent())
                    self.resource_version = None
                    self._wait(self._stopping, self._backoff_max)  # quietly check again whether it appeared
                    continue
                failures += 1
                self._failed(failures, f"HTTP {exc.status} {exc.reason}")
            except Exception as exc:  # connection refused/reset, timeouts, truncated streams, bad JSON
                if self._stopping.is_set():
                    return
                failures += 1
                self._failed(failures, f"{type(exc).__name__}: {exc}")

    def _failed(self, failures: int, why: str) -> None:
        delay = backoff_delay(failures, self._backoff_max, self._rand)
        log.warning("kubernetes: %s list/watch failed (%d in a row), retrying in %.1fs: %s",
                    self.call.name, failures, delay, why)
        self._call_soon(self._on_failure)
        self._wait(self._stopping, delay)

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        """All items (following continue tokens) and the list's resourceVersion."""
        call = self.call
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = dict(call.kwargs, limit=self._page_size,
                                          _request_timeout=(CONNECT_TIMEOUT, LIST_READ_TIMEOUT),
                                          _preload_content=False)  # raw dicts, not client models
            if token:
                kwargs["_continue"] = token
            resp = call.list_fn(*call.args, **kwargs)
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
            if not isinstance(body, dict) or not isinstance(body.get("items", []), list):
                raise ValueError(f"list {call.name}: not a Kubernetes list object")
            page = [i for i in body.pop("items", None) or [] if isinstance(i, dict)]
            items += [call.trim(i) for i in page] if call.trim is not None else page
            meta = m if isinstance(m := body.get("metadata"), dict) else {}
            token = meta.get("continue") or None
            if token is None:
                rv = meta.get("resourceVersion")
                if not isinstance(rv, str) or not rv:
                    raise ValueError(f"list {call.name}: no metadata.resourceVersion")
                return items, rv
            if self._stopping.is_set():
                raise _Stopped

    def _watch_once(self) -> int:
        """One watch request from resource_version until the server ends it, advancing
        resource_version with every event; how many events came. A 410 or other failure raises."""
        call = self.call
        w = watch.Watch(return_type="object")  # "object": events carry the raw dicts
        with self._watch_lock:
            self._watch = w
        if self._stopping.is_set():
            raise _Stopped
        timeout = int(WATCH_TIMEOUT[0] + self._rand() * (WATCH_TIMEOUT[1] - WATCH_TIMEOUT[0]))
        started, events = self._clock(), 0
        try:
            for event in w.stream(call.list_fn, *call.args, **call.kwargs, resource_version=self.resource_version,
                                  allow_watch_bookmarks=True, timeout_seconds=timeout,
                                  _request_timeout=(CONNECT_TIMEOUT, timeout + WATCH_READ_GRACE)):
                if self._stopping.is_set():
                    raise _Stopped
                obj = event.get("raw_object")
                if not isinstance(obj, dict):
                    continue
                events += 1
                if event.get("type") != "BOOKMARK":
                    self._put(Event(str(event.get("type")), call.trim(obj) if call.trim is not None else obj))
                self.resource_version = _resource_version(obj) or self.resource_version
        finally:
            with self._watch_lock:
                self._watch = None
        if self._stopping.is_set():
            raise _Stopped
        if events == 0 and self._clock() - started < SHORT_WATCH:
            raise ConnectionError("watch ended at once without events")
        return events

    def _put(self, item: Item) -> None:
        """Hand an item to the event loop, waiting while the queue is full (backpressure, no drops)."""
        if self._loop is None:
            raise _Stopped
        try:
            fut = asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop)
        except RuntimeError as exc:  # the loop is closed
            raise _Stopped from exc
        while True:
            try:
                fut.result(timeout=0.1)
                return
            except concurrent.futures.TimeoutError:
                if self._stopping.is_set():
                    fut.cancel()
                    raise _Stopped from None
            except concurrent.futures.CancelledError as exc:
                raise _Stopped from exc

    def _call_soon(self, fn: Callable[[], None]) -> None:
        try:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed
            pass
