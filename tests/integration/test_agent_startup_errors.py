"""`npaudit agent` against a real private OVS: a start-up that cannot work ends in one line naming the cause."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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


@pytest.mark.parametrize("failing", ["metrics port", "audit path"])
def test_a_failed_start_stops_the_ovs_and_namespace_it_started(tmp_path: Path, failing: str) -> None:
    """The agent starts its own embedded OVS (a fresh run_dir and namespace), then cannot listen on the
    metrics port (or open its audit file): it exits 1 and leaves neither daemon of that start running nor
    its namespace."""
    from policy_agent.ovs.embedded import EmbeddedOvs, netns_exists
    from policy_agent.ovs.pids import pid_alive

    run_dir, netns = tmp_path / "ovs", f"npat-fs-{os.getpid()}"
    ovs = EmbeddedOvs(run_dir, netns)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    listen = f"127.0.0.1:{held.getsockname()[1]}"
    audit = tmp_path / "audit" / "audit.jsonl"
    expected = f"metrics.listen {listen}: cannot listen"
    if failing == "audit path":
        held.close()
        listen, audit = "", tmp_path / "file" / "audit.jsonl"
        (tmp_path / "file").write_text("")
        expected = f"error: audit log {audit}: "
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"ovs:\n  run_dir: {run_dir}\n  netns: {netns}\n  bridge: {BRIDGE}\n"
                   f"metrics:\n  listen: '{listen}'\nstate_dir: {tmp_path / 'state'}\n"
                   f"audit:\n  path: {audit}\n")
    pids: dict[str, int] = {}
    agent = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "agent", "--config", str(cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while agent.poll() is None:  # the daemons' pids, read from the run dir while that start runs
            for daemon in ("ovsdb-server", "ovs-vswitchd"):
                pid = ovs.pid(daemon)
                if pid is not None:
                    pids[daemon] = pid
            time.sleep(0.01)
        _, stderr = agent.communicate(timeout=60)
        assert agent.returncode == 1, stderr
        assert expected in stderr, stderr
        assert set(pids) == {"ovsdb-server", "ovs-vswitchd"}, (pids, stderr)  # that start did bring OVS up
        assert not [d for d, pid in pids.items() if pid_alive(pid)], stderr
        assert not netns_exists(netns), stderr
    finally:
        held.close()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        ovs.down()  # stops by the pid files in run_dir what the old code left running; removes the namespace
