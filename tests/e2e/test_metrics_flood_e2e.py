"""Half-sent requests flooding the metrics port cannot starve the agent (issue 24, finding 2).

The agent runs with RLIMIT_NOFILE 256; the test holds 1,200 connections to its metrics port, each
with a request head that never ends, and opens a new one for every one the agent closes. Meanwhile
/healthz answers, `npaudit apply` and a CNI ADD succeed, the agent keeps descriptors in reserve, its
log carries no traceback, and the embedded OVS daemons are the ones that ran before (the supervisor
restarted nothing). The flood runs in a process of its own, apart from the probes. Connections stay on
loopback; every one is closed at the end.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from tests.support.cluster import Cluster

AGENT_NOFILE = 256
HELD = 1200  # the count, well past the agent's descriptors
HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: npaudit\r\nAccept: text/plain\r\n"  # no blank line: never ends
PROBE_BOUND = 2.0  # seconds; a bound for the test (the kubelet's probe timeout is 1 s), not a speed claim
REOPEN_PER_PASS = 100  # the flood replaces at most this many closed connections every 0.1 s

MANIFESTS = """\
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {kubernetes.io/metadata.name: x}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {pod: a}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-81, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{ports: [{protocol: TCP, port: 81}]}]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _children_get_nofile(soft: int) -> Iterator[None]:
    """Processes started inside inherit a soft RLIMIT_NOFILE of `soft`; this process gets its own back."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def _hold(port: int, stop: Any, ready: Any, held: Any, most_held: Any, closed: Any) -> None:
    """The flood's process: HELD half-sent requests, each one the agent closes replaced by a new one."""
    selector = selectors.DefaultSelector()

    def open_one() -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))  # EINPROGRESS; the head goes once it is writable
        selector.register(s, selectors.EVENT_WRITE)

    for _ in range(HELD):
        open_one()
    count_from = time.monotonic() + 1.0
    ready.set()
    while not stop.is_set():
        for key, mask in selector.select(0.1):
            s: socket.socket = key.fileobj  # type: ignore[assignment]
            if mask & selectors.EVENT_WRITE:
                try:
                    s.send(HALF_SENT)
                    selector.modify(s, selectors.EVENT_READ)
                    continue
                except OSError:
                    pass
            # Readable: the agent answered or closed it; an error: refused. Either way, a new one.
            selector.unregister(s)
            s.close()
            closed.value += 1
        for _ in range(min(REOPEN_PER_PASS, HELD - len(selector.get_map()))):
            open_one()
        held.value = len(selector.get_map())
        if time.monotonic() >= count_from:
            most_held.value = max(most_held.value, held.value)
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


