"""The node name: config `node_name`, else NODE_NAME (a DaemonSet's downward API), else the host name."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from policy_agent.config import loader as config

ROOT = Path(__file__).resolve().parents[4]


def test_node_name_from_the_config_wins_over_node_name_in_the_environment() -> None:
    cfg = config.loads("node_name: vm-7", environ={"NODE_NAME": "worker-1"})
    assert cfg.node == "vm-7"


def test_an_empty_node_name_takes_node_name_from_the_environment() -> None:
    cfg = config.loads("node_name: ''\nkubernetes: {enabled: true}", environ={"NODE_NAME": "worker-1.zone-a"})
    assert cfg.node == "worker-1.zone-a"
    assert cfg.node_name == "worker-1.zone-a"


def test_load_from_a_file_takes_node_name_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "npaudit.yaml"
    path.write_text("log_level: info\n")
    assert config.load(path, environ={"NODE_NAME": "worker-2"}).node == "worker-2"


@pytest.mark.parametrize("environ", [{}, {"NODE_NAME": ""}])
def test_without_node_name_anywhere_the_host_name_is_the_node(environ: dict[str, str]) -> None:
    assert config.loads("", environ=environ).node == socket.gethostname()


@pytest.mark.parametrize("value", [
    "Worker-1",            # node names are lower case
    "worker_1",
    "-worker",
    "worker-",
    "worker..a",
    "node\nforged INFO line",
    "x\x1b[31m",
    "a" * 254,
])
def test_a_node_name_from_the_environment_that_is_not_a_dns1123_subdomain_is_refused(value: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.loads("", environ={"NODE_NAME": value})
    assert len(err.value.errors) == 1
    line = err.value.errors[0]
    assert line.startswith("NODE_NAME (environment, used as node_name): must be a DNS-1123 subdomain"), line
    assert "\n" not in line and "\x1b" not in line


def test_a_bad_node_name_in_the_environment_is_ignored_when_the_config_names_the_node() -> None:
    assert config.loads("node_name: vm-7", environ={"NODE_NAME": "Bad_Name"}).node == "vm-7"


def test_a_bad_node_name_is_reported_with_the_other_config_errors() -> None:
    with pytest.raises(config.ConfigError) as err:
        config.loads("log_level: loud", environ={"NODE_NAME": "Bad_Name"})
    assert [e.split(":")[0] for e in err.value.errors] == ["log_level", "NODE_NAME (environment, used as node_name)"]


def test_check_config_refuses_a_bad_node_name_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "npaudit.yaml"
    path.write_text("kubernetes: {enabled: true}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NODE_NAME="Worker_1")
    out = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "check-config", str(path)],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"{path}: NODE_NAME (environment, used as node_name): must be a DNS-1123 subdomain "
        "(a-z, 0-9, '-', '.'; at most 253 characters), got 'Worker_1'"]
