"""The metrics/probe listener cannot be used to starve the agent: cap, eviction, timeouts, accept errors.

The decisions are checked on a table driven by an explicit `now`; the loop itself on loopback
with small limits (no root).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from pathlib import Path
import urllib.error
import urllib.request
from typing import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from policy_agent.http.endpoints import (BadRequest, HttpListener, ListenerStats, make_app, parse_head, run_app,
                                         serve)
from policy_agent.http.limits import (ANSWER_TIMEOUT, FIRST_BYTE_GRACE, WAITING, WRITING, AcceptBackoff, Admission, Budget,
                                      ConnectionTable, ListenerLimits, descriptor_budget)

LIMITS = ListenerLimits(max_connections=3, fd_reserve=0, request_timeout=10.0, idle_timeout=3.0)


# --- the budget and the table, on an explicit clock ------------------------------------------------

def test_the_cap_and_the_reserved_descriptors_follow_rlimit_nofile() -> None:
    defaults = ListenerLimits()
    assert descriptor_budget(1024, defaults) == Budget(cap=64, refuse_fd=896)
    assert descriptor_budget(256, defaults) == Budget(cap=64, refuse_fd=128)
    # A tiny limit: at most half of it reserved, and the cap never above what is left.
    assert descriptor_budget(64, defaults) == Budget(cap=32, refuse_fd=32)
    assert descriptor_budget(1024, ListenerLimits(max_connections=4000)) == Budget(cap=896, refuse_fd=896)
    assert descriptor_budget(-1, defaults).cap == 64  # RLIM_INFINITY


def test_at_the_cap_the_least_recently_active_connection_makes_room() -> None:
    table = ConnectionTable(3, LIMITS)
    for key, now in ((1, 0.0), (2, 1.0), (3, 2.0)):
        assert table.admit(key, now) == Admission(True)
    table.moved(1, 2.5)  # 1 is the oldest, but it just sent a byte: 2 has been quiet longest
    assert table.admit(4, 3.0) == Admission(True, evict=2)
    assert len(table) == 3 and 2 not in table and 4 in table


def test_at_the_cap_a_connection_yet_to_send_is_passed_over_for_its_first_second_while_another_can_go() -> None:
    table = ConnectionTable(3, LIMITS)
    table.admit(1, 0.0)  # a probe: connected, its request not in yet
    for key in (2, 3):
        table.admit(key, 0.01)
        table.moved(key, 0.01, heard=True)  # half-sent requests
    # A flood of half-sent requests: each newcomer pushes out an earlier one of its own, never the probe,
    # though the probe is the oldest and quietest.
    for key in range(4, 40):
        now = key / 100
        assert table.admit(key, now).evict not in (1, None)
        table.moved(key, now, heard=True)
    assert 1 in table
    # Its first second over, it is the least recently active again: it goes first.
    assert table.admit(99, FIRST_BYTE_GRACE) == Admission(True, evict=1)


def test_a_full_table_of_connections_yet_to_send_still_makes_room_with_the_oldest() -> None:
    table = ConnectionTable(3, LIMITS)
    for key, now in ((1, 0.0), (2, 0.1), (3, 0.2)):
        table.admit(key, now)  # none has sent a byte: a flood of bare connects
    assert table.admit(4, 0.3) == Admission(True, evict=1)  # nobody refused, as before the grace
    table.moved(2, 0.4, heard=True)
    assert table.admit(5, 0.5) == Admission(True, evict=2)  # one that has spoken goes before the silent young


def test_a_connection_waiting_for_its_exposition_is_never_evicted_and_a_full_table_of_them_refuses() -> None:
    table = ConnectionTable(2, LIMITS)
    table.admit(1, 0.0)
    table.admit(2, 1.0)
    table.moved(1, 1.5, WAITING)
    assert table.admit(3, 2.0) == Admission(True, evict=2)
    table.moved(3, 2.0, WAITING)
    assert table.admit(4, 3.0) == Admission(False)
    assert len(table) == 2


def test_a_slow_sender_is_closed_at_the_request_timeout_even_while_it_trickles_bytes() -> None:
    table = ConnectionTable(3, LIMITS)
    table.admit(1, 0.0)
    for t in range(1, 10):
        table.moved(1, float(t))  # one byte a second: never idle
        assert table.expired(float(t)) == []
    assert table.next_deadline() == 10.0
    assert table.expired(10.0) == [(1, "request_timeout")] and len(table) == 0


def test_a_silent_connection_is_closed_at_the_idle_timeout_and_a_stalled_answer_too() -> None:
    table = ConnectionTable(3, LIMITS)
    table.admit(1, 0.0)
    table.admit(2, 0.0)
    table.moved(2, 1.0, WRITING)  # the client stopped reading its answer
    assert table.expired(2.9) == []
    assert table.expired(3.0) == [(1, "idle_timeout")]
    assert table.expired(4.0) == [(2, "idle_timeout")]


def test_a_request_waits_for_the_exposition_up_to_the_answer_timeout_only() -> None:
    table = ConnectionTable(3, LIMITS)
    table.admit(1, 0.0)
    table.moved(1, 0.5, WAITING)
    assert table.expired(0.5 + ANSWER_TIMEOUT - 0.1) == []
    assert table.expired(0.5 + ANSWER_TIMEOUT) == [(1, "answer_timeout")]


def test_accepting_pauses_longer_after_each_failure_up_to_a_second_and_resets_on_success() -> None:
    backoff = AcceptBackoff()
    assert [backoff.failed() for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.succeeded()
    assert backoff.failed() == 0.05


# --- request heads --------------------------------------------------------------------------------

def test_a_request_head_becomes_the_environ_the_prometheus_app_reads() -> None:
    env = parse_head(b"GET /metrics?name%5B%5D=up HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
    assert env["REQUEST_METHOD"] == "GET" and env["PATH_INFO"] == "/metrics"
    assert env["QUERY_STRING"] == "name%5B%5D=up" and env["HTTP_ACCEPT_ENCODING"] == "gzip"
    for bad in (b"GET\r\n\r\n", b"GET / HTTP/2\r\n\r\n", b"GET http://x/ HTTP/1.1\r\n\r\n",
                b"GET / HTTP/1.1\r\nno colon\r\n\r\n"):
        with pytest.raises(BadRequest):
            parse_head(bad)


def test_answers_carry_their_length_close_the_connection_and_head_has_no_body() -> None:
    app = make_app(CollectorRegistry(auto_describe=False), lambda: ["OpenFlow not connected"])
    answer = run_app(app, parse_head(b"GET /readyz HTTP/1.1\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.0 503 Service Unavailable\r\n")
    assert b"Content-Length: 34\r\n" in answer and b"Connection: close\r\n" in answer
    assert answer.endswith(b"\r\n\r\nnot ready: OpenFlow not connected\n")
    assert run_app(app, parse_head(b"HEAD /healthz HTTP/1.1\r\n\r\n")).endswith(b"Content-Length: 3\r\n"
                                                                                  b"Connection: close\r\n\r\n")


# --- the loop on loopback -------------------------------------------------------------------------

class _Blocking:
    """A collector that holds the scrape until released (a hung unixctl read, say)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.release.wait(20)
        yield GaugeMetricFamily("npaudit_test_slow", "released", value=1)


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    Gauge("npaudit_test_gauge", "a gauge", registry=reg).set(7)
    return reg


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for s in held:
            s.close()


