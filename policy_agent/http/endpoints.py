"""The agent's HTTP listener (metrics.listen): /metrics for Prometheus, /readyz and /healthz for probes.

/readyz answers 200 only once the node can take Pods with their policy: the
OpenFlow channel connected (with meters, groups and flows replayed), the policy
flows installed, and the CNI server listening. Before that, and while OpenFlow is
down, it answers 503 naming what is missing. /healthz answers 200 while the
process serves HTTP at all (liveness). Anything else is the metrics exposition.

Whoever can reach the port must not be able to starve the agent: one thread
serves every connection (a selector loop; no thread per connection), at most
`cap` connections are kept (from RLIMIT_NOFILE less a reserve of descriptors for
the agent's own work), a full table makes room by closing its least recently
active connection (passing over, for a second, one that has not sent a byte yet:
a flood of half-sent requests cannot push out a probe between its connect and
its request), a request head must arrive within `request_timeout` and a
connection that moves no byte for `idle_timeout` is closed. Accept errors
(EMFILE ...) pause accepting with a backoff and are logged at most once per
interval with a count. Probes are answered by the loop itself; the exposition is
rendered by one worker thread, so a slow collector never delays a probe.
"""

from __future__ import annotations

import errno
import logging
import queue
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import unquote

from prometheus_client import CollectorRegistry, make_wsgi_app

from packetin.ratelimited_log import RateLimitedLog
from packetin.tasks import AgentThread
from policy_agent.errors import one_line
from policy_agent.http.limits import (WAITING, WRITING, AcceptBackoff, Budget, ConnectionTable, LimitSettings,
                                      ListenerLimits, descriptor_budget)

log = logging.getLogger(__name__)

Readiness = Callable[[], list[str]]  # what is not ready yet; empty when ready
App = Callable[..., Iterable[bytes]]

PROBES = ("/readyz", "/healthz")
MAX_HEAD = 8192  # bytes of request line and headers; a longer head is refused (400)
MAX_PENDING_SCRAPES = 4  # requests for the exposition queued for the worker; more are answered 503
ACCEPT_BATCH = 16  # connections taken per wake-up, so reads of those already open go in between
LOG_INTERVAL = 10.0  # seconds between two log lines of the same accept or render error
CLOSE_REASONS = ("evicted", "refused", "descriptors_short", "request_timeout", "idle_timeout",
                 "answer_timeout", "bad_request", "peer_reset")


def make_app(registry: CollectorRegistry, readiness: Readiness) -> App:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in PROBES:
            return metrics(environ, start_response)
        waiting = readiness() if path == "/readyz" else []
        body = ("ok\n" if not waiting else "not ready: " + "; ".join(waiting) + "\n").encode()
        start_response("200 OK" if not waiting else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


# --- HTTP/1.x request heads: pure ------------------------------------------------------------------

class BadRequest(ValueError):
    """The request head is not one this listener answers."""


def head_end(buf: bytes | bytearray) -> int:
    """Where the request head ends (after its blank line), -1 if it has not yet."""
    crlf, lf = buf.find(b"\r\n\r\n"), buf.find(b"\n\n")
    ends = [i + 4 for i in (crlf,) if i >= 0] + [i + 2 for i in (lf,) if i >= 0]
    return min(ends, default=-1)


def parse_head(head: bytes) -> dict[str, Any]:
    """The WSGI environ of a request head: method, path, query, protocol and the headers as HTTP_*."""
    lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise BadRequest(f"bad request line {lines[0][:80]!r}")
    method, target, protocol = parts
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": unquote(path, "iso-8859-1"),
                               "QUERY_STRING": query, "SERVER_PROTOCOL": protocol, "SCRIPT_NAME": ""}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"bad header line {line[:80]!r}")
        environ["HTTP_" + name.upper().replace("-", "_")] = value.strip()
    return environ


