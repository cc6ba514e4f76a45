"""RELP (the Reliable Event Logging Protocol of rsyslog's librelp): frames, and a Sender whose "delivered" is the
receiver's own `rsp 200` for each message.

A frame is `TXNR SP COMMAND SP DATALEN [SP DATA] LF`; a session starts with
`open` (the offers, answered `rsp 200`), carries one `syslog` command per
message, each answered by `rsp` with the same TXNR once the receiver took the
message (imrelp: handed to its queue), and ends with `close`. Unlike TCP's
acknowledgement, `rsp 200` means the receiver's process has the message, so
nothing acknowledged can be lost in its receive buffer: the forwarder confirms
a batch as soon as every message in it was answered (no receive-buffer
margin), and a crash sends again only what was not answered yet (the window).

The frames handed to `send` are octet-counted syslog frames ("LEN SP MSG",
rfc5424.Framing.OCTET_COUNTING), which is exactly RELP's "DATALEN SP DATA":
each goes on the wire as `TXNR syslog ` + frame + LF, and the byte accounting
(`unacked`) is in those frames' bytes, as for the stream senders.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from auditlog.syslog.connect import Address, open_stream
from auditlog.syslog.errors import SyslogTransportError

RELP_VERSION = b"0"
SOFTWARE = b"npaudit,1,https://github.com/npaudit"
OFFERS = b"relp_version=" + RELP_VERSION + b"\nrelp_software=" + SOFTWARE + b"\ncommands=syslog"
TXNR_MAX = 999_999_999  # librelp: a TXNR has at most 9 digits, then wraps to 1
_MAX_HEADER = 9 + 1 + 32 + 1 + 9 + 1  # TXNR SP COMMAND SP DATALEN SP
_MAX_RSP_DATA = 1 << 16  # a response is a status line and offers; anything longer is not a RELP peer
_POLL = 0.002  # seconds between looks for responses while `finish` waits
_CLOSE_WAIT = 0.2  # seconds `finish` waits for the answer to `close` at least


@dataclass(frozen=True)
class Frame:
    """One RELP frame as read: transaction number, command, data (b"" when DATALEN is 0)."""

    txnr: int
    command: bytes
    data: bytes

    @property
    def code(self) -> int | None:
        """The status code of a `rsp` frame ("200 OK" -> 200), None if the data starts with no number."""
        head = self.data.split(b"\n", 1)[0].split(b" ", 1)[0]
        return int(head) if head.isdigit() else None


def encode_frame(txnr: int, command: bytes, data: bytes = b"") -> bytes:
    """`TXNR SP COMMAND SP DATALEN [SP DATA] LF`."""
    if data:
        return b"%d %b %d %b\n" % (txnr, command, len(data), data)
    return b"%d %b 0\n" % (txnr, command)


def next_txnr(txnr: int) -> int:
    """The transaction number after `txnr` (1 .. TXNR_MAX, then 1 again)."""
    return 1 if txnr >= TXNR_MAX else txnr + 1


def parse_frames(buf: bytes) -> tuple[list[Frame], bytes]:
    """The whole frames at the start of `buf` and the rest (an incomplete frame); SyslogTransportError on bytes
    that are no RELP frame (a peer that is no RELP receiver)."""
    frames = []
    pos = 0
    while pos < len(buf):
        head_end = -1
        spaces = 0
        for i in range(pos, min(len(buf), pos + _MAX_HEADER)):
            if buf[i] == 0x20:
                spaces += 1
                if spaces == 3:
                    head_end = i
                    break
            elif buf[i] == 0x0A and spaces == 2:
                head_end = i
                break
        if head_end < 0:
            if len(buf) - pos >= _MAX_HEADER:
                raise SyslogTransportError(f"relp: not a frame header: {buf[pos:pos + _MAX_HEADER]!r}")
            break
        parts = buf[pos:head_end].split(b" ")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isalpha() or not parts[2].isdigit():
            raise SyslogTransportError(f"relp: not a frame header: {buf[pos:head_end + 1]!r}")
        txnr, command, datalen = int(parts[0]), parts[1], int(parts[2])
        if buf[head_end] == 0x0A:  # "TXNR CMD 0 LF": no data
            if datalen:
                raise SyslogTransportError(f"relp: frame {txnr} {command!r}: DATALEN {datalen} without data")
            frames.append(Frame(txnr, command, b""))
            pos = head_end + 1
            continue
        if datalen > _MAX_RSP_DATA:
            raise SyslogTransportError(f"relp: frame {txnr} {command!r}: DATALEN {datalen} is too long")
        end = head_end + 1 + datalen
        if len(buf) < end + 1:
            break
        if buf[end] != 0x0A:
            raise SyslogTransportError(f"relp: frame {txnr} {command!r}: no trailer after {datalen} bytes")
        frames.append(Frame(txnr, command, buf[head_end + 1:end]))
        pos = end + 1
    return frames, buf[pos:]


class RelpSender:
    """RELP to one receiver (rsyslog imrelp, syslog-ng relp()), over TLS when given a context: `send` writes the
    frames without waiting, `unacked` reads the responses that came and answers the bytes not answered yet."""

    def __init__(self, endpoint: Address, *, tls: ssl.SSLContext | None = None, server_name: str | None = None,
                 timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self._tls = tls
        self._server_name = server_name or endpoint.host
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._txnr = 0  # the last transaction number used on this connection
        self._sent = 0  # frame bytes handed to `send` on this connection
        self._acked = 0  # of those, the bytes of the frames answered 200, all older ones answered too
        self._pending: deque[tuple[int, int]] = deque()  # (txnr, connection offset just after it), oldest first
        self._answered: set[int] = set()  # answered txnrs not at the head of `_pending` yet (out of order)
        self._buf = b""

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Connect and open the session (`open` with our offers, answered `rsp 200` offering `syslog`)."""
        self.close()
        sock = open_stream(self.endpoint, self._timeout, self._tls, self._server_name)
        self._sock = sock
        self._txnr, self._sent, self._acked, self._buf = 1, 0, 0, b""
        self._pending.clear()
        self._answered.clear()
        try:
            sock.sendall(encode_frame(1, b"open", OFFERS))
            answer = self._await(1, time.monotonic() + self._timeout)
        except OSError as exc:
            self.close()
            raise SyslogTransportError(f"syslog {self.endpoint}: relp open failed: {exc}") from exc
        except SyslogTransportError:
            self.close()
            raise
        if answer.code != 200 or b"commands=syslog" not in answer.data:
            self.close()
            raise SyslogTransportError(f"syslog {self.endpoint}: the receiver refused the relp session: "
                                       f"{answer.data[:200]!r}")

    def _await(self, txnr: int, deadline: float) -> Frame:
        """Read (blocking, up to `deadline`) until the response to `txnr` arrives (session set-up only)."""
        sock = self._sock
        if sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        while True:
            frames, self._buf = parse_frames(self._buf)
            for frame in frames:
                if frame.command == b"rsp" and frame.txnr == txnr:
                    return frame
                if frame.command == b"serverclose":
                    raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the relp session")
            left = deadline - time.monotonic()
            if left <= 0:
                raise SyslogTransportError(f"syslog {self.endpoint}: no relp answer within {self._timeout:g} s")
            sock.settimeout(left)
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue  # the deadline check above answers it
            if not chunk:
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the connection")
            self._buf += chunk

    def send(self, frames: Sequence[bytes]) -> None:
        """Write each octet-counted frame as one `syslog` command, back to back; blocks only while the kernel's
        send buffer is full (up to the timeout)."""
        sock = self._sock
        if sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        out = []
        txnr, sent = self._txnr, self._sent
        pending = []
        for data in frames:
            txnr = next_txnr(txnr)
            out.append(b"%d syslog %b\n" % (txnr, data))
            sent += len(data)
            pending.append((txnr, sent))
        try:
            sock.settimeout(self._timeout)
            sock.sendall(b"".join(out))
        except OSError as exc:  # ssl.SSLError is one
            self.close()
            raise SyslogTransportError(f"syslog {self.endpoint}: send failed: {exc}") from exc
        self._txnr, self._sent = txnr, sent
        self._pending.extend(pending)

    def unacked(self) -> int:
        """Frame bytes given to `send` on this connection whose `rsp 200` has not come yet (0: all answered).
        SyslogTransportError if the receiver refused a message, ended the session or closed the connection."""
        if self._sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        try:
            self._read_available()
        except SyslogTransportError:
            self.close()
            raise
        return self._sent - self._acked

    def _read_available(self) -> None:
        """Take in whatever responses have arrived, without waiting."""
        sock = self._sock
        if sock is None:
            raise SyslogTransportError(f"syslog {self.endpoint}: not connected")
        while True:
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                readable, _, _ = select.select([sock], [], [], 0)
                if not readable:
                    break
            sock.setblocking(False)
            try:
                chunk = sock.recv(1 << 16)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            except OSError as exc:
                raise SyslogTransportError(f"syslog {self.endpoint}: the connection failed: {exc}") from exc
            finally:
                sock.settimeout(self._timeout)
            if not chunk:
                self._take()  # answers that came before the end still count
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver closed the connection")
            self._buf += chunk
        self._take()

    def _take(self) -> None:
        frames, self._buf = parse_frames(self._buf)
        for frame in frames:
            if frame.command == b"serverclose":
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver ended the relp session")
            if frame.command != b"rsp":
                continue
            if frame.code != 200:
                raise SyslogTransportError(f"syslog {self.endpoint}: the receiver refused message txnr "
                                           f"{frame.txnr}: {frame.data[:200]!r}")
            self._answered.add(frame.txnr)
        pending = self._pending
        while pending and pending[0][0] in self._answered:
            txnr, self._acked = pending.popleft()
            self._answered.discard(txnr)

    def finish(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the answers to what was sent, then end the session (`close`) and the
        connection. True only if every message sent was answered 200."""
        deadline = time.monotonic() + timeout
        done = False
        try:
            while self._sock is not None and self.unacked() and time.monotonic() < deadline:
                time.sleep(_POLL)
            done = self._sock is not None and self._sent == self._acked
            if self._sock is not None:  # a polite end: the receiver answers `close`, then closes
                txnr = next_txnr(self._txnr)
                self._sock.sendall(encode_frame(txnr, b"close"))
                self._await(txnr, max(deadline, time.monotonic() + _CLOSE_WAIT))
            return done
        except (OSError, SyslogTransportError):
            return done
        finally:
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
