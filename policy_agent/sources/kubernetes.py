"""The Kubernetes API as a policy source: Namespaces, every node's Pods and policies kept in step with the engine.

One watcher thread per resource (kubernetes_watch.py) lists and watches and feeds
a bounded asyncio.Queue; one task per resource validates each object on its own
and calls the engine on the event loop. An object that does not validate is
logged and counted, and its previous valid version stays in force. A relist is
reconciled against what the engine holds; an Antrea CRD the server does not
serve is a degraded mode, not a crash.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypedDict

from kubernetes import client, config
from kubernetes.config import incluster_config

from policy_agent.errors import AgentError
from policy_agent.policy import kinds
from policy_agent.policy.kinds import ApiResource
from policy_agent.policy.manifests import ManifestError, ObjectSet, load_documents
from policy_agent.policy.model import STANDARD_TIERS, Namespace, Pod, Policy, Tier
from policy_agent.sources.kubernetes_node import NodeFeed, NodeSink, PeersSink
from policy_agent.sources.kubernetes_pods import pod_fields
from policy_agent.sources.kubernetes_watch import (
    Absent, Clock, Event, Item, ListCall, ResourceWatcher, Snapshot, Wait,
)
from policy_agent.sources.sink import PolicySink
from packetin.tasks import within

log = logging.getLogger(__name__)

QUEUE_SIZE = 1024            # per resource; a full queue blocks the watch thread (nothing is dropped)
EVENT_BATCH = 512            # watch events of one resource taken into one engine change at most

Key = tuple[str, str]        # (namespace or "", name)
Model = Namespace | Pod | Tier | Policy


class _ByKind(TypedDict):
    """Models as the keyword arguments of PolicySink.apply and delete."""

    namespaces: list[Namespace]
    pods: list[Pod]
    tiers: list[Tier]
    policies: list[Policy]


def _by_kind(objs: list[Model]) -> _ByKind:
    return _ByKind(namespaces=[o for o in objs if isinstance(o, Namespace)],
                   pods=[o for o in objs if isinstance(o, Pod)],
                   tiers=[o for o in objs if isinstance(o, Tier)],
                   policies=[o for o in objs if isinstance(o, Policy)])


class KubernetesConfigError(AgentError):
    """No usable Kubernetes client configuration (kubeconfig or in-cluster service account)."""


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


@dataclass(frozen=True)
class _Resource:
    api: ApiResource      # api.name is the stats key and the validation source "k8s:<name>"
    arg: str              # the engine keyword: namespaces | pods | tiers | policies
    needs_tiers: bool = False

    @property
    def name(self) -> str:
        return self.api.name


@dataclass
class _Feed:
    """One resource's state. Only its consumer task touches known/rejected, holding `lock`."""

    res: _Resource
    queue: asyncio.Queue[Item]
    watcher: ResourceWatcher
    known: dict[Key, Model] = field(default_factory=dict)      # last valid model, as given to the engine
    rejected: dict[Key, dict[str, Any]] = field(default_factory=dict)  # latest invalid version
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    listed: asyncio.Event = field(default_factory=asyncio.Event)


