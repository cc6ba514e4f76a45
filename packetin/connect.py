"""Reaching a switch's OpenFlow target: a unix socket path, tcp:HOST:PORT, or tcp from another netns."""

from __future__ import annotations

import asyncio
import socket
from typing import Callable, TypeVar

from packetin.netns_socket import socket_in_netns

P = TypeVar("P", bound=asyncio.Protocol)


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
