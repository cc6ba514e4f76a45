"""A test Kubernetes API server that several agents watch at once: objects are created, replaced and
deleted, and every watch (each from the resourceVersion it asks for) gets every change after it.

tests/support/fake_apiserver.py's server streams what a test queues to whichever watch takes it first:
right for one agent, but with three nodes watching one API each event would reach one node only. Here
each change gets the next resourceVersion (one counter for the whole server, as etcd's), lists carry the
version they show, and a watch replays the changes after its resourceVersion, then follows new ones.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import yaml

from tests.support.fake_apiserver import ACNP, ANP, NAMESPACES, NETPOL, NODES, PODS, TIERS, FakeApiServer, _selected

# (apiVersion group, kind) -> the list path of its objects
PATHS = {("v1", "Namespace"): NAMESPACES, ("v1", "Pod"): PODS, ("v1", "Node"): NODES,
         ("networking.k8s.io", "NetworkPolicy"): NETPOL, ("crd.antrea.io", "ClusterNetworkPolicy"): ACNP,
         ("crd.antrea.io", "NetworkPolicy"): ANP, ("crd.antrea.io", "Tier"): TIERS}


def path_of(obj: dict[str, Any]) -> str:
    group = str(obj.get("apiVersion", "")).split("/")[0]
    return PATHS[(group, str(obj.get("kind")))]


class KubeStore(FakeApiServer):
    """Starts empty (no recorded objects); `put`, `delete` and `put_yaml` change it; every watch sees
    every change."""

    def __init__(self) -> None:
        super().__init__()
        self._rv = 1
        self._changes: dict[str, list[tuple[int, dict[str, Any]]]] = {p: [] for p in self.lists}
        self._changed = threading.Condition(self._lock)
        for path in self.lists:
            self.lists[path] = {**self.lists[path], "items": [], "metadata": {"resourceVersion": "1"}}

    def _key(self, obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta["name"])

    def put(self, obj: dict[str, Any]) -> str:
        """Create or replace `obj` (its kind names its list); its new resourceVersion."""
        path = path_of(obj)
        obj = copy.deepcopy(obj)
        with self._changed:
            self._rv += 1
            rv = str(self._rv)
            obj.setdefault("metadata", {})["resourceVersion"] = rv
            items = self.lists[path]["items"]
            at = next((i for i, o in enumerate(items) if self._key(o) == self._key(obj)), None)
            if at is None:
                items.append(obj)
            else:
                items[at] = obj
            self._changes[path].append((self._rv, {"type": "ADDED" if at is None else "MODIFIED", "object": obj}))
            self.lists[path]["metadata"] = {"resourceVersion": rv}
            self._changed.notify_all()
        return rv

    def delete(self, obj: dict[str, Any]) -> None:
        """Delete the object of `obj`'s kind, namespace and name (it must exist)."""
        path = path_of(obj)
        with self._changed:
            items = self.lists[path]["items"]
            gone = next(o for o in items if self._key(o) == self._key(obj))
            items.remove(gone)
            self._rv += 1
            gone = copy.deepcopy(gone)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._changes[path].append((self._rv, {"type": "DELETED", "object": gone}))
            self.lists[path]["metadata"] = {"resourceVersion": str(self._rv)}
            self._changed.notify_all()

    def put_yaml(self, text: str) -> None:
        for doc in yaml.safe_load_all(text):
            if doc:
                self.put(doc)

    def _stream(self, h: BaseHTTPRequestHandler, path: str, query: dict[str, str]) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        seen = int(query.get("resourceVersion") or "0")
        try:
            while not self._closing.is_set():
                with self._changed:
                    ready = [(rv, ev) for rv, ev in self._changes[path] if rv > seen]
                    if not ready:
                        self._changed.wait(0.05)
                        continue
                for rv, ev in ready:
                    seen = rv
                    if _selected(ev["object"], query.get("fieldSelector")):
                        line = json.dumps(ev).encode() + b"\n"
                        h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                h.wfile.flush()
        except OSError:  # the client went away
            pass
        h.close_connection = True