def _key(doc: Mapping[str, Any]) -> Key:
    meta = m if isinstance(m := doc.get("metadata"), dict) else {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class KubernetesSource:
    """Lists and watches the API server and keeps the engine in step with it."""

    def __init__(self, api_client: client.ApiClient, engine: PolicySink, *, node_name: str,
                 resync_backoff_max: float = 30.0, list_page_size: int = 500,
                 clock: Clock = time.monotonic, wait: Wait = threading.Event.wait,
                 rand: Callable[[], float] = random.random, subnet: NodeSink | None = None,
                 peers: PeersSink | None = None) -> None:
        """`subnet`: when given, the Node objects are watched too: this node's podCIDR is kept there, and
        the other nodes and every Pod's addresses go to `peers` (when given)."""
        if not node_name:
            raise ValueError("node_name is required: it names this node's Node object and Pods")
        self._engine = engine
        self.node_name = node_name
        self._peers = peers
        core, net = client.CoreV1Api(api_client), client.NetworkingV1Api(api_client)
        crd = client.CustomObjectsApi(api_client).list_cluster_custom_object
        # Every node's Pods: rules match Pods on other nodes by address, records name them.
        calls: list[tuple[_Resource, Callable[..., object], dict[str, str]]] = [
            (_Resource(kinds.NAMESPACES, "namespaces"), core.list_namespace, {}),
            (_Resource(kinds.PODS, "pods"), core.list_pod_for_all_namespaces, {}),
            (_Resource(kinds.K8S_NETWORK_POLICIES, "policies"), net.list_network_policy_for_all_namespaces, {}),
            (_Resource(kinds.TIERS, "tiers"), crd, {}),
            (_Resource(kinds.ANTREA_CLUSTER_POLICIES, "policies", needs_tiers=True), crd, {}),
            (_Resource(kinds.ANTREA_POLICIES, "policies", needs_tiers=True), crd, {}),
        ]
        self._feeds: dict[str, _Feed] = {}
        for res, list_fn, kwargs in calls:
            api = res.api
            custom = api.group == kinds.ANTREA_GROUP
            call = ListCall(api.name, list_fn, args=(api.group, api.version, api.plural) if custom else (),
                            kwargs=kwargs, crd=custom, trim=pod_fields if res.arg == "pods" else None)
            queue: asyncio.Queue[Item] = asyncio.Queue(QUEUE_SIZE)
            watcher = ResourceWatcher(call, queue, functools.partial(self._count, api.name, "errors"),
                                      backoff_max=resync_backoff_max, page_size=list_page_size,
                                      clock=clock, wait=wait, rand=rand)
            self._feeds[api.name] = _Feed(res, queue, watcher)
        self.stats: dict[str, dict[str, int]] = {
            name: {"applied": 0, "deleted": 0, "invalid": 0, "relists": 0, "errors": 0} for name in self._feeds}
        self.node: NodeFeed | None = None
        if subnet is not None:
            self.stats["nodes"] = {"errors": 0}
            self.node = NodeFeed(core.list_node, node_name, subnet, functools.partial(self._count, "nodes", "errors"),
                                 backoff_max=resync_backoff_max, page_size=list_page_size, clock=clock, wait=wait,
                                 rand=rand, peers=peers)
        self.synced = asyncio.Event()
        self.skipped: set[str] = set()  # resources the server does not serve right now
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the watch threads and consumer tasks; `synced` is set once every resource is listed."""
        loop = asyncio.get_running_loop()
        for name, feed in self._feeds.items():
            self._tasks.append(loop.create_task(self._consume(feed), name=f"k8s-{name}"))
            feed.watcher.start(loop)
        if self.node is not None:
            self._tasks.append(loop.create_task(self._node_listed(self.node), name="k8s-nodes"))
            self.node.watcher.start(loop)

    async def close(self, timeout: float = 0.8) -> None:
        """Stop the watches (their sockets are shut down, so no read blocks) and the consumers."""
        watchers = [f.watcher for f in self._feeds.values()] + ([self.node.watcher] if self.node is not None else [])
        for w in watchers:
            w.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

        async def ended() -> None:
            while any(w.alive for w in watchers):
                for w in watchers:
                    w.stop()  # a watch may have opened between the first stop and now
                await asyncio.sleep(0.01)

        try:
            await within(ended(), timeout)
        except asyncio.TimeoutError:
            # A thread inside a list call ends at its read timeout; it is a daemon.
            log.debug("kubernetes source closed with watch threads still finishing")

    async def _node_listed(self, node: NodeFeed) -> None:
        consumer = asyncio.ensure_future(node.consume())
        try:
            await node.listed.wait()
            self._maybe_synced()
            await consumer
        finally:
            consumer.cancel()

    def _maybe_synced(self) -> None:
        if all(f.listed.is_set() for f in self._feeds.values()) and not self.synced.is_set() \
                and (self.node is None or self.node.listed.is_set()):
            log.info("kubernetes: initial list of every resource applied")
            self.synced.set()

    def _count(self, resource: str, what: str, n: int = 1) -> None:
        self.stats[resource][what] += n

    # --- consumers (event loop) ------------------------------------------------------

    async def _consume(self, feed: _Feed) -> None:
        pending: Item | None = None
        while True:
            item = pending if pending is not None else await feed.queue.get()
            pending = None
            if isinstance(item, (Snapshot, Absent)) and not feed.listed.is_set() and feed.res.needs_tiers:
                # Antrea policies name Tiers: the first list of Tiers goes in before them.
                await self._feeds[kinds.TIERS.name].listed.wait()
            events: list[Event] = []
            if isinstance(item, Event):
                # The events already queued go to the engine together: one state change for a burst
                # (a cluster's Pods churn), in the order they came.
                events.append(item)
                while len(events) < EVENT_BATCH and not feed.queue.empty():
                    nxt = feed.queue.get_nowait()
                    if not isinstance(nxt, Event):
                        pending = nxt
                        break
                    events.append(nxt)
            try:
                async with feed.lock:
                    if isinstance(item, Event):
                        tiers_changed = await self._events(feed, events)
                    else:
                        tiers_changed = await self._reconcile(feed, item)
                if tiers_changed:
                    await self._retry_rejected()
            except asyncio.CancelledError:
                raise
            except Exception:  # the engine failed; the next change will sync again
                log.exception("kubernetes: %s: applying to the engine failed", feed.res.name)
                self._count(feed.res.name, "errors")
            del item, events  # a list of every Pod is not held while waiting for the next change

    async def _events(self, feed: _Feed, events: list[Event]) -> bool:
        """Watch events in order, then their net change in one apply and one delete; True when a Tier
        was applied."""
        res = feed.res
        before: dict[Key, Model | None] = {}  # what the engine holds, for each key the events touch
        for ev in events:
            doc = self._complete(res, ev.obj)
            key = _key(doc)
            if ev.type in ("ADDED", "MODIFIED"):
                if self._standard_tier(res, doc):
                    continue
                obj = self._validate(feed, doc)
                if obj is None or feed.known.get(key) == obj:
                    continue
                before.setdefault(key, feed.known.get(key))
                feed.known[key] = obj
            elif ev.type == "DELETED":
                feed.rejected.pop(key, None)
                if key in feed.known:
                    before.setdefault(key, feed.known.get(key))
                    del feed.known[key]
        applied = [obj for key, old in before.items() if (obj := feed.known.get(key)) is not None and obj != old]
        gone = [old for key, old in before.items() if old is not None and key not in feed.known]
        self._addresses(applied, gone)
        # New versions go in before stale objects leave, as after a relist.
        if applied:
            await self._engine.apply(**_by_kind(applied))
            self._count(res.name, "applied", len(applied))
        if gone:
            await self._engine.delete(**_by_kind(gone))
            self._count(res.name, "deleted", len(gone))
        return res.arg == "tiers" and bool(applied)

    async def _reconcile(self, feed: _Feed, item: Snapshot | Absent) -> bool:
        """A full list (or absence): apply what is new or changed, delete what disappeared."""
        res = feed.res
        first = not feed.listed.is_set()
        listed: set[Key] = set()
        changes: dict[Key, Model] = {}
        if isinstance(item, Absent):
            if res.name not in self.skipped:
                log.warning("kubernetes: the API server does not serve %s/%s (Antrea CRDs not installed?): "
                            "running without %s until it appears", res.api.api_version, res.api.plural, res.name)
            self.skipped.add(res.name)
        else:
            self.skipped.discard(res.name)
            # Each item is validated and let go of in turn (taken off the list): the list's dicts are
            # not all alive while the models are made, so the models reuse their memory.
            items = item.items
            items.reverse()
            while items:
                doc = self._complete(res, items.pop())
                key = _key(doc)
                if self._standard_tier(res, doc):
                    continue
                listed.add(key)  # a later item of the same key wins, as it always did
                obj = self._validate(feed, doc)
                if obj is not None and feed.known.get(key) != obj:
                    feed.known[key] = obj
                    changes[key] = obj
        changed = list(changes.values())
        gone = [feed.known.pop(k) for k in list(feed.known) if k not in listed]
        for k in [k for k in feed.rejected if k not in listed]:
            del feed.rejected[k]
        if not first:
            self._count(res.name, "relists")
        self._addresses(changed, gone)
        try:
            # New versions go in before stale objects leave, so enforcement has no gap.
            if changed:
                await self._engine.apply(**_by_kind(changed))
                self._count(res.name, "applied", len(changed))
            if gone:
                await self._engine.delete(**_by_kind(gone))
                self._count(res.name, "deleted", len(gone))
        finally:
            # Listed even when the engine failed: what waits on it must not wait forever.
            feed.listed.set()
            self._maybe_synced()
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
                    await self._engine.apply(**_by_kind(now_valid))
                    self._count(feed.res.name, "applied", len(now_valid))

    # --- validation ------------------------------------------------------------------

    def _validate(self, feed: _Feed, doc: dict[str, Any], quiet: bool = False) -> Model | None:
        """The object's model, or None (logged, counted, remembered) when it does not validate."""
        res, key = feed.res, _key(doc)
        docs: list[Any] = [doc]
        spec = s if isinstance(s := doc.get("spec"), dict) else {}
        named = spec.get("tier")
        known = self._feeds[kinds.TIERS.name].known.get(("", named)) \
            if res.needs_tiers and isinstance(named, str) else None
        tier = known if isinstance(known, Tier) else None
        if tier is not None:
            # The loader checks Tier references within the set: add the one Tier named, as applied.
            docs.append({"apiVersion": kinds.TIERS.api_version, "kind": kinds.TIERS.kind,
                         "metadata": {"name": tier.name}, "spec": {"priority": tier.priority}})
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
        doc.setdefault("apiVersion", res.api.api_version)
        doc.setdefault("kind", res.api.kind)
        return doc

    def _addresses(self, changed: Sequence[Model], gone: Sequence[Model]) -> None:
        """Pods' addresses to `peers`, which checks them against the node subnets."""
        if self._peers is not None:
            self._peers.pods_changed([(o.key, o.ips) for o in changed if isinstance(o, Pod)],
                                     [o.key for o in gone if isinstance(o, Pod)])

    @staticmethod
    def _standard_tier(res: _Resource, doc: dict[str, Any]) -> bool:
        """Antrea creates Tier objects for its standard tiers; the model has them built in."""
        return res.arg == "tiers" and _key(doc)[1] in STANDARD_TIERS


def _only(objs: ObjectSet, field_name: str) -> Model:
    values: tuple[Model, ...] = getattr(objs, field_name)
    if len(values) != 1:  # one document in, one object of its kind out
        raise RuntimeError(f"expected one {field_name[:-1]}, the loader returned {len(values)}")
    return values[0]
