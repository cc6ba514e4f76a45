"""A fake agent behind the local API socket and a runner of `npaudit apply`, for the CLI's reply
side."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from policy_agent.cli import main as cli
from policy_agent.rpc import encode_frame, frame_length
from tests.support.accepting import AcceptThread


@pytest.fixture
def state_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npa-cli-", dir="/tmp"))  # AF_UNIX paths are short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def fake_agent(sock_path: Path, reply: dict[str, object] | None) -> AcceptThread:
    """Accept one request, read it whole, then answer `reply` or (None) close without a word. Close it
    when done (tests/support/accepting.py: no thread of it outlives the test)."""
    def serve(conn: socket.socket) -> None:
        with conn:
            body = frame_length(conn.recv(4, socket.MSG_WAITALL))
            conn.recv(body, socket.MSG_WAITALL)
            if reply is not None:
                conn.sendall(encode_frame(reply))
    return AcceptThread(serve, path=sock_path, once=True)


def apply(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    config = state_dir / "agent.yaml"
    config.write_text(f"state_dir: {state_dir}\n")
    manifest = state_dir / "m.yaml"
    manifest.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    rc = cli.main(["apply", "-f", str(manifest), "--config", str(config)])
    return rc, capsys.readouterr().err
