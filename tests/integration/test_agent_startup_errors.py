"""`npaudit agent` against a real private OVS: a start-up that cannot work ends in one line naming the cause."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.integration.conftest import OvsEnv
from tests.support.bridge import BRIDGE


def _agent(ovs_env: OvsEnv, tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    fields = {"state_dir": str(tmp_path / "state"), "audit_path": str(tmp_path / "audit" / "audit.jsonl"),
              "listen": "''", **overrides}
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"ovs:\n  run_dir: {ovs_env.ovs.run_dir}\n  netns: {ovs_env.netns}\n  bridge: {BRIDGE}\n"
        f"metrics:\n  listen: {fields['listen']}\n"
        f"state_dir: {fields['state_dir']}\n"
        f"audit:\n  path: {fields['audit_path']}\n")
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "agent", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)


def _in_use(tmp_path: Path) -> tuple[dict[str, str], str, socket.socket]:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    listen = f"127.0.0.1:{held.getsockname()[1]}"
    return {"listen": listen}, f"error: metrics.listen {listen}: cannot listen (Address already in use)", held


def _state_dir_is_a_file(tmp_path: Path) -> tuple[dict[str, str], str, None]:
    (tmp_path / "state").write_text("")
    return {}, f"error: state_dir {tmp_path / 'state'}: exists and is not a directory", None


def _audit_path_under_a_file(tmp_path: Path) -> tuple[dict[str, str], str, None]:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "audit.jsonl"
    return {"audit_path": str(path)}, f"error: audit log {path}: ", None


@pytest.mark.parametrize("case", [_in_use, _state_dir_is_a_file, _audit_path_under_a_file],
                         ids=["metrics port in use", "state_dir is a file", "audit path under a file"])
def test_a_start_that_cannot_work_is_one_line(ovs_env: OvsEnv, tmp_path: Path, case: Callable) -> None:
    overrides, expected, held = case(tmp_path)
    try:
        res = _agent(ovs_env, tmp_path, **overrides)
    finally:
        if held is not None:
            held.close()
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(expected), res.stderr
    assert res.stderr.endswith(errors[0] + "\n"), res.stderr  # the last word
