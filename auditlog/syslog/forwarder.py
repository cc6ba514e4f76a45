"""One forwarder per syslog destination: tail the audit files, send batches, checkpoint what was delivered, in a thread.

At-least-once: the checkpoint only ever names a position the sender reported
delivered (for TCP/TLS: acknowledged by the receiver's TCP), so it never runs
ahead of the receiver. It is not saved after every batch, though: at most every
`checkpoint_interval` seconds or `checkpoint_records` records, whenever the
forwarder has nothing to send or waits to retry, and at `stop`. A receiver
outage re-sends at most the batch in flight; a crash of the agent re-sends what
was delivered since the last save (duplicates, never loss). UDP has no
acknowledgement: there the guarantee ends at the local socket. `step` is the
logic (clock passed in, returns how long to wait); the thread only calls it.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from auditlog.syslog.checkpoint import Position, load_checkpoint, save_checkpoint
from auditlog.syslog.errors import CheckpointError, SyslogConfigError, SyslogError, SyslogFormatError
from auditlog.syslog.rfc5424 import (DEFAULT_FACILITY, DEFAULT_UDP_MAX_BYTES, MIN_UDP_MAX_BYTES, FrameEncoder,
                                     Framing, Header, encode_test_message, frame, rfc3339_millis)
from auditlog.syslog.tailer import Tailer
from auditlog.syslog.transport import Backoff, Endpoint, Sender, TlsOptions, open_sender, parse_endpoint

log = logging.getLogger(__name__)

_BACKLOG_EVERY = 5.0  # seconds between looks at the bytes not yet read (a directory listing)

# Defaults, documented in config/npaudit.yaml (syslog.destinations) and policy_agent/config.py.
# A batch is one write and one wait for the receiver's ACKs: large enough that the wait is
# rare next to the reading and encoding, small enough to hold in memory and to re-send.
BATCH_RECORDS = 1000
BATCH_BYTES = 1 << 20
# A save is a write, an fsync and a rename: cheap once a second, not after every batch.
# Both bound what a crash sends again.
CHECKPOINT_INTERVAL = 1.0
CHECKPOINT_RECORDS = 50_000


@dataclass(frozen=True)
class Destination:
    """One validated destination; `make_destination` builds it from configuration values."""

    endpoint: Endpoint
    header: Header
    framing: Framing
    tls: TlsOptions | None = None
    max_bytes: int | None = None      # UDP only: datagram cap
    batch_records: int = BATCH_RECORDS            # records per send at most
    batch_bytes: int = BATCH_BYTES                # record bytes per send, about
    checkpoint_interval: float = CHECKPOINT_INTERVAL  # seconds between checkpoint saves, at least
    checkpoint_records: int = CHECKPOINT_RECORDS  # ... unless this many records were delivered since

    @property
    def name(self) -> str:
        return str(self.endpoint)


def make_destination(url: str, *, node_name: str, facility: int | str = DEFAULT_FACILITY,
                     framing: str | None = None, tls: TlsOptions | None = None,
                     udp_max_bytes: int = DEFAULT_UDP_MAX_BYTES, batch_records: int = BATCH_RECORDS,
                     batch_bytes: int = BATCH_BYTES, checkpoint_interval: float = CHECKPOINT_INTERVAL,
                     checkpoint_records: int = CHECKPOINT_RECORDS) -> Destination:
    """A Destination from configuration values; SyslogConfigError naming the field that is wrong."""
    endpoint = parse_endpoint(url)
    if endpoint.scheme == "udp":
        if framing not in (None, Framing.DATAGRAM.value):
            raise SyslogConfigError(f"syslog destination {url}: framing {framing!r} does not apply to udp")
        if not MIN_UDP_MAX_BYTES <= udp_max_bytes <= 65507:
            raise SyslogConfigError(f"syslog destination {url}: udp_max_bytes must be in "
                                    f"{MIN_UDP_MAX_BYTES}..65507, got {udp_max_bytes}")
        chosen = Framing.DATAGRAM
    else:
        names = (Framing.OCTET_COUNTING.value, Framing.LF.value)
        if framing not in (None, *names):
            raise SyslogConfigError(f"syslog destination {url}: framing must be one of {', '.join(names)}")
        chosen = Framing(framing or Framing.OCTET_COUNTING.value)
    if tls is not None and endpoint.scheme != "tls":
        raise SyslogConfigError(f"syslog destination {url}: ca/cert/key need a tls:// URL")
    for name, value, least in (("batch_records", batch_records, 1), ("batch_bytes", batch_bytes, 1),
                               ("checkpoint_interval", checkpoint_interval, 0),
                               ("checkpoint_records", checkpoint_records, 1)):
        if not value >= least:
            raise SyslogConfigError(f"syslog destination {url}: {name} must be >= {least}, got {value}")
    return Destination(endpoint, Header.for_node(node_name, facility), chosen,
                       tls if endpoint.scheme == "tls" else None,
                       udp_max_bytes if endpoint.scheme == "udp" else None, batch_records, batch_bytes,
                       checkpoint_interval, checkpoint_records)


def send_test_message(destination: Destination, *, now: float, test_id: str, sender: Sender | None = None,
                      timeout: float = 10.0) -> None:
    """Send one marked test message (rfc5424.encode_test_message) to `destination` on a connection of its own.

    Returns once TCP/TLS receivers acknowledged it (UDP: once it left the socket);
    SyslogError (transport, TLS or a TLS file that cannot be read) otherwise.
    Touches neither the audit files nor any checkpoint.
    """
    message = encode_test_message(destination.header, timestamp=rfc3339_millis(now), test_id=test_id)
    if sender is None:
        sender = open_sender(destination.endpoint, destination.tls, timeout)
    try:
        sender.connect()
        sender.send([frame(message, destination.framing)])
    finally:
        sender.close()


def checkpoint_name(endpoint: Endpoint) -> str:
    """The checkpoint file name of a destination: one file per scheme, host and port."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", endpoint.host)
    return f"{endpoint.scheme}_{host}_{endpoint.port}.json"


