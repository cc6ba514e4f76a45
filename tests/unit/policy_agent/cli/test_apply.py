"""`npaudit apply`'s reply side: what the user is told when the agent answers, refuses or vanishes."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import pytest

from policy_agent import cli
from policy_agent.rpc import encode_frame, frame_length


@pytest.fixture
def state_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npa-cli-", dir="/tmp"))  # AF_UNIX paths are short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def fake_agent(sock_path: Path, reply: dict[str, object] | None) -> threading.Thread:
    """Accept one request, read it whole, then answer `reply` or (None) close without a word."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(1)

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                body = frame_length(conn.recv(4, socket.MSG_WAITALL))
                conn.recv(body, socket.MSG_WAITALL)
                if reply is not None:
                    conn.sendall(encode_frame(reply))
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def apply(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    config = state_dir / "agent.yaml"
    config.write_text(f"state_dir: {state_dir}\n")
    manifest = state_dir / "m.yaml"
    manifest.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    rc = cli.main(["apply", "-f", str(manifest), "--config", str(config)])
    return rc, capsys.readouterr().err


def test_an_agent_that_vanishes_mid_request_means_outcome_unknown(state_dir: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    thread = fake_agent(state_dir / "api.sock", None)
    rc, err = apply(state_dir, capsys)
    thread.join(5)
    assert rc == cli.EXIT_OUTCOME_UNKNOWN and rc not in (0, 1)
    assert err.count("\n") == 1 and "outcome unknown, check status" in err


def test_a_refusal_is_exit_1_with_the_agents_lines(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    thread = fake_agent(state_dir / "api.sock", {"ok": False, "errors": ["Tier/sec: spec.priority: 10 is taken"]})
    rc, err = apply(state_dir, capsys)
    thread.join(5)
    assert (rc, err) == (1, "error: Tier/sec: spec.priority: 10 is taken\n")


def test_the_exit_statuses_are_in_the_help() -> None:
    text = cli.build_parser()._subparsers._group_actions[0].choices["apply"].format_help()  # type: ignore[union-attr]
    assert "3 outcome unknown" in " ".join(text.split())