class Flood:
    """HELD half-sent requests to 127.0.0.1:port from a process of its own, as an attacker is.

    In this process, the flood's thread held the GIL while a probe waited between its connect() and its
    request, for milliseconds: a delay of the test's making, not of the kubelet's.
    """

    def __init__(self, port: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop, self._ready = ctx.Event(), ctx.Event()
        self._held, self._most_held, self._closed = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
        self._process = ctx.Process(target=_hold, name="flood", daemon=True,
                                    args=(port, self._stop, self._ready, self._held, self._most_held, self._closed))

    @property
    def most_held(self) -> int:
        """The most the flood held open after each refill, counted from 1 s after start (by then the agent has
        met every one of the first HELD): a churn the agent clears thousands of times a second is seen after
        every pass, not in four snapshots (two clean-clone runs caught 295 and 550 there)."""
        return int(self._most_held.value)

    @property
    def closed_by_agent(self) -> int:
        return int(self._closed.value)

    def start(self) -> None:
        self._process.start()
        assert self._ready.wait(30), "the flood's process did not open its connections"

    def held(self) -> int:
        return int(self._held.value)

    def close(self) -> None:
        if self._process.pid is None:  # never started
            return
        self._stop.set()
        self._process.join(10)
        if self._process.is_alive():  # by its pid: the process this test started
            self._process.kill()
            self._process.join(5)


def _get(port: int, path: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_ready(port: int, cluster: Cluster, bound: float = 30.0) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if _get(port, "/readyz", timeout=2)[0] == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"agent not ready after {bound}s:\n{cluster.log()}")


def _ovs_pids(cluster: Cluster) -> dict[str, int]:
    return {d: int((cluster.dir / "ovs" / f"{d}.pid").read_text()) for d in ("ovsdb-server", "ovs-vswitchd")}


def _probe_healthz(port: int) -> str:
    """'ok', or what went wrong within PROBE_BOUND."""
    try:
        status, body = _get(port, "/healthz", timeout=PROBE_BOUND)
    except OSError as exc:
        return f"failed: {exc}"
    return "ok" if (status, body) == (200, "ok\n") else f"answered {status} {body!r}"


def test_a_flood_of_half_sent_requests_on_the_metrics_port_starves_nothing() -> None:
    port = _free_port()
    cluster = Cluster(metrics_listen=f"127.0.0.1:{port}")
    # OVS first, with the test's own limits: only the agent runs short of descriptors.
    up = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "ovs", "up", "--config", str(cluster.config)],
                        capture_output=True, text=True, timeout=60)
    flood = Flood(port)
    try:
        assert up.returncode == 0, up.stderr
        with _children_get_nofile(AGENT_NOFILE):
            cluster.start()
        assert cluster.agent is not None
        limits = Path(f"/proc/{cluster.agent.pid}/limits").read_text()
        assert f"Max open files            {AGENT_NOFILE}" in limits, limits
        _wait_ready(port, cluster)
        ovs_before = _ovs_pids(cluster)
        log_before = cluster.log()

        flood.start()
        time.sleep(1.0)  # the agent has met every one of the first HELD connections by now
        # How many the test holds beside each probe is printed; Flood.most_held is what is checked.
        probes, samples = [_probe_healthz(port)], [flood.held()]
        cluster.apply(MANIFESTS)  # raises when `npaudit apply` fails
        probes.append(_probe_healthz(port))
        samples.append(flood.held())
        pod = cluster.add_pod("x", "a", server=False)  # raises when the CNI ADD fails
        probes.append(_probe_healthz(port))
        samples.append(flood.held())
        status, metrics = _get(port, "/metrics", timeout=10)
        time.sleep(3.0)  # a few more of the supervisor's looks (every second) under the flood
        probes.append(_probe_healthz(port))
        samples.append(flood.held())
        agent_fds = len(os.listdir(f"/proc/{cluster.agent.pid}/fd"))
        held, replaced = flood.most_held, flood.closed_by_agent
        ovs_after = _ovs_pids(cluster)
        log = cluster.log()[len(log_before):]
    finally:
        flood.close()
        cluster.close()

    print(f"flood: {held} held at most after a refill (samples beside the probes {samples}), {replaced} closed by "
          f"the agent and replaced; agent descriptors {agent_fds}")
    assert probes == ["ok"] * 4, f"/healthz under the flood: {probes}\n{log[-3000:]}"
    assert pod.ip.startswith("10.246.0.")
    assert status == 200 and 'npaudit_http_connections_max 64.0' in metrics, metrics[-2000:]
    # The flood was real: at once the test held more connections than the agent has descriptors, and the
    # agent kept closing them. (How many at once is a race the agent's own speed decides: the faster it
    # closes, the fewer stay open; HELD // 2 failed a clean-clone run at 550.)
    assert held > AGENT_NOFILE and replaced > HELD, (held, replaced)
    # The listener kept out of the agent's reserve (128 of 256 descriptors at the defaults).
    assert agent_fds < AGENT_NOFILE - 64, agent_fds
    assert "Traceback" not in log, log[-3000:]
    assert sum("metrics listener" in line for line in log.splitlines()) <= 5, log[-3000:]
    assert ovs_after == ovs_before, f"OVS daemons restarted under the flood:\n{log[-3000:]}"