def _get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _half_sent(port: int, clients: list[socket.socket]) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    clients.append(s)
    return s


def _closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def _stopped(listener: HttpListener) -> None:
    listener.shutdown()
    listener.server_close()


def test_hundreds_of_half_sent_requests_take_no_thread_each_and_probes_still_answer(registry, clients) -> None:
    listener = serve("127.0.0.1", 0, registry, lambda: [], ListenerLimits(max_connections=8, fd_reserve=0))
    try:
        port = listener.server_address[1]
        threads = threading.active_count()
        for i in range(300):
            _half_sent(port, clients)
            if i % 50 == 49:
                assert _get(port, "/healthz", timeout=2) == (200, "ok\n")
        assert threading.active_count() == threads
        status, text = _get(port, "/metrics")
        assert status == 200 and "npaudit_test_gauge 7.0" in text
        stats: ListenerStats = listener.snapshot()
        assert stats.cap == 8 and stats.open <= 8
        assert stats.closed["evicted"] >= 300 - 8
        assert 'npaudit_http_connections_closed_total{reason="evicted"}' in text
        # The evicted ones were closed, not left hanging: the oldest sees the end of its connection.
        assert _closed_by_server(clients[0], within=2)
    finally:
        _stopped(listener)


def test_a_client_between_its_connect_and_its_request_outlasts_a_flood_of_half_sent_ones(registry, clients) -> None:
    # A probe whose process waits for a CPU after connect(): meanwhile ten times the cap of half-sent
    # requests come in. Before the first-byte grace, the probe was the first pushed out (a CI run's failure).
    listener = serve("127.0.0.1", 0, registry, lambda: [], ListenerLimits(max_connections=4, fd_reserve=0))
    try:
        port = listener.server_address[1]
        probe = socket.create_connection(("127.0.0.1", port))
        clients.append(probe)
        for _ in range(40):
            _half_sent(port, clients)
        deadline = time.monotonic() + 5
        while listener.snapshot().closed["evicted"] < 40 - 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the listener has taken every one (it runs in this process, for the GIL)
        assert listener.snapshot().closed["evicted"] == 40 - 3
        probe.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        probe.settimeout(5)
        answer = b""
        while chunk := probe.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.0 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n"), answer
    finally:
        _stopped(listener)


