"""One syslog destination's Forwarder in a child process of its own: its own interpreter, so its own GIL.

In the agent the forwarder thread shared the one GIL with the audit pipeline, the
writer and its compressor, and each of its system calls cost it a switch interval
or more to get the GIL back: under a distinct-flow flood it fell behind the writer
(bench/syslog_throughput.py, the sustained phase). `ProcessForwarder` has the
surface the agent uses of a Forwarder (start, stop, stats, destination) and runs
the very same Forwarder in `python -c ...` started afresh (no fork of the
running agent with its threads and event loop).

- Control: two pipes, one JSON object a message (never pickle: neither side
  makes objects of the other's choosing). The parent sends numbered requests
  ("start" with the destination, then "stats", "stop"); the child answers each
  with its stats and the request's number, so a reply that came too late (the
  parent gave up after `stats_timeout`) is never taken for the answer to a later
  request. A reply that is not the stats this version writes is logged and
  taken as no reply.
- The child dies with the agent: it watches its request pipe, and the end of it
  (the agent gone, even by SIGKILL) stops it as "stop" does. SIGTERM does too.
  Stopping lets the batch in flight be acknowledged and saves the checkpoint, as
  Forwarder.stop does; a final stats reply carries the last counters.
- Supervision: a child that exits unexpectedly is logged (error), counted
  (ForwarderStats.restarts, npaudit_syslog_forwarder_restarts_total) and
  started again after a backoff (doubling from `restart_base` up to
  `restart_cap`; back to the base once a child ran a minute). The checkpoint is
  on disk, so a new child resends from it: at-least-once, the duplicates those of
  an agent crash.
- Counters are per destination since the agent started, across restarts: the
  last counters a dead child reported are added to its successor's.
- The child's log lines go to the agent's stderr (inherited).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from auditlog.syslog.errors import SyslogError
from auditlog.syslog.destination import Destination
from auditlog.syslog.forwarder import Forwarder, ForwarderStats
from auditlog.syslog.rfc5424 import Framing, Header
from auditlog.syslog.status import SyslogStatusError, stats_from_json
from auditlog.syslog.transport import Endpoint, TlsOptions, open_sender
from packetin.tasks import AgentThread

log = logging.getLogger(__name__)

STATS_TIMEOUT = 2.0  # seconds a stats request waits for the child's reply before the last snapshot is used
RESTART_BASE = 0.5
RESTART_CAP = 30.0
_HEALTHY_RUN = 60.0  # a child that ran this long restarts after RESTART_BASE again
_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # where `auditlog` is imported from
_CHILD = f"import sys; sys.path.insert(0, {_ROOT!r}); from auditlog.syslog.process import main; main()"
_COUNTERS = ("sent", "lost", "truncated", "skipped", "errors", "receiver_wait_s")


class ProcessForwarder:
    """A Forwarder for `destination` in a supervised child process (see the module docstring)."""

    def __init__(self, destination: Destination, *, live: Path, checkpoint: Path,
                 stats_timeout: float = STATS_TIMEOUT, restart_base: float = RESTART_BASE,
                 restart_cap: float = RESTART_CAP, **forwarder_options: Any) -> None:
        # As a Forwarder does: a TLS file that cannot be read fails here, at the agent's start-up (SyslogError),
        # not in a child restarted over and over.
        open_sender(destination.endpoint, destination.tls).close()
        self.destination = destination
        self.checkpoint = Path(checkpoint)
        self._live = Path(live)
        self._options = forwarder_options  # passed on to the child's Forwarder (poll_interval, backoff_...)
        self._stats_timeout = stats_timeout
        self._restart_base, self._restart_cap = restart_base, restart_cap
        self._lock = threading.Lock()  # the pipes and the child
        self._proc: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        self._numbered = 0
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._base = dict.fromkeys(_COUNTERS, 0)  # counters of children gone
        self._last: ForwarderStats | None = None  # the current child's newest snapshot
        self._restarts = 0
        self._silent = False  # the last stats request timed out (warned once until the child answers again)

    @property
    def pid(self) -> int | None:
        """The running child's pid (None between children and when stopped)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Start the child and the thread that restarts it if it dies."""
        if self._supervisor is not None:
            return
        self._stopping.clear()
        self._spawn()
        self._supervisor = AgentThread(target=self._supervise, daemon=True,
                                            name=f"npaudit-syslog-supervisor-{self.destination.name}")
        self._supervisor.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Ask the child to stop (the batch in flight, the checkpoint), wait for it, and end supervision;
        False if it had to be killed."""
        self._stopping.set()
        clean = True
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                self._request("stop")
                final = self._reply(timeout)
                if final is not None:
                    self._last = final
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.error("syslog %s: forwarder process %d still busy after %.0f s: killed",
                              self.destination.name, proc.pid, timeout)
                    proc.kill()
                    proc.wait()
                    clean = False
            self._close_pipes()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.join(timeout)
        return clean

    def stats(self) -> ForwarderStats:
        """The forwarder's counters since start (across restarts), from the child; its last snapshot (not
        connected) if the child is down or does not answer within `stats_timeout`."""
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None and self._request("stats"):
                reply = self._reply(self._stats_timeout)
                if reply is not None:
                    self._last, self._silent = reply, False
                elif not self._silent and proc.poll() is None:
                    self._silent = True
                    log.warning("syslog %s: forwarder process %d did not answer a stats request in %.1f s",
                                self.destination.name, proc.pid, self._stats_timeout)
            return self._combined(live=proc is not None and proc.poll() is None and not self._silent)

    # --- internals ---

    def _combined(self, live: bool) -> ForwarderStats:
        last = self._last
        if last is None:
            last = ForwarderStats(self.destination.name, False, None, None, None, 0, 0, 0, 0, 0)
        counts = {name: self._base[name] + getattr(last, name) for name in _COUNTERS}
        return dataclasses.replace(last, connected=last.connected and live, restarts=self._restarts, **counts)

    def _spawn(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(to_child_r), str(from_child_w)],
                                    pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL)
        except OSError:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:  # the child's ends: only the child holds them, so its exit is an EOF here and ours one there
            os.close(to_child_r)
            os.close(from_child_w)
        self._proc = proc
        self._requests = Connection(to_child_w, readable=False)
        self._replies = Connection(from_child_r, writable=False)
        self._request("start", destination=destination_to_json(self.destination), live=str(self._live),
                      checkpoint=str(self.checkpoint), options=self._options)
        log.info("syslog %s: forwarder process %d started", self.destination.name, proc.pid)

    def _request(self, op: str, **fields: Any) -> bool:
        """Send a numbered request; False if the child's pipe is gone."""
        if self._requests is None:
            return False
        self._numbered += 1
        try:
            self._requests.send_bytes(_dumps({"n": self._numbered, "op": op, **fields}))
            return True
        except (OSError, ValueError):
            return False

    def _reply(self, timeout: float) -> ForwarderStats | None:
        """The child's reply to the newest request, within `timeout` seconds (None: none came)."""
        replies = self._replies
        deadline = time.monotonic() + timeout
        while replies is not None:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not replies.poll(left):
                    return None
                reply = json.loads(replies.recv_bytes())
                number, stats = reply["n"], reply["stats"]
            except (OSError, EOFError):
                return None
            except (ValueError, TypeError, KeyError) as exc:  # not JSON, or not a reply
                log.warning("syslog %s: a reply of the forwarder process that is no reply: %s",
                            self.destination.name, exc)
                continue
            if number == self._numbered:
                try:
                    return stats_from_json(stats)
                except SyslogStatusError as exc:
                    log.warning("syslog %s: forwarder process: %s", self.destination.name, exc)
                    return None
        return None

    def _close_pipes(self) -> None:
        for conn in (self._requests, self._replies):
            if conn is not None:
                conn.close()
        self._requests = self._replies = None

    def _supervise(self) -> None:
        delay = self._restart_base
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                self._close_pipes()
                if self._last is not None:
                    for name in _COUNTERS:
                        self._base[name] += getattr(self._last, name)
                    zeroed: dict[str, Any] = dict.fromkeys(_COUNTERS, 0)
                    self._last = dataclasses.replace(self._last, connected=False, **zeroed)
                self._restarts += 1
                if time.monotonic() - started >= _HEALTHY_RUN:
                    delay = self._restart_base
                log.error("syslog %s: forwarder process %d died (exit status %s); restart %d in %.1f s "
                          "(npaudit_syslog_forwarder_restarts_total); it resends from the checkpoint",
                          self.destination.name, proc.pid, code, self._restarts, delay)
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, self._restart_cap)
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._spawn()
                except OSError as exc:
                    log.error("syslog %s: cannot start a forwarder process: %s", self.destination.name, exc)
                    self._proc = None
                    return


