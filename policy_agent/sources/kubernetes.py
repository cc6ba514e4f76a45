"""The Kubernetes API as a policy source: list+watch of Namespaces, this node's Pods and policies into the engine.

One daemon thread per resource does the blocking client calls (list, then watch
from the list's resourceVersion) and feeds a bounded asyncio.Queue; one task per
resource validates each object on its own and calls the engine on the event
loop. An object that does not validate is logged and counted, and its previous
valid version stays in force. An expired resourceVersion (410) means relist and
reconcile; a connection failure means retry with jittered exponential backoff;
an Antrea CRD the server does not serve (404) is a degraded mode, not a crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config

from policy_agent.errors import AgentError
from policy_agent.policy.manifests import ManifestError, ObjectSet, load_documents
from policy_agent.policy.model import STANDARD_TIERS, Namespace, Pod, Policy, Tier

log = logging.getLogger(__name__)

ANTREA_GROUP, ANTREA_VERSION = "crd.antrea.io", "v1beta1"
ANTREA_API = f"{ANTREA_GROUP}/{ANTREA_VERSION}"

BACKOFF_BASE = 0.2           # seconds before the first retry (then doubling, jittered, capped)
CONNECT_TIMEOUT = 10.0
LIST_READ_TIMEOUT = 60.0
WATCH_TIMEOUT = (300, 600)   # server-side watch timeout, drawn per watch like client-go's reflector
WATCH_READ_GRACE = 30.0      # a watch silent this long past its server timeout is a dead connection
QUEUE_SIZE = 1024            # per resource; a full queue blocks the watch thread (nothing is dropped)
SHORT_WATCH = 1.0            # a watch ending this fast with no event is treated as a failure

Key = tuple[str, str]        # (namespace or "", name)
Model = Namespace | Pod | Tier | Policy


class KubernetesConfigError(AgentError):
    """No usable Kubernetes client configuration (kubeconfig or in-cluster service account)."""


class PolicySink(Protocol):
    """What the source drives: the PolicyEngine's object methods."""

    async def apply(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                    tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None: ...

    async def delete(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                     tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None: ...


def api_client_from_config(kubeconfig: str | None, *,
                           environ: Mapping[str, str] = os.environ) -> client.ApiClient:
    """In-cluster configuration when no kubeconfig is given and KUBERNETES_SERVICE_HOST is set,
    else the kubeconfig file (None = $KUBECONFIG or ~/.kube/config). The caller closes the client."""
    cfg = client.Configuration()
    in_cluster = kubeconfig is None and bool(environ.get("KUBERNETES_SERVICE_HOST"))
    where = "the in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
    try:
        if in_cluster:
            incluster_config.InClusterConfigLoader(
                token_filename=incluster_config.SERVICE_TOKEN_FILENAME,
                cert_filename=incluster_config.SERVICE_CERT_FILENAME, environ=environ).load_and_set(cfg)
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        raise KubernetesConfigError(f"kubernetes client configuration from {where}: {exc}") from exc
    # Six watches hold a connection each for minutes; a smaller pool warns on every release.
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 16)
    log.info("kubernetes API %s (from %s)", cfg.host, where)
    return client.ApiClient(cfg)


def backoff_delay(failures: int, cap: float, rand: Callable[[], float], base: float = BACKOFF_BASE) -> float:
    """Seconds to wait after `failures` consecutive failures: exponential, capped, jittered
    into [ceiling/2, ceiling] so agents of a whole cluster do not retry in step."""
    ceiling = min(cap, base * 2 ** min(max(failures, 1) - 1, 32))
    return ceiling / 2 + rand() * ceiling / 2


@dataclass(frozen=True)
class _Resource:
    name: str             # stats key and validation source "k8s:<name>"
    api_version: str      # filled into list items, which the API server sends without it
    kind: str
    arg: str              # the engine keyword: namespaces | pods | tiers | policies
    list_fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    crd: bool = False     # may be absent from the server (Antrea not installed)
    needs_tiers: bool = False


@dataclass
class _Feed:
    """One resource's state. Only its consumer task touches known/rejected, holding `lock`."""

    res: _Resource
    queue: asyncio.Queue[Any]
    known: dict[Key, Any] = field(default_factory=dict)        # last valid model, as given to the engine
    rejected: dict[Key, dict[str, Any]] = field(default_factory=dict)  # latest invalid version
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    watch: watch.Watch | None = None
    thread: threading.Thread | None = None
    resource_version: str | None = None  # where the next watch starts; None = (re)list first. Thread only.


@dataclass(frozen=True)
class _Snapshot:
    items: list[dict[str, Any]]


@dataclass(frozen=True)
class _Event:
    type: str
    obj: dict[str, Any]


class _Absent:
    """The server does not serve the resource: treated as an empty list."""


class _Stopped(Exception):
    pass


def _key(doc: Mapping[str, Any]) -> Key:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _resource_version(doc: Mapping[str, Any]) -> str | None:
    meta = doc.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


class KubernetesSource:
    """Lists and watches the API server and keeps the engine in step with it."""

    def __init__(self, api_client: client.ApiClient, engine: PolicySink, *, node_name: str,
                 resync_backoff_max: float = 30.0, list_page_size: int = 500,
                 rand: Callable[[], float] = random.random) -> None:
        if not node_name:
            raise ValueError("node_name is required: only this node's Pods are watched")
        self._engine = engine
        self.node_name = node_name
        self._backoff_max = resync_backoff_max
        self._page_size = list_page_size
        self._rand = rand
        core, net = client.CoreV1Api(api_client), client.NetworkingV1Api(api_client)
        crd = client.CustomObjectsApi(api_client).list_cluster_custom_object
        resources = [
            _Resource("namespaces", "v1", "Namespace", "namespaces", core.list_namespace),
            _Resource("pods", "v1", "Pod", "pods", core.list_pod_for_all_namespaces,
                      kwargs={"field_selector": f"spec.nodeName={node_name}"}),
            _Resource("networkpolicies.networking.k8s.io", "networking.k8s.io/v1", "NetworkPolicy", "policies",
                      net.list_network_policy_for_all_namespaces),
            _Resource("tiers.crd.antrea.io", ANTREA_API, "Tier", "tiers", crd,
                      args=(ANTREA_GROUP, ANTREA_VERSION, "tiers"), crd=True),
            _Resource("clusternetworkpolicies.crd.antrea.io", ANTREA_API, "ClusterNetworkPolicy", "policies", crd,
                      args=(ANTREA_GROUP, ANTREA_VERSION, "clusternetworkpolicies"), crd=True, needs_tiers=True),
            _Resource("networkpolicies.crd.antrea.io", ANTREA_API, "NetworkPolicy", "policies", crd,
                      args=(ANTREA_GROUP, ANTREA_VERSION, "networkpolicies"), crd=True, needs_tiers=True),
        ]
        self._feeds = {r.name: _Feed(r, asyncio.Queue(QUEUE_SIZE)) for r in resources}
        self.stats: dict[str, dict[str, int]] = {
            r.name: {"applied": 0, "deleted": 0, "invalid": 0, "relists": 0, "errors": 0} for r in resources}
        self.synced = asyncio.Event()
        self.skipped: set[str] = set()  # resources the server does not serve right now
        self._stopping = threading.Event()
        self._watch_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the watch threads and consumer tasks; `synced` is set once every resource is listed."""
        self._loop = asyncio.get_running_loop()
        for feed in self._feeds.values():
            self._tasks.append(self._loop.create_task(self._consume(feed), name=f"k8s-{feed.res.name}"))
            feed.thread = threading.Thread(target=self._pump, args=(feed,), name=f"k8s-watch-{feed.res.name}",
                                           daemon=True)
            feed.thread.start()

    async def close(self, timeout: float = 0.8) -> None:
        """Stop the watches (their sockets are shut down, so no read blocks) and the consumers."""
        self._stopping.set()
        self._stop_watches()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        deadline = time.monotonic() + timeout
        while any(f.thread is not None and f.thread.is_alive() for f in self._feeds.values()):
            if time.monotonic() >= deadline:
                # A thread inside a list call ends at its read timeout; it is a daemon.
                log.debug("kubernetes source closed with watch threads still finishing")
                break
            self._stop_watches()  # a watch may have opened between the first stop and now
            await asyncio.sleep(0.01)

    def _stop_watches(self) -> None:
        with self._watch_lock:
            watches = [f.watch for f in self._feeds.values() if f.watch is not None]
        for w in watches:
            w.stop()

    # --- watch threads (blocking client calls only) ----------------------------------

    def _pump(self, feed: _Feed) -> None:
        try:
            self._list_and_watch(feed)
        except _Stopped:
            pass

    def _list_and_watch(self, feed: _Feed) -> None:
        res = feed.res
        failures = 0
        absent = False
        while not self._stopping.is_set():
            try:
                if feed.resource_version is None:
                    items, rv = self._list(res)
                    if absent:
                        log.warning("kubernetes: %s is served again; watching it", res.name)
                        absent = False
                    self._put(feed, _Snapshot(items))
                    feed.resource_version = rv
                if self._watch_once(feed):
                    failures = 0
            except _Stopped:
                raise
            except ApiException as exc:
                if self._stopping.is_set():
                    return
                if exc.status == 410:
                    log.info("kubernetes: %s resourceVersion %s expired; relisting", res.name,
                             feed.resource_version)
                    feed.resource_version = None
                    continue
                if exc.status == 404 and res.crd:
                    if not absent:
                        absent = True
                        self._put(feed, _Absent())
                    feed.resource_version = None
                    self._stopping.wait(self._backoff_max)  # quietly check again whether it appeared
                    continue
                failures += 1
                self._failed(feed, failures, f"HTTP {exc.status} {exc.reason}")
            except Exception as exc:  # connection refused/reset, timeouts, truncated streams, bad JSON
                if self._stopping.is_set():
                    return
                failures += 1
                self._failed(feed, failures, f"{type(exc).__name__}: {exc}")

    def _failed(self, feed: _Feed, failures: int, why: str) -> None:
        delay = backoff_delay(failures, self._backoff_max, self._rand)
        log.warning("kubernetes: %s list/watch failed (%d in a row), retrying in %.1fs: %s",
                    feed.res.name, failures, delay, why)
        self._call_soon(self._count, feed.res.name, "errors")
        self._stopping.wait(delay)

    def _list(self, res: _Resource) -> tuple[list[dict[str, Any]], str]:
        """All items (following continue tokens) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = dict(res.kwargs, limit=self._page_size,
                                          _request_timeout=(CONNECT_TIMEOUT, LIST_READ_TIMEOUT),
                                          _preload_content=False)  # raw dicts, not client models
            if token:
                kwargs["_continue"] = token
            resp = res.list_fn(*res.args, **kwargs)
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
            if not isinstance(body, dict) or not isinstance(body.get("items", []), list):
                raise ValueError(f"list {res.name}: not a Kubernetes list object")
            items += [i for i in body.get("items") or [] if isinstance(i, dict)]
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
            token = meta.get("continue") or None
            if token is None:
                rv = meta.get("resourceVersion")
                if not isinstance(rv, str) or not rv:
                    raise ValueError(f"list {res.name}: no metadata.resourceVersion")
                return items, rv
            if self._stopping.is_set():
                raise _Stopped

    def _watch_once(self, feed: _Feed) -> int:
        """One watch request from feed.resource_version until the server ends it, advancing
        feed.resource_version with every event; how many events came. A 410 or other failure raises."""
        res = feed.res
        w = watch.Watch(return_type="object")  # "object": events carry the raw dicts
        with self._watch_lock:
            feed.watch = w
        if self._stopping.is_set():
            raise _Stopped
        timeout = int(WATCH_TIMEOUT[0] + self._rand() * (WATCH_TIMEOUT[1] - WATCH_TIMEOUT[0]))
        started, events = time.monotonic(), 0
        try:
            for event in w.stream(res.list_fn, *res.args, **res.kwargs, resource_version=feed.resource_version,
                                  allow_watch_bookmarks=True, timeout_seconds=timeout,
                                  _request_timeout=(CONNECT_TIMEOUT, timeout + WATCH_READ_GRACE)):
                if self._stopping.is_set():
                    raise _Stopped
                obj = event.get("raw_object")
                if not isinstance(obj, dict):
                    continue
                events += 1
                if event.get("type") != "BOOKMARK":
                    self._put(feed, _Event(str(event.get("type")), obj))
                feed.resource_version = _resource_version(obj) or feed.resource_version
        finally:
            with self._watch_lock:
                feed.watch = None
        if self._stopping.is_set():
            raise _Stopped
        if events == 0 and time.monotonic() - started < SHORT_WATCH:
            raise ConnectionError("watch ended at once without events")
        return events

    def _put(self, feed: _Feed, item: Any) -> None:
        """Hand an item to the event loop, waiting while the queue is full (backpressure, no drops)."""
        if self._loop is None:
            raise _Stopped
        try:
            fut = asyncio.run_coroutine_threadsafe(feed.queue.put(item), self._loop)
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

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed
            pass

    def _count(self, resource: str, what: str, n: int = 1) -> None:
        self.stats[resource][what] += n

    # --- consumers (event loop) ------------------------------------------------------

    async def _consume(self, feed: _Feed) -> None:
        while True:
            item = await feed.queue.get()
            if isinstance(item, (_Snapshot, _Absent)) and not feed.listed.is_set() and feed.res.needs_tiers:
                # Antrea policies name Tiers: the first list of Tiers goes in before them.
                await self._feeds["tiers.crd.antrea.io"].listed.wait()
            try:
                async with feed.lock:
                    if isinstance(item, _Event):
                        tiers_changed = await self._event(feed, item)
                    else:
                        tiers_changed = await self._reconcile(feed, item)
                if tiers_changed:
                    await self._retry_rejected()
            except asyncio.CancelledError:
                raise
            except Exception:  # the engine failed; the next change will sync again
                log.exception("kubernetes: %s: applying to the engine failed", feed.res.name)
                self._count(feed.res.name, "errors")

    async def _event(self, feed: _Feed, ev: _Event) -> bool:
        """One watch event; True when a Tier was applied."""
        res, doc = feed.res, self._complete(feed.res, ev.obj)
        key = _key(doc)
        if ev.type in ("ADDED", "MODIFIED") and self._foreign_pod(res, doc):
            ev = _Event("DELETED", doc)  # cannot happen with the field selector; never keep it
        if ev.type in ("ADDED", "MODIFIED"):
            if self._standard_tier(res, doc):
                return False
            obj = self._validate(feed, doc)
            if obj is None or feed.known.get(key) == obj:
                return False
            feed.known[key] = obj
            await self._engine.apply(**{res.arg: [obj]})
            self._count(res.name, "applied")
            return res.arg == "tiers"
        if ev.type == "DELETED":
            feed.rejected.pop(key, None)
            old = feed.known.pop(key, None)
            if old is not None:
                await self._engine.delete(**{res.arg: [old]})
                self._count(res.name, "deleted")
        return False

    async def _reconcile(self, feed: _Feed, item: _Snapshot | _Absent) -> bool:
        """A full list (or absence): apply what is new or changed, delete what disappeared."""
        res = feed.res
        first = not feed.listed.is_set()
        docs: dict[Key, dict[str, Any]] = {}
        if isinstance(item, _Absent):
            if res.name not in self.skipped:
                log.warning("kubernetes: the API server does not serve %s/%s (Antrea CRDs not installed?): "
                            "running without %s until it appears", ANTREA_API, res.args[-1], res.name)
            self.skipped.add(res.name)
        else:
            self.skipped.discard(res.name)
            for raw in item.items:
                doc = self._complete(res, raw)
                if not self._foreign_pod(res, doc) and not self._standard_tier(res, doc):
                    docs[_key(doc)] = doc
        changed = []
        for key, doc in docs.items():
            obj = self._validate(feed, doc)
            if obj is not None and feed.known.get(key) != obj:
                feed.known[key] = obj
                changed.append(obj)
        gone = [feed.known.pop(k) for k in list(feed.known) if k not in docs]
        for k in [k for k in feed.rejected if k not in docs]:
            del feed.rejected[k]
        if not first:
            self._count(res.name, "relists")
        try:
            # New versions go in before stale objects leave, so enforcement has no gap.
            if changed:
                await self._engine.apply(**{res.arg: changed})
                self._count(res.name, "applied", len(changed))
            if gone:
                await self._engine.delete(**{res.arg: gone})
                self._count(res.name, "deleted", len(gone))
        finally:
            # Listed even when the engine failed: what waits on it must not wait forever.
            feed.listed.set()
            if all(f.listed.is_set() for f in self._feeds.values()) and not self.synced.is_set():
                log.info("kubernetes: initial list of every resource applied")
                self.synced.set()
        return res.arg == "tiers" and bool(changed)

    async def _retry_rejected(self) -> None:
        """Antrea policies rejected for naming a Tier not seen yet (separate watches race)."""
        for feed in self._feeds.values():
            if not feed.res.needs_tiers or not feed.rejected:
                continue
            async with feed.lock:
                now_valid = []
                for key, doc in list(feed.rejected.items()):
                    obj = self._validate(feed, doc, quiet=True)
                    if obj is not None:
                        feed.known[key] = obj
                        now_valid.append(obj)
                if now_valid:
                    await self._engine.apply(policies=now_valid)
                    self._count(feed.res.name, "applied", len(now_valid))

    # --- validation ------------------------------------------------------------------

    def _validate(self, feed: _Feed, doc: dict[str, Any], quiet: bool = False) -> Any:
        """The object's model, or None (logged, counted, remembered) when it does not validate."""
        res, key = feed.res, _key(doc)
        docs: list[Any] = [doc]
        spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        tier = self._feeds["tiers.crd.antrea.io"].known.get(("", spec.get("tier"))) \
            if res.needs_tiers and isinstance(spec.get("tier"), str) else None
        if tier is not None:
            # The loader checks Tier references within the set: add the one Tier named, as applied.
            docs.append({"apiVersion": ANTREA_API, "kind": "Tier", "metadata": {"name": tier.name},
                         "spec": {"priority": tier.priority}})
        try:
            objs = load_documents(docs, source=f"k8s:{res.name}")
        except ManifestError as exc:
            feed.rejected[key] = doc
            if not quiet:
                self._count(res.name, "invalid")
                kept = "previous version stays in force" if key in feed.known else "not applied"
                for line in exc.errors:
                    log.error("kubernetes: %s rejected, %s: %s", res.name, kept, line)
            return None
        feed.rejected.pop(key, None)
        return _only(objs, res.arg)

    @staticmethod
    def _complete(res: _Resource, raw: dict[str, Any]) -> dict[str, Any]:
        """List items of built-in kinds come without apiVersion/kind; the loader needs them."""
        doc = dict(raw)
        doc.setdefault("apiVersion", res.api_version)
        doc.setdefault("kind", res.kind)
        return doc

    def _foreign_pod(self, res: _Resource, doc: dict[str, Any]) -> bool:
        spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        return res.arg == "pods" and spec.get("nodeName") != self.node_name

    @staticmethod
    def _standard_tier(res: _Resource, doc: dict[str, Any]) -> bool:
        """Antrea creates Tier objects for its standard tiers; the model has them built in."""
        return res.arg == "tiers" and _key(doc)[1] in STANDARD_TIERS


def _only(objs: ObjectSet, field_name: str) -> Any:
    values: tuple[Any, ...] = getattr(objs, field_name)
    if len(values) != 1:  # one document in, one object of its kind out
        raise RuntimeError(f"expected one {field_name[:-1]}, the loader returned {len(values)}")
    return values[0]
