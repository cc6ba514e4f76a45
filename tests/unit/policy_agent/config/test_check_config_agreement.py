"""check-config and the agent agree over the whole config schema (issue 24, finding 5).

Every field of the dataclasses in policy_agent/config/ is mutated (numbers x .inf, .nan, -1, huge; paths x
relative, NUL, "/"; the syslog URL x port 0, a line break). For each, `npaudit check-config`'s verdict must
be what the agent's start does with it: a config check-config passes is built by the agent (Agent(config),
its state directory made, its audit writer opened) without an error, and one it refuses stops `npaudit agent`
at load (exit 2) before anything is started.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from policy_agent.agent import Agent
from policy_agent.state_dir import make_state_dir as _make_state_dir
from policy_agent.cli.check_config import cmd_check_config
from policy_agent.config import loader
from policy_agent.config.loader import AgentConfig

NUMBERS = {"inf": float("inf"), "nan": float("nan"), "minus_one": -1, "huge": 10**30}
PATHS = {"relative": "relative/file", "nul": "/tmp/a\x00b", "root": "/"}
URLS = {"port_0": "tcp://127.0.0.1:0", "newline": "tcp://127.0.0.1:5514\nx"}
# String fields that name a file or directory (the loader's path checks apply to them).
PATH_FIELDS = {"state_dir", "path", "run_dir", "tap", "source", "manifest_dir", "kubeconfig", "checkpoint_dir",
               "ca", "cert", "key"}


def _leaves(cls: type, prefix: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from _leaves(kind, (*prefix, f.name))
        elif typing.get_origin(kind) is tuple:  # the syslog destinations: mutate the one of the base config
            (item, _) = typing.get_args(kind)
            yield from _leaves(item, (*prefix, f.name, 0))
        else:
            yield (*prefix, f.name), kind


def _base(tmp: Path) -> dict[str, Any]:
    """A config the agent accepts, every path in `tmp`, one syslog destination to mutate."""
    return {"state_dir": str(tmp / "state"), "ovs": {"run_dir": str(tmp / "ovs")},
            "audit": {"path": str(tmp / "audit" / "audit.jsonl")},
            "syslog": {"process": False, "checkpoint_dir": str(tmp / "ckpt"),
                       "destinations": [{"url": "udp://127.0.0.1:5514"}]}}


def _set(data: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = data
    for key in path[:-1]:
        if isinstance(key, int):
            node = node[key]
        else:
            node = node.setdefault(key, {})
    node[path[-1]] = value


def _mutants() -> Iterator[tuple[str, tuple[str | int, ...], Any]]:
    for path, kind in _leaves(AgentConfig, ()):
        inner = typing.get_args(kind)[0] if typing.get_args(kind) else kind
        name = ".".join(str(p) for p in path)
        if inner in (int, float):
            for label, value in NUMBERS.items():
                yield f"{name}={label}", path, value
        elif inner is str and path[-1] in PATH_FIELDS:
            for label, value in PATHS.items():
                yield f"{name}={label}", path, value
        elif inner is str and path[-1] == "url":
            for label, value in URLS.items():
                yield f"{name}={label}", path, value


MUTANTS = list(_mutants())


def test_the_schema_walk_reaches_every_kind_of_field() -> None:
    names = {m[0].split("=")[0] for m in MUTANTS}
    for expected in ("state_dir", "audit.path", "kubernetes.kubeconfig", "syslog.destinations.0.udp_max_bytes",
                     "syslog.destinations.0.window_bytes", "syslog.destinations.0.url", "openflow.echo_interval",
                     "ovs.run_dir", "syslog.checkpoint_dir", "metrics.max_connections"):
        assert expected in names
    assert len(MUTANTS) > 200


def _check_config(file: Path, capsys: pytest.CaptureFixture[str]) -> bool:
    ok = cmd_check_config(argparse.Namespace(file=str(file))) == 0
    capsys.readouterr()
    return ok


def _agent_builds(config: AgentConfig) -> None:
    """What the agent's start does with the config before OVS: construct everything, make the state
    directory, open (and close) the audit writer."""
    agent = Agent(config)
    _make_state_dir(Path(config.state_dir))
    if agent.audit_writer is not None:
        agent.audit_writer.start()
        agent.audit_writer.close()


@pytest.mark.parametrize("label,path,value", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_check_config_passes_exactly_what_the_agent_builds(label: str, path: tuple[str | int, ...], value: Any,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    data = _base(tmp_path)
    _set(data, path, value)
    file = tmp_path / "npaudit.yaml"
    file.write_text(yaml.safe_dump(data))
    if not _check_config(file, capsys):
        with pytest.raises(loader.ConfigError):
            loader.load(file)  # the agent's load (policy_agent/cli/common.py load_config) refuses it too
        return
    _agent_builds(loader.load(file))  # no error: what check-config passes, the agent's start takes


REFUSED = ["audit.path=root", "state_dir=nul", "syslog.destinations.0.udp_max_bytes=minus_one",
           "syslog.destinations.0.batch_bytes=huge", "syslog.destinations.0.url=port_0",
           "syslog.destinations.0.url=newline", "kubernetes.kubeconfig=relative"]


@pytest.mark.parametrize("label", REFUSED)
def test_a_refused_config_stops_the_agent_at_load_before_anything_starts(label: str, tmp_path: Path) -> None:
    (_, path, value), = [m for m in MUTANTS if m[0] == label]
    data = _base(tmp_path)
    _set(data, path, value)
    file = tmp_path / "npaudit.yaml"
    file.write_text(yaml.safe_dump(data))
    cli = [sys.executable, "-m", "policy_agent.cli.main"]
    check = subprocess.run([*cli, "check-config", str(file)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1, check.stdout
    agent = subprocess.run([*cli, "agent", "--config", str(file)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "NODE_NAME": ""})
    assert agent.returncode == 2, agent.stderr
    assert agent.stderr.startswith("config error: "), agent.stderr
    assert "Traceback" not in agent.stderr
    assert not (tmp_path / "ovs").exists() and not (tmp_path / "state").exists()  # nothing was started