# --- the child ---

def main() -> None:
    """The child: `python -c ... REQUESTS_FD REPLIES_FD`; runs one Forwarder until "stop", SIGTERM or the end of
    the request pipe (the agent gone)."""
    requests = Connection(int(sys.argv[1]), writable=False)
    replies = Connection(int(sys.argv[2]), readable=False)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s npaudit-syslog[{os.getpid()}] %(name)s: %(message)s")
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C on the agent's terminal is the agent's to handle
    try:
        start = json.loads(requests.recv_bytes())
        number = start["n"]
        forwarder = Forwarder(destination_from_json(start["destination"]), live=Path(start["live"]),
                              checkpoint=Path(start["checkpoint"]), **start["options"])
    except (EOFError, OSError):  # the agent went before it sent the destination
        return
    except SyslogError as exc:  # the agent checked this at start-up: a file changed since
        log.error("%s", exc)
        sys.exit(2)
    forwarder.start()
    while not terminated.is_set():
        try:
            if not requests.poll(0.5):
                continue
            request = json.loads(requests.recv_bytes())
        except (EOFError, OSError):  # the agent is gone
            break
        number = request["n"]
        if request["op"] == "stop":
            break
        replies.send_bytes(_stats_reply(number, forwarder))
    forwarder.stop()
    try:
        replies.send_bytes(_stats_reply(number, forwarder))
    except OSError:
        pass


