"""One forwarder per syslog destination: tail the audit files, send batches, checkpoint what was delivered, in a thread.

Pipelined: over TCP/TLS the forwarder keeps sending the next batches while
earlier ones are not yet acknowledged by the receiver's TCP, within a bounded
window (window.SendWindow: `window_batches` batches, about `window_bytes`
bytes), so reading and encoding overlap the receiver's reading. When behind (a
read filled a batch), one step reads and sends every batch the window has room
for in one system call each: the thread shares the GIL with the audit pipeline,
and each system call costs it a switch interval or more to get the GIL back
(bench/syslog_throughput.py, the sustained phase, measures it as the agent runs).

At-least-once: the checkpoint only ever names the end of the newest batch
confirmed read by the receiver (window.py: acknowledged by its TCP, and then
followed by `receive_buffer_bytes` more acknowledged bytes, or by the
receiver's orderly close after our end of stream at `stop`), so it never runs
ahead of the receiver. It is not saved after every batch, though: at most every
`checkpoint_interval` seconds or `checkpoint_records` records, whenever the
forwarder has nothing to send or waits to retry, and at `stop`. A dropped
connection, or a receiver that acknowledges nothing for `ack_timeout` seconds,
makes the forwarder read the files again from the newest confirmed batch and
send everything after it again: duplicates at most the window plus about
`receive_buffer_bytes`, never loss; a crash of the agent re-sends what was
confirmed since the last save as well. UDP has no acknowledgement: there the
guarantee ends at the local socket. RELP (relp.py) acknowledges each message
from the receiver's process: a batch is confirmed when all of it was answered
and the checkpoint saved at once, so a crash re-sends at most the window.
`step` is the logic (clock passed in,
returns how long to wait); the thread only calls it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, cast

from auditlog.syslog.checkpoint import Position, load_checkpoint, save_checkpoint
from auditlog.syslog.destination import Destination
from auditlog.syslog.errors import CheckpointError, SyslogError, SyslogFormatError, SyslogTransportError
from auditlog.syslog.framer import Framer
from auditlog.syslog.rfc5424 import FrameEncoder
from auditlog.syslog.tailer import Tailer
from auditlog.syslog.transport import ACK_POLL, RELP_SCHEMES, Backoff, Sender, open_sender, receive_buffer_bound
from auditlog.syslog.stats import ForwarderStats as ForwarderStats  # re-exported: its home is light
from auditlog.syslog.window import Batch, SendWindow
from packetin.tasks import AgentThread

log = logging.getLogger(__name__)

_BACKLOG_EVERY = 5.0  # seconds between looks at the bytes not yet read (a directory listing)

ACK_TIMEOUT = 10.0  # seconds a receiver may hold batches unacknowledged before the connection is dropped
_STOP_DRAIN = 1.0  # seconds `stop` waits for batches in flight to be acknowledged and read, so they need not repeat
# Seconds between looks at the ACKs while batches are in flight, the window has room and nothing new was
# on disk. Every wake-up costs the pipeline the GIL (and the forwarder a switch interval to get it back),
# so an idle window is looked at rarely; ACK_POLL stays for a full window.
ACK_IDLE = 0.02
_FINISH_LEAST = 0.2  # seconds `stop` waits for the receiver's close at least, even if the ACKs took the rest


@dataclass
class _Unsaved:
    """The newest confirmed position not saved yet, and how much lies between it and the saved one."""

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
    receiver_wait_s: float = 0.0
    last_seq: int | None = None
    last_error: str | None = None
    backlog_bytes: int | None = None


class Forwarder:
    """Forwards the audit file set of `live` to one destination, from the checkpoint at `checkpoint`."""

    def __init__(self, destination: Destination, *, live: Path, checkpoint: Path, sender: Sender | None = None,
                 clock: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random,
                 poll_interval: float = 0.25, backoff_base: float = 0.5, backoff_cap: float = 30.0,
                 ack_timeout: float = ACK_TIMEOUT, burst: bool = True) -> None:
        self.destination = destination
        self.checkpoint = Path(checkpoint)
        self._live = Path(live)
        self._sender = sender if sender is not None else open_sender(destination.endpoint, destination.tls)
        self._clock = clock
        self._poll_interval = poll_interval
        self._ack_timeout = ack_timeout
        self._backoff = Backoff(backoff_base, backoff_cap, rand)
        self._encoder = FrameEncoder(destination.header, destination.framing, destination.max_bytes)
        self._framer = Framer.for_encoder(self._encoder)  # runs of records framed in C, where built
        self._unsaved = _Unsaved()
        # RELP: each batch is saved as soon as the receiver answered all of it, so a crash re-sends at most
        # the window (what was sent and not answered); elsewhere saves are spaced out (the docstring).
        self._save_each = destination.endpoint.scheme in RELP_SCHEMES
        self._tailer: Tailer | None = None
        unread = destination.receive_buffer_bytes
        if destination.endpoint.scheme in ("udp", *RELP_SCHEMES):  # relp: an answered message is the receiver's
            unread = 0
        elif unread is None:
            unread = receive_buffer_bound()
        self._window = SendWindow(destination.window_batches, destination.window_bytes, unread)
        self._confirmed: Position | None = None  # the newest confirmed position (at start: the checkpoint)
        self._replay = 0  # frames counted sent that are being sent again after a drop
        self._read_seq: int | None = None  # the newest seq read
        self._reread_to: int | None = None  # after a drop: records up to this seq are read again
        self._queue: deque[Batch] = deque()  # read, not sent yet
        self._acked_at = 0.0  # `now` when the window last became non-empty or saw acknowledgements progress
        self._retry_at = 0.0
        # The last step sent a batch and looked at the ACKs right after: the next one (at once) goes straight
        # on to read and send if the window has room. A look is two system calls, and each costs this thread
        # the GIL for up to a switch interval when the pipeline is busy (bench/syslog_throughput.py).
        self._just_sent = False
        # When behind, a send takes every batch the window has room for (`burst`; False: one batch per step).
        self._burst = burst
        self._more = False  # the last read filled a batch: more is likely on disk (the forwarder is behind)
        self._backlog_at: float | None = None
        self._held_since: float | None = None  # `now` of the step that found the window full (receiver_wait_s)
        self._n = _Counters()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stats(self) -> ForwarderStats:
        """The current counters, connection state and last error."""
        n = self._n
        return ForwarderStats(self.destination.name, self._sender.connected, n.last_seq, n.backlog_bytes,
                              n.last_error, n.sent, n.lost, n.truncated, n.skipped, n.errors,
                              receiver_wait_s=n.receiver_wait_s)

    # --- the logic ---

    def step(self, now: float) -> float:
        """Collect acknowledgements, then read and send or retry once; returns the seconds to wait before the next
        step (0: go on at once; ACK_POLL: a full window awaits acknowledgements; ACK_IDLE: batches in flight,
        nothing new to send)."""
        if self._held_since is not None:
            self._n.receiver_wait_s += max(0.0, now - self._held_since)
            self._held_since = None
        if self._tailer is None:
            start = self._confirmed = load_checkpoint(self.checkpoint)
            self._tailer = Tailer(self._live, start)
            if start is not None:
                self._n.last_seq = start.seq
        if self._unsaved.saved_at is None:
            self._unsaved.saved_at = now
        if self._backlog_at is None or now >= self._backlog_at:
            self._backlog_at = now + _BACKLOG_EVERY
            self._n.backlog_bytes = self._tailer.backlog_bytes()
        just_sent, self._just_sent = self._just_sent, False
        # Also a look at the peer (a receiver closing an idle connection); skipped right after a send that
        # looked, while the window has room for the next batch.
        if self._window.holding and not (just_sent and not self._window.full()):
            try:
                self._collect(now)
            except SyslogError as exc:
                return self._failed(now, exc)
            if self._window and now - self._acked_at >= self._ack_timeout:
                return self._failed(now, SyslogTransportError(
                    f"syslog {self.destination.name}: the receiver acknowledged nothing for {self._ack_timeout:g} s"))
        if now < self._retry_at:
            return self._retry_at - now
        if not self._queue and not self._window.full():
            batch = self._read()
            if batch is not None:
                self._queue.append(batch)
        if self._queue and self._window.has_room(self._queue[0].size):
            return self._send(now, self._queue[0])
        if self._queue or self._window.full():
            self._held_since = now
            return ACK_POLL  # the window is full: room comes with the receiver's ACKs
        if self._window:
            return ACK_IDLE  # nothing new on disk: new records wait this long at most, as when idle
        self._save(now)  # caught up: nothing to lose by saving now
        return self._poll_interval

    def _send(self, now: float, batch: Batch) -> float:
        """Hand the oldest queued batch to the connection (connecting first if needed) and put it in flight; when
        behind (that batch was full), with it the batches after it that the window has room for, in one send."""
        if not batch.frames and not self._window.holding:  # every record skipped: nothing to wait for
            self._queue.popleft()
            self._delivered(now, [batch])
            return 0.0
        window = self._window
        try:
            if not self._sender.connected:
                if window.holding:  # batches of a connection gone: the error path sends them again
                    raise SyslogTransportError(f"syslog {self.destination.name}: the connection was lost")
                self._sender.connect()
                log.info("syslog %s: connected", self.destination.name)
            if not window:
                self._acked_at = now
            self._queue.popleft()
            window.sent(batch)  # in the window before the send: a failed send resets it and reads again
            frames = list(batch.frames)
            while self._burst and self._more and not window.full():
                more = self._read()
                if more is None:
                    break
                if not window.has_room(more.size):
                    self._queue.append(more)
                    break
                window.sent(more)
                frames += more.frames
            # One system call for them all: each call costs this thread the GIL while the pipeline is busy.
            self._sender.send(frames)
            self._collect(now)  # UDP, or a quick receiver: delivered at once
            self._just_sent = True  # ... and looked at: the next step need not look again to send more
        except SyslogError as exc:
            return self._failed(now, exc)
        return 0.0

    def _collect(self, now: float) -> None:
        """Count the batches in flight the receiver has acknowledged by now, deliver those confirmed;
        SyslogError if the connection is gone."""
        window = self._window
        before = window.acked_to
        acked = window.acked(self._sender.unacked())
        if window.acked_to > before:  # any progress, even inside a batch, restarts the ACK timeout
            self._acked_at = now
        if acked:
            self._backoff.reset()
        for batch in acked:
            replayed = min(len(batch.frames), self._replay)
            self._replay -= replayed
            self._n.sent += len(batch.frames) - replayed
            if not self._replay:
                self._n.last_seq = batch.end.seq
        self._delivered(now, window.confirmed())

    def _delivered(self, now: float, batches: list[Batch]) -> None:
        """Move the position to be saved forward past confirmed batches, and save it if it is time."""
        if not batches:
            return
        unsaved = self._unsaved
        unsaved.records += sum(batch.records for batch in batches)
        unsaved.end = self._confirmed = batches[-1].end
        since = now - (now if unsaved.saved_at is None else unsaved.saved_at)
        if (self._save_each or unsaved.records >= self.destination.checkpoint_records
                or since >= self.destination.checkpoint_interval):
            self._save(now)

    def _failed(self, now: float, exc: SyslogError) -> float:
        """Drop the connection, read again from the newest confirmed batch (what follows it is in flight or
        perhaps unread by the receiver: sent again), and back off."""
        self._sender.close()
        if self._window.holding:
            self._replay += self._window.at_risk_frames
            self._window.reset()
            self._queue.clear()
            if self._tailer is not None:
                self._tailer.close()
            self._tailer = Tailer(self._live, self._confirmed)
            self._reread_to = self._read_seq
        self._n.errors += 1
        self._n.last_error = str(exc)
        delay = self._backoff.next_delay()
        self._retry_at = now + delay
        log.warning("%s; resending from seq %s, retrying in %.1f s", exc,
                    "the first" if self._confirmed is None else self._confirmed.seq + 1, delay)
        self._save(now)  # what was confirmed before the outage
        return delay

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

    def _read(self) -> Batch | None:
        dest = self.destination
        tailer = self._tailer
        if tailer is None:
            return None
        batch = tailer.poll(dest.batch_records, dest.batch_bytes, self._framer)
        end = batch.end
        again = self._reread_to is not None and (end is None or end.seq <= self._reread_to)
        if end is not None and not again:
            self._read_seq, self._reread_to = end.seq, None
        n = _Counters() if again else self._n  # read again after a drop: counted the first time
        n.lost += batch.lost
        n.skipped += batch.skipped
        self._more = batch.count >= dest.batch_records or batch.bytes >= dest.batch_bytes
        if end is None:
            return None
        if batch.framed and not batch.slow:
            return Batch.of(cast("list[bytes]", batch.framed), batch.count, end)  # every record framed in C
        frames: list[bytes] = []
        encode = self._encoder.encode
        truncated = 0
        for item in batch.framed or batch.records:
            if isinstance(item, bytes):  # framed by the framer
                frames.append(item)
                continue
            try:
                data, shortened = encode(item.fields, item.line)
            except SyslogFormatError as exc:
                n.skipped += 1
                log.warning("syslog %s: record skipped: %s", dest.name, exc)
                continue
            truncated += shortened
            frames.append(data)
        n.truncated += truncated
        return Batch.of(frames, batch.count, end)

    # --- the thread ---

    def start(self) -> None:
        """Start forwarding in a thread of its own."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = AgentThread(target=self._run, name=f"npaudit-syslog-{self.destination.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread, wait a moment for the batches in flight and the receiver's orderly close, save what
        was confirmed and close the connection; what is not confirmed is sent again at the next start."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.error("syslog %s: forwarder thread still busy after %.0f s", self.destination.name, timeout)
                return False
        self._drain(min(timeout, _STOP_DRAIN))
        self._save(self._clock())
        self._sender.close()
        if self._tailer is not None:
            self._tailer.close()
            self._tailer = None
        self._window.reset()
        self._queue.clear()
        return True

    def _drain(self, timeout: float) -> None:
        """Collect acknowledgements for what is in flight until none is left or `timeout` seconds passed, then
        end the stream: if the receiver closes in order, it has read everything (all confirmed)."""
        deadline = self._clock() + timeout
        while self._window:
            try:
                self._collect(self._clock())
            except SyslogError:
                return
            if not self._window or self._clock() >= deadline:
                break
            time.sleep(ACK_POLL)
        if self._window.holding and self._sender.finish(max(deadline - self._clock(), _FINISH_LEAST)):
            self._delivered(self._clock(), self._window.confirm_all())

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