def run_app(app: App, environ: dict[str, Any]) -> bytes:
    """The whole HTTP/1.0 answer of `app` to `environ` (no body for HEAD), closing the connection."""
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started[:] = [status, headers]

    body = b"".join(app(environ, start_response))
    status, headers = started
    lines = [f"HTTP/1.0 {status}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in ("content-length", "connection")]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if environ["REQUEST_METHOD"] == "HEAD" else body)


def plain_answer(status: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.0 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


# --- the loop ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ListenerStats:
    """A snapshot for metrics."""

    open: int
    cap: int
    closed: dict[str, int] = field(default_factory=dict)  # by CLOSE_REASONS
    accept_errors: dict[str, int] = field(default_factory=dict)  # by errno name


class _Connection:
    __slots__ = ("key", "sock", "buf", "out")

    def __init__(self, key: int, sock: socket.socket) -> None:
        self.key = key
        self.sock = sock
        self.buf = bytearray()
        self.out = b""


class HttpListener:
    """The selector loop: one thread, every connection, the limits above. Stop: shutdown(), then server_close()."""

    def __init__(self, sock: socket.socket, app: App, limits: LimitSettings, budget: Budget,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sock = sock
        self._app = app
        self._budget = budget
        self._clock = clock
        self._table = ConnectionTable(budget.cap, limits)
        self._conns: dict[int, _Connection] = {}
        self._next_key = 0
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (sock, self._wake_r, self._wake_w):
            s.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._paused_until: float | None = None
        self._backoff = AcceptBackoff()
        self._errors = RateLimitedLog(log, LOG_INTERVAL, clock)
        self._lock = threading.Lock()
        self._closed = dict.fromkeys(CLOSE_REASONS, 0)
        self._accept_errors: dict[str, int] = {}
        self._jobs: queue.SimpleQueue[tuple[_Connection, dict[str, Any]] | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[_Connection, bytes]] = queue.SimpleQueue()
        self._pending = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None

    @property
    def server_address(self) -> tuple[Any, ...]:
        return self._sock.getsockname()

    def snapshot(self) -> ListenerStats:
        with self._lock:
            return ListenerStats(open=len(self._table), cap=self._budget.cap, closed=dict(self._closed),
                                 accept_errors=dict(self._accept_errors))

    def start(self) -> None:
        self._thread = AgentThread(target=self.serve_forever, name="npaudit-http", daemon=True)
        self._worker = AgentThread(target=self._render_forever, name="npaudit-http-metrics", daemon=True)
        self._worker.start()
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(5)
        self._jobs.put(None)

    def close(self) -> None:
        """Stop serving, then close the socket and every connection (shutdown, then server_close)."""
        self.shutdown()
        self.server_close()

    def server_close(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._selector.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()

    def serve_forever(self) -> None:
        while not self._stop.is_set():
            now = self._clock()
            for key, reason in self._table.expired(now):
                self._close(self._conns[key], reason)
            if self._paused_until is not None and now >= self._paused_until:
                self._paused_until = None
                self._selector.register(self._sock, selectors.EVENT_READ)
            for sk, mask in self._selector.select(self._timeout(now)):
                try:
                    self._event(sk, mask)
                except Exception as exc:  # one connection's surprise must not end the loop (and the probes)
                    self._errors.log(logging.ERROR, "loop", "metrics listener: %s", one_line(exc))
                    conn = self._conns.get(sk.data) if sk.data is not None else None
                    if conn is not None:
                        self._close(conn, None)

    def _event(self, sk: selectors.SelectorKey, mask: int) -> None:
        if sk.fileobj is self._sock:
            self._accept()
        elif sk.fileobj is self._wake_r:
            self._drain_wake()
        else:
            conn = self._conns.get(sk.data)
            if conn is None:
                return
            if mask & selectors.EVENT_READ:
                self._read(conn)
            elif mask & selectors.EVENT_WRITE:
                self._write(conn)

    def _timeout(self, now: float) -> float | None:
        """Until the next connection deadline or the end of an accept pause; None (no wake-up by time) when
        neither is due: shutdown and rendered answers wake the loop through the wake socket."""
        due = [t for t in (self._table.next_deadline(), self._paused_until) if t is not None]
        return max(0.0, min(due) - now) if due else None

    # accepting

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._accept_failed(exc)
                return
            sock.setblocking(False)
            if sock.fileno() >= self._budget.refuse_fd:
                self._count("descriptors_short")  # before the close: whoever sees it closed sees it counted
                sock.close()
                self._pause("reserve", f"a connection got descriptor {self._budget.refuse_fd} or above "
                            "(the agent's reserve: its own work comes first)")
                return
            self._backoff.succeeded()
            key, self._next_key = self._next_key, self._next_key + 1
            admission = self._table.admit(key, self._clock())
            if not admission.admitted:
                self._count("refused")
                sock.close()
                continue
            if admission.evict is not None:
                self._close(self._conns[admission.evict], "evicted")
            conn = _Connection(key, sock)
            self._conns[key] = conn
            self._selector.register(sock, selectors.EVENT_READ, key)
            self._read(conn)  # a client sends at once: a probe is answered before more connections come in

    def _accept_failed(self, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        with self._lock:
            self._accept_errors[name] = self._accept_errors.get(name, 0) + 1
        self._pause(name, f"accept failed: {exc.strerror or exc} ({name})")

    def _pause(self, key: str, why: str) -> None:
        delay = self._backoff.failed()
        self._errors.log(logging.WARNING, key, "metrics listener: %s; accepting paused for %.2fs", why, delay)
        if self._paused_until is None:
            self._selector.unregister(self._sock)
        self._paused_until = self._clock() + delay

    # one connection

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, "peer_reset")
            return
        if not data:
            self._close(conn, None)
            return
        conn.buf += data
        self._table.moved(conn.key, self._clock(), heard=True)
        end = head_end(conn.buf)
        if end < 0:
            if len(conn.buf) > MAX_HEAD:
                self._answer(conn, plain_answer("400 Bad Request", "request head too large\n"), "bad_request")
            return
        try:
            environ = parse_head(bytes(conn.buf[:end]))
        except BadRequest as exc:
            self._answer(conn, plain_answer("400 Bad Request", f"{exc}\n"), "bad_request")
            return
        if environ["PATH_INFO"] in PROBES:
            self._answer(conn, run_app(self._app, environ))
        elif self._pending >= MAX_PENDING_SCRAPES:
            self._answer(conn, plain_answer("503 Service Unavailable", "busy: a scrape is running\n"))
        else:
            self._pending += 1
            self._table.moved(conn.key, self._clock(), WAITING)
            self._selector.unregister(conn.sock)
            self._jobs.put((conn, environ))

    def _answer(self, conn: _Connection, answer: bytes, counted: str | None = None) -> None:
        if counted is not None:
            self._count(counted)
        conn.out = answer
        self._table.moved(conn.key, self._clock(), WRITING)
        try:
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn.key)
        except KeyError:
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn.key)
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, "peer_reset")
            return
        conn.out = conn.out[sent:]
        self._table.moved(conn.key, self._clock())
        if not conn.out:
            self._close(conn, None)

    def _close(self, conn: _Connection, reason: str | None) -> None:
        if reason is not None:
            self._count(reason)
        self._table.remove(conn.key)
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self._conns.pop(conn.key, None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _count(self, reason: str) -> None:
        with self._lock:
            self._closed[reason] += 1

    # the exposition, rendered off the loop

    def _render_forever(self) -> None:
        while (job := self._jobs.get()) is not None:
            conn, environ = job
            try:
                answer = run_app(self._app, environ)
            except Exception as exc:  # a collector failing (EMFILE reading /proc ...) is one scrape's problem
                self._errors.log(logging.WARNING, "render", "metrics listener: %s failed: %s",
                                 environ["PATH_INFO"], one_line(exc))
                answer = plain_answer("500 Internal Server Error", f"metrics unavailable: {one_line(exc)}\n")
            self._answers.put((conn, answer))
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the loop wakes anyway) or closed at shutdown
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(512):
                pass
        except OSError:
            pass
        while True:
            try:
                conn, answer = self._answers.get_nowait()
            except queue.Empty:
                return
            self._pending -= 1
            if self._conns.get(conn.key) is conn:  # not timed out meanwhile
                self._answer(conn, answer)


DEFAULT_LIMITS = ListenerLimits()


def serve(host: str, port: int, registry: CollectorRegistry, readiness: Readiness,
          limits: LimitSettings = DEFAULT_LIMITS) -> HttpListener:
    """Listen on host:port in a thread of its own; OSError if the address cannot be taken.

    The listener's metrics go on `registry`. Stop: shutdown(), then server_close().
    """
    from policy_agent.metrics import HttpListenerCollector

    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    budget = descriptor_budget(resource.getrlimit(resource.RLIMIT_NOFILE)[0], limits)
    listener = HttpListener(sock, make_app(registry, readiness), limits, budget)
    registry.register(HttpListenerCollector(listener))
    listener.start()
    return listener
