"""A fake Kubernetes API server (list and watch over HTTP on loopback) for the Kubernetes source's
tests."""

from __future__ import annotations

import copy
import json
import queue
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

_END, _DROP = object(), object()
DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "k8s"
NAMESPACES = "/api/v1/namespaces"
PODS = "/api/v1/pods"
NETPOL = "/apis/networking.k8s.io/v1/networkpolicies"
TIERS = "/apis/crd.antrea.io/v1beta1/tiers"
ACNP = "/apis/crd.antrea.io/v1beta1/clusternetworkpolicies"
ANP = "/apis/crd.antrea.io/v1beta1/networkpolicies"
NODES = "/api/v1/nodes"  # none recorded: a test sets the Nodes it needs (set_items)
RECORDED = {NAMESPACES: "namespaces.json", PODS: "pods.json", NETPOL: "networkpolicies.json",
            TIERS: "tiers.json", ACNP: "clusternetworkpolicies.json", ANP: "antreanetworkpolicies.json"}


class FakeApiServer:
    """Serves the recorded list payloads and, for ?watch=true, streams what the test sends
    (chunked, one JSON event per line) until the test ends or drops the stream."""

    def __init__(self) -> None:
        self.lists = {path: json.loads((DATA / name).read_text()) for path, name in RECORDED.items()}
        self.lists[NODES] = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}
        self.missing: set[str] = set()            # paths answered 404 (CRD not installed)
        self.fail_lists: dict[str, int] = {}      # path -> how many list calls answer 503
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._streams = {path: queue.Queue[Any]() for path in self.lists}
        self._closing = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(2)

    # --- what the test scripts ---

    def send(self, path: str, type_: str, obj: dict[str, Any]) -> None:
        self._streams[path].put({"type": type_, "object": obj})

    def expire(self, path: str) -> None:
        """What the API server does when a watch's resourceVersion is compacted away."""
        self.send(path, "ERROR", {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                  "message": "too old resource version: 1502 (48990)", "reason": "Expired",
                                  "code": 410})
        self._streams[path].put(_END)

    def end(self, path: str) -> None:
        """End the watch as the server does at its timeout: the final chunk, no event."""
        self._streams[path].put(_END)

    def drop(self, path: str) -> None:
        """Close the watch's socket mid-stream, without the final chunk."""
        self._streams[path].put(_DROP)

    def set_items(self, path: str, items: list[dict[str, Any]], resource_version: str) -> None:
        with self._lock:
            self.lists[path] = {**self.lists[path], "items": items,
                                "metadata": {"resourceVersion": resource_version}}

    def watches(self, path: str) -> list[dict[str, str]]:
        return [q for p, q in list(self.requests) if p == path and q.get("watch") == "true"]

    def lists_of(self, path: str) -> list[dict[str, str]]:
        return [q for p, q in list(self.requests) if p == path and q.get("watch") != "true"]

    # --- HTTP ---

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        query = {k: v.lower() if k == "watch" else v for k, v in query.items()}
        self.requests.append((url.path, query))
        if url.path not in self.lists or url.path in self.missing:
            return self._reply(h, 404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                        "message": "the server could not find the requested resource",
                                        "reason": "NotFound", "details": {}, "code": 404})
        if query.get("watch") == "true":
            return self._stream(h, url.path, query)
        with self._lock:
            if self.fail_lists.get(url.path, 0) > 0:
                self.fail_lists[url.path] -= 1
                return self._reply(h, 503, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "message": "the server is currently unable to handle the request",
                                            "reason": "ServiceUnavailable", "code": 503})
            body = copy.deepcopy(self.lists[url.path])
        items = [i for i in body["items"] if _selected(i, query.get("fieldSelector"))]
        start = int(query.get("continue", "0"))
        limit = int(query.get("limit", "0")) or len(items)
        body["items"] = items[start:start + limit]
        if start + limit < len(items):
            body["metadata"] = {**body["metadata"], "continue": str(start + limit), "remainingItemCount": 0}
        self._reply(h, 200, body)

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _stream(self, h: BaseHTTPRequestHandler, path: str, query: dict[str, str]) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        stream = self._streams[path]
        try:
            while not self._closing.is_set():
                try:
                    item = stream.get(timeout=0.02)
                except queue.Empty:
                    continue
                if item is _DROP:
                    h.close_connection = True
                    h.connection.shutdown(socket.SHUT_RDWR)
                    return
                if item is _END:
                    h.wfile.write(b"0\r\n\r\n")
                    return
                if not _selected(item["object"], query.get("fieldSelector")):
                    continue
                line = json.dumps(item).encode() + b"\n"
                h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        except OSError:  # the client went away
            pass
        h.close_connection = True


def _selected(obj: dict[str, Any], selector: str | None) -> bool:
    """The field selectors the source uses: spec.nodeName=<node> (Pods), metadata.name=<node> (its Node)."""
    if not selector:
        return True
    field, _, value = selector.partition("=")
    if field == "metadata.name":
        return (obj.get("metadata") or {}).get("name") == value
    if field != "spec.nodeName":
        raise AssertionError(f"unexpected field selector {selector!r}")
    return (obj.get("spec") or {}).get("nodeName") == value


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    srv = FakeApiServer()
    srv.start()
    yield srv
    srv.close()


def item(path: str, name: str) -> dict[str, Any]:
    """A recorded item, with apiVersion/kind as watch events carry them."""
    body = json.loads((DATA / RECORDED[path]).read_text())
    found = next(i for i in body["items"] if i["metadata"]["name"] == name)
    kind = body["kind"].removesuffix("List")
    return {"apiVersion": body["apiVersion"], "kind": kind, **found}
