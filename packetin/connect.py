"""Reaching a switch's OpenFlow target (a unix socket path, tcp:HOST:PORT, or tcp from another netns)
and the asyncio Protocol that frames its byte stream into messages."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import termios
from typing import Any, Callable, Protocol, TypeVar

from packetin import wire
from packetin.errors import DecodeError
from packetin.netns_socket import socket_in_netns
from packetin.quiet import Early, selector_of
from packetin.read_pacing import READ_BIG, ReadPacer

log = logging.getLogger(__name__)

P = TypeVar("P", bound=asyncio.Protocol)

# The messages of one read, and how full the TCP socket still was after it (None: not asked, or not TCP).
MessagesSink = Callable[[list[bytes], "float | None"], None]


class QuietReader(Protocol):
    """The reader as the event loop's quiet wait needs it (packetin/reader.py PacketInReader)."""

    last_rx: float  # time.monotonic() of the last read

    def quiet_arm(self) -> tuple[Any, ...] | None: ...


def tcp_backlog(sock: Any) -> float | None:
    """What the socket still holds unread, as a fraction of its receive buffer (FIONREAD / SO_RCVBUF);
    None when the kernel will not say. After a full read of a socket we keep up with, this is low
    (the read took most of what had come); when the peer's queue stays full behind it, it is high."""
    try:
        left = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    except (OSError, ValueError):
        return None
    return left / size if size > 0 else None


async def open_target(target: str, netns: str, factory: Callable[[], P]) -> P:
    """Connect to `target` (PATH, unix:PATH or tcp:HOST:PORT) and return the protocol `factory` made.

    `netns` (tcp only, "" = ours) is the network namespace to connect from, e.g. to
    reach a controller port on 127.0.0.1 of the embedded OVS's namespace.
    """
    loop = asyncio.get_running_loop()
    if not target.startswith("tcp:"):
        path = target[5:] if target.startswith("unix:") else target
        _, proto = await loop.create_unix_connection(factory, path)
        return proto
    host, _, port = target[4:].rpartition(":")
    if netns:
        sock = socket_in_netns(netns)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, int(port)))
        except BaseException:
            sock.close()
            raise
        transport, proto = await loop.create_connection(factory, sock=sock)
    else:
        transport, proto = await loop.create_connection(factory, host, int(port))
    # Small control messages (barriers, echo) must not wait for Nagle.
    transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return proto


def timer_reader(transport: asyncio.Transport) -> Callable[[], None] | None:
    """The transport's own read step (recv, then data_received; nothing if nothing came; the end of the
    stream handled), to call from a timer while the transport is paused. asyncio has no public "read
    now": this is its selector transport's `_read_ready` (Python 3.8-3.13). None, said once, where a
    transport lacks it: each paced read then rejoins the poll set first, as resume_reading does."""
    read_now: Callable[[], None] | None = getattr(transport, "_read_ready", None)
    if read_now is None and not _NO_TIMER_READ:
        _NO_TIMER_READ.append(type(transport).__name__)
        log.warning("asyncio's %s has no _read_ready: a paced read rejoins the event loop's poll set first "
                    "(two epoll_ctl and a loop turn more a read in a flood)", type(transport).__name__)
    return read_now


_NO_TIMER_READ: list[str] = []  # the transport type without a timer read, once said


