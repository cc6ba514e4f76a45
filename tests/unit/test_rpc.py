"""policy_agent.rpc: length-prefixed JSON frames, pure and over sockets and asyncio streams."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_agent import rpc
from policy_agent.rpc import ConnectionClosed, FrameError

REPO = Path(__file__).resolve().parents[2]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


# ---- pure ----

@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_frame_round_trip(message: dict[str, Any]) -> None:
    assert rpc.decode_frame(rpc.encode_frame(message)) == message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_frames_raise_frame_error_only(data: bytes) -> None:
    try:
        rpc.decode_frame(data)
    except FrameError:
        pass


def test_oversize_frames_are_refused_both_ways() -> None:
    with pytest.raises(FrameError, match="exceeds"):
        rpc.encode_frame({"pad": "x" * rpc.MAX_FRAME})
    with pytest.raises(FrameError, match="exceeds"):
        rpc.frame_length(struct.pack(">I", rpc.MAX_FRAME + 1))
    assert rpc.frame_length(struct.pack(">I", rpc.MAX_FRAME)) == rpc.MAX_FRAME


def test_frames_carry_user_text_verbatim_without_breaking_the_frame() -> None:
    message = {"manifests": "name: \"a\nb\" \u2028 \x00 \U0001f600", "n": [1, None, True]}
    frame = rpc.encode_frame(message)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert rpc.decode_frame(frame) == message


# ---- over a blocking socket ----

def test_messages_cross_a_socket_in_order() -> None:
    a, b = socket.socketpair()
    with a, b:
        rpc.send_message(a, {"op": "apply", "i": 1})
        rpc.send_message(a, {"op": "delete", "i": 2})
        assert rpc.recv_message(b) == {"op": "apply", "i": 1}
        assert rpc.recv_message(b) == {"op": "delete", "i": 2}


@pytest.mark.parametrize("sent", [b"", b"\x00\x00", struct.pack(">I", 50) + b"{"])
def test_a_peer_closing_inside_a_frame_is_connection_closed(sent: bytes) -> None:
    a, b = socket.socketpair()
    with b:
        with a:
            a.sendall(sent)
        with pytest.raises(ConnectionClosed, match="closed inside a frame"):
            rpc.recv_message(b)


# ---- over asyncio streams ----

def _read_from(data: bytes) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await rpc.read_message(reader)

    return asyncio.run(go())


def test_stream_reader_reads_one_frame() -> None:
    assert _read_from(rpc.encode_frame({"ok": True})) == {"ok": True}


def test_stream_reader_reports_truncation_and_garbage() -> None:
    with pytest.raises(ConnectionClosed, match="got 1 bytes"):
        _read_from(struct.pack(">I", 10) + b"{")
    with pytest.raises(FrameError, match="not UTF-8 JSON"):
        _read_from(struct.pack(">I", 5) + b"hello")
    with pytest.raises(FrameError, match="exceeds"):
        _read_from(struct.pack(">I", rpc.MAX_FRAME + 1))


# ---- lean imports: `npaudit cni` is exec'd once per Pod ----

def _modules_after(statement: str) -> set[str]:
    code = ("import sys; before = set(sys.modules); " + statement + "; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    return set(proc.stdout.split())


def test_rpc_imports_only_the_standard_library() -> None:
    loaded = _modules_after("import policy_agent.rpc")
    foreign = {m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names}
    assert foreign == {"policy_agent", "policy_agent.errors", "policy_agent.rpc"}


def test_the_cni_plugin_loads_no_agent_machinery() -> None:
    loaded = {m.split(".")[0] for m in _modules_after("import policy_agent.cni.plugin")}
    foreign = {m for m in loaded if m not in sys.stdlib_module_names}
    assert foreign == {"policy_agent"}
