"""policy_agent.config.client: a verb that only talks to the agent reads state_dir as the full loader would, or
leaves the file to the loader (whose errors, exit status 2, a misspelt or doubled key then gets)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from policy_agent.cli import common
from policy_agent.cli.main import main
from policy_agent.config import client, loader

REPO = Path(__file__).resolve().parents[4]


def test_its_names_and_default_are_the_loaders() -> None:
    assert client.TOP_LEVEL == {f.name for f in dataclasses.fields(loader.AgentConfig)}
    assert client.DEFAULT_STATE_DIR == loader.AgentConfig().state_dir
    assert client.AgentAddress().api_socket == loader.AgentConfig().api_socket


@pytest.mark.parametrize("text", [
    "", "# only a comment\n", "state_dir: /srv/npaudit\n", "{state_dir: /srv/x, ovs: {bridge: br-x}}\n",
    "state_dir: /srv/npaudit\nsyslog: {destinations: [{url: 'tcp://127.0.0.1:514'}]}\n",
])
def test_a_valid_config_gives_the_loaders_socket(tmp_path: Path, text: str) -> None:
    path = tmp_path / "npaudit.yaml"
    path.write_text(text)
    address = client.read(str(path))
    assert address is not None and address.api_socket == loader.load(path).api_socket


def test_the_shipped_example_gives_the_loaders_socket() -> None:
    address = client.read(str(REPO / "config" / "npaudit.yaml"))
    assert address is not None and address.api_socket == loader.load(REPO / "config" / "npaudit.yaml").api_socket


@pytest.mark.parametrize("text", [
    "state_dri: /srv/npaudit\n",                        # misspelt: never silently the default
    "state_dir: /srv/a\nstate_dir: /srv/b\n",           # given twice
    "ovs: {bridge: a, bridge: b}\n",                    # given twice, deeper
    "state_dir: srv/npaudit\n",                         # relative
    "state_dir: 7\n",
    "state_dir: \"/srv/a\\nb\"\n",                       # a line break
    "- state_dir: /srv/npaudit\n",                      # not a mapping
    "state_dir: [unclosed\n",                           # not YAML
    "? [a, b]\n: 1\n",                                  # a key that is no name
])
def test_what_it_cannot_vouch_for_is_left_to_the_loader(tmp_path: Path, text: str) -> None:
    path = tmp_path / "npaudit.yaml"
    path.write_text(text)
    assert client.read(str(path)) is None
    with pytest.raises(loader.ConfigError):
        loader.load(path)


def test_an_unreadable_or_non_utf8_file_is_left_to_the_loader(tmp_path: Path) -> None:
    assert client.read(str(tmp_path / "missing.yaml")) is None
    (tmp_path / "latin1.yaml").write_bytes(b"cluster_name: caf\xe9\n")
    assert client.read(str(tmp_path / "latin1.yaml")) is None


def test_no_file_is_the_default_address() -> None:
    address = client.read(None)
    assert address is not None and address.state_dir == client.DEFAULT_STATE_DIR


@pytest.fixture
def no_default_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NPAUDIT_CONFIG", raising=False)
    monkeypatch.setattr(common, "DEFAULT_CONFIG", tmp_path / "absent.yaml")


@pytest.mark.parametrize("argv", [["status"], ["get", "rules"], ["syslog", "status"]])
def test_a_misspelt_state_dir_stops_the_verb_with_the_loaders_error(tmp_path: Path, capsys: Any, argv: list[str],
                                                                     no_default_config: None) -> None:
    config = tmp_path / "npaudit.yaml"
    config.write_text(f"state_dri: {tmp_path}\n")
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--config", str(config)])
    assert exited.value.code == 2
    assert "state_dri: unknown field (did you mean 'state_dir'?)" in capsys.readouterr().err


def test_a_section_the_verb_does_not_use_is_the_agents_to_validate(tmp_path: Path, capsys: Any,
                                                                    no_default_config: None) -> None:
    config = tmp_path / "npaudit.yaml"
    config.write_text(f"state_dir: {tmp_path}\novs: {{bridge: 5}}\n")  # the agent and check-config refuse it
    assert main(["status", "--config", str(config)]) == 1  # status still asks the agent the file names
    assert f"no agent answers at {tmp_path / 'api.sock'}" in capsys.readouterr().err
    assert main(["check-config", str(config)]) != 0
    said = capsys.readouterr()
    assert "ovs.bridge" in said.out + said.err