class OpenFlowStream(asyncio.Protocol):
    """One connection: whole messages go to `on_messages` (with, for a big read over TCP, how full the
    socket still was: `tcp_backlog`), the loss of the connection to `on_lost`;
    a stream that cannot be framed is aborted (the owner reconnects). With a `pacer`, a flood is
    read in batches (packetin/read_pacing.py); `hurry()` ends a pause. A pause leaves reading paused
    and its timer reads (`timer_reader`): while paced reads follow each other the socket stays out of
    the poll set, and it goes back when a read is not followed by a pause (or brought nothing)."""

    def __init__(self, target: str, on_messages: MessagesSink,
                 on_lost: Callable[["OpenFlowStream"], None], pacer: ReadPacer | None = None,
                 lone: Callable[[bytes, "tuple[float, float] | None"], bool] | None = None,
                 quiet: QuietReader | None = None) -> None:
        self._target = target
        self._on_messages = on_messages
        # A read of exactly one whole message, nothing buffered before it: lone(message) may take it (True), as
        # on_messages([message]) would, but with its output first (packetin/reader.py PacketInReader.lone).
        self._lone = lone
        self._on_lost = on_lost
        self._framer = wire.Framer()
        self._pacer = pacer
        self._loop = asyncio.get_running_loop()
        self._resume: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self._tcp: Any = None  # the socket, when it is TCP (its backlog is asked after big reads)
        self.closed: asyncio.Future[None] = self._loop.create_future()
        # The event loop's quiet wait (packetin/quiet.py), where the loop has one: this stream is its source.
        self._quiet = selector_of(self._loop) if lone is not None and quiet is not None else None
        self._quiet_reader = quiet
        self._armed: tuple[Any, ...] | None = None  # the last arm given to the wait
        self.fd = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            self._tcp = sock
        if self._quiet is not None and sock is not None:
            self.fd = sock.fileno()
            self._quiet.source = self

    def data_received(self, data: bytes) -> None:
        lone = self._lone
        if lone is not None and len(data) >= wire.OFP_HEADER_LEN and (data[2] << 8 | data[3]) == len(data) \
                and self._framer.empty and lone(data, None):
            self._after_read(len(data))
            return
        # A big read (READ_BIG: we are behind, or near it) is asked how full it left the socket: two
        # syscalls, never for a lone packet-in's read. Asked before the messages are handled, which
        # lets more arrive.
        backlog = tcp_backlog(self._tcp) if self._tcp is not None and len(data) >= READ_BIG else None
        framer = self._framer
        try:
            msgs = framer.feed(data)
        except DecodeError as exc:
            self._broken(exc)
            return
        self._on_messages(msgs, backlog)
        if framer.failed:
            try:
                framer.feed(b"")
            except DecodeError as exc:
                self._broken(exc)
                return
        self._after_read(len(data))

    # --- the event loop's quiet wait (packetin/quiet.py QuietSource) ---

    def may_arm(self) -> bool:
        transport = self.transport
        return transport is not None and self._resume is None and transport.is_reading() and not transport.is_closing()

    def last_read(self) -> float:
        return self._quiet_reader.last_rx if self._quiet_reader is not None else 0.0

    def arm(self) -> tuple[Any, ...] | None:
        reader = self._quiet_reader
        self._armed = reader.quiet_arm() if reader is not None and self._framer.empty else None
        return self._armed

    def quiet_read(self, early: Early) -> None:
        """The read the wait made: exactly one message, its record made (and written, or begun: took_early
        finishes it), then handled as data_received would hand it, at the times it was read."""
        arm, self._armed = self._armed, None
        try:
            if arm is None:  # never: the wait was armed through arm()
                raise RuntimeError("the quiet wait read the OpenFlow socket without an arm")
            arm[0](early)  # RecordOut.took_early: lets the writer's lock go
            raw = early[0]
            if self._lone is not None and len(raw) == (raw[2] << 8 | raw[3]) and self._lone(raw, (early[2], early[1])):
                self._after_read(len(raw))
            else:
                self.data_received(raw)
        except Exception:  # as asyncio's transport takes a failed data_received
            log.exception("OpenFlow stream from %s: a read the event loop's wait made failed; reconnecting",
                          self._target)
            if self.transport is not None:
                self.transport.abort()

    def _after_read(self, size: int) -> None:
        """A read of `size` bytes is handled: with a pacer, pause reading for as long as it says."""
        if self._pacer is not None:
            delay = self._pacer.after_read(size)
            transport = self.transport
            if delay and transport is not None and not transport.is_closing() and self._resume is None:
                if transport.is_reading():  # not when this read came from _paced_read's timer
                    transport.pause_reading()
                self._resume = self._loop.call_later(delay, self._paced_read)

    def _paced_read(self) -> None:
        """A paced pause is over: read now, from this timer's own wake-up. The socket stays out of the
        event loop's poll set while the next read is paced too; it goes back when no pause follows."""
        self._resume = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        read_now = timer_reader(transport)
        if read_now is not None:
            read_now()  # data_received runs in it (or nothing had come, or the stream ended)
            if self._resume is not None or transport.is_closing():
                return
        transport.resume_reading()

    def hurry(self) -> None:
        """Read again now (a paced pause ends): a reply is awaited, or the pause is over."""
        if self._resume is None:
            return
        self._resume.cancel()
        self._resume = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def _broken(self, exc: DecodeError) -> None:
        log.error("OpenFlow stream from %s cannot be framed (%s); reconnecting", self._target, exc)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._quiet is not None and self._quiet.source is self:
            self._quiet.source = None
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self._on_lost(self)
        if not self.closed.done():
            self.closed.set_result(None)
