"""How full a read leaves the OpenFlow socket (packetin/connect.py tcp_backlog), asked by the
stream after each big read over TCP and handed to the reader with the read's messages: the reader
takes a read of many messages for input pressure only when the socket stays full behind it.

Real sockets on loopback: the peer has sent everything before the first read, so what each read
leaves behind is known to the byte."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

from packetin.connect import OpenFlowStream, tcp_backlog
from packetin.read_pacing import READ_BIG

MSG = 8192  # 32 of these fill one 256 KiB read of asyncio's exactly
BIG_READS = 4
TAIL = 100


def _message(length: int, xid: int) -> bytes:
    return struct.pack("!BBHI", 6, 2, length, xid) + b"\0" * (length - 8)  # OFPT_ECHO_REQUEST


STREAM = b"".join(_message(MSG, i) for i in range(BIG_READS * 256 * 1024 // MSG)) + _message(TAIL, 9999)


def _inq(sock: socket.socket) -> int:
    import fcntl
    import termios
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def _filled_pair(family: int) -> tuple[socket.socket, socket.socket]:
    """(receiver, sender): the sender has sent all of STREAM and the receiver holds it unread."""
    if family == socket.AF_UNIX:
        rx, tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        tx.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)  # SO_SNDBUFFORCE (root): a unix stream's queue counts here
    else:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        rx = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        rx.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE (root): room for all of STREAM
        rx.connect(srv.getsockname())
        tx, _ = srv.accept()
        srv.close()
    sender = threading.Thread(target=tx.sendall, args=(STREAM,))
    sender.start()
    sender.join(10)
    assert not sender.is_alive(), "the receiver's buffer did not take the whole stream"
    for _ in range(1000):
        if _inq(rx) == len(STREAM):
            break
        threading.Event().wait(0.005)
    assert _inq(rx) == len(STREAM)
    return rx, tx


async def _read_all(rx: socket.socket) -> list[tuple[int, float | None]]:
    """Each read's (bytes of its messages, backlog) as the stream handed them on."""
    loop = asyncio.get_running_loop()
    reads: list[tuple[int, float | None]] = []
    done = loop.create_future()

    def on_messages(msgs: list[bytes], backlog: float | None) -> None:
        reads.append((sum(map(len, msgs)), backlog))
        if sum(n for n, _ in reads) == len(STREAM) and not done.done():
            done.set_result(None)

    rx.setblocking(False)
    transport, _ = await loop.create_connection(
        lambda: OpenFlowStream("test", on_messages, lambda s: None), sock=rx) if rx.family != socket.AF_UNIX \
        else await loop.create_unix_connection(lambda: OpenFlowStream("test", on_messages, lambda s: None), sock=rx)
    try:
        await asyncio.wait_for(done, 10)
    finally:
        transport.close()
    return reads


def test_each_big_read_over_tcp_says_how_full_it_left_the_socket() -> None:
    rx, tx = _filled_pair(socket.AF_INET)
    try:
        rcvbuf = rx.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)  # fixed: set by hand, so not autotuned
        reads = asyncio.run(_read_all(rx))
    finally:
        tx.close()
    assert [n for n, _ in reads] == [256 * 1024] * BIG_READS + [TAIL], "asyncio reads 256 KiB at a time"
    taken = 0
    for n, backlog in reads[:BIG_READS]:
        taken += n
        assert backlog == (len(STREAM) - taken) / rcvbuf, "the bytes left behind, over the buffer"
    assert reads[BIG_READS - 1][1] == TAIL / rcvbuf
    assert reads[-1][1] is None, f"a read under {READ_BIG} bytes is not asked (no syscalls for a lone packet-in)"


def test_a_unix_socket_reports_no_backlog_and_the_message_count_alone_decides() -> None:
    rx, tx = _filled_pair(socket.AF_UNIX)
    try:
        reads = asyncio.run(_read_all(rx))
    finally:
        tx.close()
    assert sum(n for n, _ in reads) == len(STREAM) and any(n >= READ_BIG for n, _ in reads)
    assert all(backlog is None for _, backlog in reads)


def test_a_socket_the_kernel_will_not_describe_has_no_backlog() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.close()
    assert tcp_backlog(sock) is None
