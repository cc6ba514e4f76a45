"""Framing for the agent's unix sockets (CNI, local API): a 4-byte big-endian length, then UTF-8 JSON; and the
local API's client side (its op names and `call`), which every verb that asks the agent uses.

Imports only the standard library, and of it only json and struct at load time: `npaudit cni`
is exec'd once per Pod and loads this module (asyncio is imported by the agent's servers), and a
verb asking the agent must not load the agent's side of the API (sources/local_api.py: the policy
model, manifests, the applied store) just to send a request.
"""

from __future__ import annotations

import json
import struct

from policy_agent.errors import AgentError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import asyncio
    import _socket  # the C module: the CNI plugin uses it without `socket` (start-up time)
    from pathlib import Path
    from typing import Any, Mapping

# 1 MiB is far above any real netconf or manifest request and caps what a peer can make us buffer.
MAX_FRAME = 1 << 20
_LEN = struct.Struct(">I")


class FrameError(AgentError):
    """Bytes that are not a frame of this protocol; callers wrap it into their own protocol's error."""

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(f"{msg}: {details}" if details else msg)
        self.msg = msg
        self.details = details


class ConnectionClosed(FrameError):
    """The peer closed the connection before a whole frame arrived."""


# ---- pure ----

def encode_frame(message: Mapping[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """Body length announced by a 4-byte header; FrameError when over the cap."""
    if len(header) != _LEN.size:
        raise FrameError("truncated frame header")
    (length,) = _LEN.unpack(header)
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    return length


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError("frame is not UTF-8 JSON", str(exc)[:200]) from exc
    if not isinstance(obj, dict):
        raise FrameError("frame must hold a JSON object")
    return obj


def decode_frame(data: bytes) -> dict[str, Any]:
    """Decode one complete frame (header + body, nothing after it)."""
    length = frame_length(data[:_LEN.size])
    if len(data) != _LEN.size + length:
        raise FrameError(f"frame announces {length} bytes but holds {len(data) - _LEN.size}")
    return decode_body(data[_LEN.size:])


# ---- over asyncio streams (the agent's servers) ----

async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    import asyncio  # already loaded wherever a StreamReader exists

    try:
        header = await reader.readexactly(_LEN.size)
        body = await reader.readexactly(frame_length(header))
    except asyncio.IncompleteReadError as exc:
        raise ConnectionClosed("connection closed inside a frame", f"got {len(exc.partial)} bytes") from exc
    return decode_body(body)


async def write_message(writer: asyncio.StreamWriter, message: Mapping[str, Any]) -> None:
    writer.write(encode_frame(message))
    await writer.drain()


# ---- over a blocking socket (the clients: CNI plugin, CLI) ----

def _recv_exactly(sock: _socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = sock.recv(min(n - got, 65536))
        if not chunk:
            raise ConnectionClosed("connection closed inside a frame", f"got {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send_message(sock: _socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall(encode_frame(message))


def recv_message(sock: _socket.socket) -> dict[str, Any]:
    length = frame_length(_recv_exactly(sock, _LEN.size))
    return decode_body(_recv_exactly(sock, length))


# ---- the local API's client (the CLI, the bundle) ----

SYSLOG_STATUS_OP = "syslog-status"
STATUS_OP = "status"
TRACE_OP = "trace"
GET_OP = "get"


class OutcomeUnknown(AgentError):
    """The agent took the request but the connection ended before its reply: the change may
    or may not be in force."""


def call(socket_path: Path, request: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """One request to the agent's local API. OSError: the agent was not reached, nothing happened.
    OutcomeUnknown: it went away (or stayed silent) after the request was sent."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(socket_path))
        send_message(sock, request)
        try:
            return recv_message(sock)
        except (OSError, FrameError) as exc:
            raise OutcomeUnknown(f"agent at {socket_path} closed the connection before replying "
                                 f"({exc}): outcome unknown; the agent's next start keeps the change if OVS "
                                 "enforced it, drops it if not (`npaudit status` says which)") from exc
