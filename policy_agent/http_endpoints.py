"""The agent's HTTP listener (metrics.listen): /metrics for Prometheus, /readyz and /healthz for probes.

/readyz answers 200 only once the node can take Pods with their policy: the
OpenFlow channel connected (with meters, groups and flows replayed), the policy
flows installed, and the CNI server listening. Before that, and while OpenFlow is
down, it answers 503 naming what is missing. /healthz answers 200 while the
process serves HTTP at all (liveness). Anything else is the metrics exposition.
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

Readiness = Callable[[], list[str]]  # what is not ready yet; empty when ready


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a probe every few seconds is not news
        pass


def make_app(registry: CollectorRegistry, readiness: Readiness) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/readyz", "/healthz"):
            return metrics(environ, start_response)
        waiting = readiness() if path == "/readyz" else []
        body = ("ok\n" if not waiting else "not ready: " + "; ".join(waiting) + "\n").encode()
        start_response("200 OK" if not waiting else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(host: str, port: int, registry: CollectorRegistry, readiness: Readiness) -> WSGIServer:
    """Listen on host:port in a daemon thread; OSError if the address cannot be taken. Stop: shutdown()."""
    host = host.strip("[]")
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, port, make_app(registry, readiness), server_class, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="npaudit-http", daemon=True).start()
    return server