def test_silent_and_trickling_clients_are_closed_at_their_timeouts(registry, clients) -> None:
    limits = ListenerLimits(max_connections=8, fd_reserve=0, request_timeout=1.0, idle_timeout=0.3)
    listener = serve("127.0.0.1", 0, registry, lambda: [], limits)
    try:
        port = listener.server_address[1]
        silent = socket.create_connection(("127.0.0.1", port))
        clients.append(silent)
        trickler = _half_sent(port, clients)
        for _ in range(30):  # a byte every 0.1 s: never idle, but the head never ends
            try:
                trickler.sendall(b"X")
            except OSError:
                break
            time.sleep(0.1)
        assert _closed_by_server(silent, within=3) and _closed_by_server(trickler, within=3)
        closed = listener.snapshot().closed
        assert closed["idle_timeout"] == 1 and closed["request_timeout"] == 1
        assert _get(port, "/healthz") == (200, "ok\n")
    finally:
        _stopped(listener)


def test_a_hung_scrape_delays_no_probe(registry) -> None:
    slow = _Blocking()
    registry.register(slow)  # type: ignore[arg-type]
    listener = serve("127.0.0.1", 0, registry, lambda: ["CNI server not listening"])
    try:
        port = listener.server_address[1]
        scraped: list[tuple[int, str]] = []
        scraper = threading.Thread(target=lambda: scraped.append(_get(port, "/metrics", timeout=20)))
        scraper.start()
        time.sleep(0.2)
        assert _get(port, "/healthz", timeout=2) == (200, "ok\n")
        assert _get(port, "/readyz", timeout=2) == (503, "not ready: CNI server not listening\n")
        assert scraped == []
        slow.release.set()
        scraper.join(20)
        assert scraped[0][0] == 200 and "npaudit_test_slow 1.0" in scraped[0][1]
    finally:
        slow.release.set()
        _stopped(listener)


class _FailingAccepts(socket.socket):
    """A listening socket whose next `failures` accepts fail as they do out of descriptors."""

    failures = 0

    def accept(self) -> tuple[socket.socket, object]:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def _failing_listener(registry: CollectorRegistry, failures: int, budget: Budget) -> HttpListener:
    sock = _FailingAccepts(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.failures = failures
    listener = HttpListener(sock, make_app(registry, lambda: []), ListenerLimits(), budget)
    listener.start()
    return listener


def test_accept_errors_pause_accepting_and_are_logged_once_with_no_traceback(registry, caplog) -> None:
    caplog.set_level(logging.WARNING)
    listener = _failing_listener(registry, failures=5, budget=Budget(cap=8, refuse_fd=1 << 30))
    try:
        # The probe waits in the backlog while accepting pauses (0.05 s, doubling), then gets its answer.
        assert _get(listener.server_address[1], "/healthz", timeout=10) == (200, "ok\n")
        assert listener.snapshot().accept_errors == {"EMFILE": 5}
        lines = [r for r in caplog.records if "accept failed" in r.getMessage()]
        assert len(lines) == 1 and not lines[0].exc_info and "EMFILE" in lines[0].getMessage()
        assert "Traceback" not in caplog.text
    finally:
        _stopped(listener)


def test_a_connection_on_a_reserved_descriptor_is_closed_at_once_and_counted(registry, clients, caplog) -> None:
    listener = _failing_listener(registry, failures=0, budget=Budget(cap=8, refuse_fd=0))
    try:
        port = listener.server_address[1]
        for _ in range(3):
            assert _closed_by_server(_half_sent(port, clients), within=5)
        stats = listener.snapshot()
        assert stats.closed["descriptors_short"] == 3 and stats.open == 0
        assert caplog.text.count("the agent's reserve") == 1
    finally:
        _stopped(listener)


def _voluntary_switches(thread: threading.Thread) -> int:
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_an_idle_listener_sleeps_until_a_client_or_shutdown_wakes_it(registry) -> None:
    listener = serve("127.0.0.1", 0, registry, lambda: [], ListenerLimits(max_connections=8, fd_reserve=0))
    try:
        assert _get(listener.server_address[1], "/healthz", timeout=2) == (200, "ok\n")
        time.sleep(0.2)  # the probe's connection closed: nothing is due
        assert listener._thread is not None
        before = _voluntary_switches(listener._thread)
        time.sleep(3.5)
        assert _voluntary_switches(listener._thread) - before <= 1  # no wake-up by time (each second before)
    finally:
        _stopped(listener)
    assert listener._thread is not None and not listener._thread.is_alive()  # shutdown still wakes it