def _stats_reply(number: int, forwarder: Forwarder) -> bytes:
    return _dumps({"n": number, "stats": dataclasses.asdict(forwarder.stats())})


def _dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


# --- the destination over the pipe ---

def destination_to_json(dest: Destination) -> dict[str, Any]:
    """`dest` as plain JSON values (destination_from_json makes it again)."""
    tls = None if dest.tls is None else {f.name: None if (v := getattr(dest.tls, f.name)) is None else str(v)
                                         for f in dataclasses.fields(TlsOptions)}
    return {**{f.name: getattr(dest, f.name) for f in dataclasses.fields(Destination)},
            "endpoint": dataclasses.asdict(dest.endpoint), "header": dataclasses.asdict(dest.header),
            "framing": dest.framing.value, "tls": tls}


def destination_from_json(data: dict[str, Any]) -> Destination:
    """The Destination destination_to_json gave; only the types a Destination holds are made."""
    tls = data["tls"]
    if tls is not None:
        options: dict[str, Any] = {  # the fields destination_to_json wrote: paths and server_name
            name: value if name == "server_name" or value is None else Path(value) for name, value in tls.items()}
        tls = TlsOptions(**options)
    return Destination(**{**data, "endpoint": Endpoint(**data["endpoint"]), "header": Header(**data["header"]),
                          "framing": Framing(data["framing"]), "tls": tls})