@dataclass(frozen=True)
class ForwarderStats:
    """A snapshot of one forwarder (counters are records, since the forwarder started)."""

    destination: str
    connected: bool
    last_seq_sent: int | None
    backlog_bytes: int | None
    last_error: str | None
    sent: int
    lost: int          # removed by retention before they were sent
    truncated: int     # UDP: sent with a stub MSG
    skipped: int       # lines that are no sealed record, or records that cannot be encoded
    errors: int        # failed connects and sends (each retried)


@dataclass
class _Pending:
    frames: list[bytes]
    records: int
    end: Position


@dataclass
class _Unsaved:
    """The newest delivered position not saved yet, and how much lies between it and the saved one."""

    end: Position | None = None
    records: int = 0
    saved_at: float | None = None  # `now` of the last save (None: not yet)


@dataclass
class _Counters:
    sent: int = 0
    lost: int = 0
    truncated: int = 0
    skipped: int = 0
    errors: int = 0
    last_seq: int | None = None
    last_error: str | None = None
    backlog_bytes: int | None = None


class Forwarder:
    """Forwards the audit file set of `live` to one destination, from the checkpoint at `checkpoint`."""

    def __init__(self, destination: Destination, *, live: Path, checkpoint: Path, sender: Sender | None = None,
                 clock: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random,
                 poll_interval: float = 0.25, backoff_base: float = 0.5, backoff_cap: float = 30.0) -> None:
        self.destination = destination
        self.checkpoint = Path(checkpoint)
        self._live = Path(live)
        self._sender = sender if sender is not None else open_sender(destination.endpoint, destination.tls)
        self._clock = clock
        self._poll_interval = poll_interval
        self._backoff = Backoff(backoff_base, backoff_cap, rand)
        self._encoder = FrameEncoder(destination.header, destination.framing, destination.max_bytes)
        self._unsaved = _Unsaved()
        self._tailer: Tailer | None = None
        self._pending: _Pending | None = None
        self._retry_at = 0.0
        self._backlog_at: float | None = None
        self._n = _Counters()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stats(self) -> ForwarderStats:
        """The current counters, connection state and last error."""
        n = self._n
        return ForwarderStats(self.destination.name, self._sender.connected, n.last_seq, n.backlog_bytes,
                              n.last_error, n.sent, n.lost, n.truncated, n.skipped, n.errors)

    # --- the logic ---

    def step(self, now: float) -> float:
        """Read, send or retry once; returns the seconds to wait before the next step (0: go on at once)."""
        if self._tailer is None:
            start = load_checkpoint(self.checkpoint)
            self._tailer = Tailer(self._live, start)
            if start is not None:
                self._n.last_seq = start.seq
        if self._unsaved.saved_at is None:
            self._unsaved.saved_at = now
        if self._backlog_at is None or now >= self._backlog_at:
            self._backlog_at = now + _BACKLOG_EVERY
            self._n.backlog_bytes = self._tailer.backlog_bytes()
        if self._pending is None:
            self._pending = self._read()
            if self._pending is None:
                self._save(now)  # caught up: nothing to lose by saving now
                return self._poll_interval
        if now < self._retry_at:
            return self._retry_at - now
        pending = self._pending
        try:
            if pending.frames:
                if not self._sender.connected:
                    self._sender.connect()
                    log.info("syslog %s: connected", self.destination.name)
                self._sender.send(pending.frames)
        except SyslogError as exc:
            self._n.errors += 1
            self._n.last_error = str(exc)
            delay = self._backoff.next_delay()
            self._retry_at = now + delay
            log.warning("%s; %d records held, retrying in %.1f s", exc, pending.records, delay)
            self._save(now)  # what was delivered before the outage
            return delay
        self._backoff.reset()
        self._pending = None
        self._n.sent += len(pending.frames)
        self._n.last_seq = pending.end.seq
        unsaved = self._unsaved
        unsaved.end = pending.end
        unsaved.records += pending.records
        since = now - (now if unsaved.saved_at is None else unsaved.saved_at)
        if unsaved.records >= self.destination.checkpoint_records or since >= self.destination.checkpoint_interval:
            self._save(now)
        return 0.0

    def _save(self, now: float) -> None:
        """Persist the newest delivered position, if it is not saved yet."""
        unsaved = self._unsaved
        if unsaved.end is None:
            return
        try:
            save_checkpoint(self.checkpoint, unsaved.end)
        except CheckpointError as exc:  # delivered anyway; a restart would send these again
            self._n.errors += 1
            self._n.last_error = str(exc)
            log.error("%s", exc)
        self._unsaved = _Unsaved(saved_at=now)

    def _read(self) -> _Pending | None:
        dest = self.destination
        tailer = self._tailer
        if tailer is None:
            return None
        batch = tailer.poll(dest.batch_records, dest.batch_bytes)
        self._n.lost += batch.lost
        self._n.skipped += batch.skipped
        end = batch.end
        if end is None:
            return None
        frames: list[bytes] = []
        encode = self._encoder.encode
        truncated = 0
        for item in batch.records:
            try:
                data, shortened = encode(item.fields, item.line)
            except SyslogFormatError as exc:
                self._n.skipped += 1
                log.warning("syslog %s: record skipped: %s", dest.name, exc)
                continue
            truncated += shortened
            frames.append(data)
        self._n.truncated += truncated
        return _Pending(frames, len(batch.records), end)

    # --- the thread ---

    def start(self) -> None:
        """Start forwarding in a thread of its own."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"npaudit-syslog-{self.destination.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread, save what was delivered and close the connection; a batch in flight is sent again
        at the next start."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.error("syslog %s: forwarder thread still busy after %.0f s", self.destination.name, timeout)
                return False
        self._save(self._clock())
        self._sender.close()
        if self._tailer is not None:
            self._tailer.close()
            self._tailer = None
        self._pending = None
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.step(self._clock())
            except Exception as exc:  # a bug or a disk error must not end forwarding for good
                self._n.errors += 1
                self._n.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("syslog %s: forwarder step failed", self.destination.name)
                delay = self._poll_interval * 4
            if delay > 0:
                self._stop.wait(delay)
