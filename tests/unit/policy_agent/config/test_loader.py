"""Configuration: the shipped default file, field-precise errors, derived OpenFlow wiring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from policy_agent.config import loader as config

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = ROOT / "config" / "npaudit.yaml"


def test_shipped_config_documents_exactly_the_defaults() -> None:
    assert config.load(SHIPPED) == config.AgentConfig()


def test_empty_file_means_defaults() -> None:
    assert config.loads("") == config.AgentConfig()


def test_every_error_names_its_field() -> None:
    text = """
ovs: {mode: foo, brdge: x, controller_queue_size: 9999}
openflow: {transport: udp, tcp_port: 70000, echo_interval: 0}
packetin: {policy: {rate: -1, queue_size: "a"}, traceflow: 3}
metrics: {listen: nope}
log_level: loud
extra: 1
"""
    with pytest.raises(config.ConfigError) as err:
        config.loads(text)
    errors = err.value.errors
    expected_prefixes = [
        "ovs.brdge: unknown field (did you mean 'bridge'?)",
        "ovs.mode: must be one of embedded, external",
        "ovs.controller_queue_size: must be between 1 and 512",
        "openflow.transport: must be one of auto, unix, tcp",
        "openflow.tcp_port: must be 1..65535",
        "openflow.echo_interval: must be > 0",
        "packetin.policy.rate: must be > 0",
        "packetin.policy.queue_size: must be an integer, got str",
        "packetin.traceflow: must be a mapping",
        "metrics.listen: must be HOST:PORT",
        "log_level: must be one of debug, info, warning, error",
        "extra: unknown field",
    ]
    for prefix in expected_prefixes:
        assert any(e.startswith(prefix) for e in errors), (prefix, errors)
    assert len(errors) == len(expected_prefixes), errors


@pytest.mark.parametrize("text", ["[1, 2]", "ovs: [a]", "a: b: c: :"])
def test_wrong_shapes_are_errors_not_crashes(text: str) -> None:
    with pytest.raises(config.ConfigError):
        config.loads(text)


def test_booleans_are_not_numbers() -> None:
    with pytest.raises(config.ConfigError, match="ovs.controller_queue_size: must be an integer, got bool"):
        config.loads("ovs: {controller_queue_size: true}")


def test_embedded_with_private_netns_defaults_to_tcp_on_its_loopback() -> None:
    cfg = config.AgentConfig()
    assert cfg.openflow_transport == "tcp"
    assert cfg.controller_target == "ptcp:6653:127.0.0.1"
    assert cfg.openflow_target == "tcp:127.0.0.1:6653"
    assert cfg.openflow_netns == "npaudit-ovs"


def test_without_a_private_namespace_the_default_is_a_unix_socket() -> None:
    for text in ("ovs: {netns: ''}", "ovs: {mode: external}"):
        cfg = config.loads(text)
        assert cfg.openflow_transport == "unix"
        assert cfg.controller_target == f"punix:{cfg.openflow_target}"
        assert cfg.openflow_target.endswith("/br-int.npaudit")
        assert cfg.openflow_netns == ""
    assert config.loads("ovs: {mode: external}").ovs.db_remote == "unix:/var/run/openvswitch/db.sock"


def test_explicit_target_means_no_controller_row() -> None:
    cfg = config.loads("openflow: {target: /run/openvswitch/br-int.mgmt}")
    assert cfg.controller_target is None
    assert cfg.openflow_target == "/run/openvswitch/br-int.mgmt"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *args], capture_output=True, text=True)


def test_check_config_cli(tmp_path: Path) -> None:
    ok = _cli("check-config", str(SHIPPED))
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("ovs:\n  bridge: 7\n  mode: nope\n")
    res = _cli("check-config", str(bad))
    assert res.returncode == 1
    assert f"{bad}: ovs.bridge: must be a string, got int 7" in res.stdout
    assert f"{bad}: ovs.mode: must be one of embedded, external; got 'nope'" in res.stdout
    missing = _cli("check-config", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 1 and "cannot read" in missing.stdout


def test_agent_refuses_to_start_on_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("metrics: {listen: 99}\n")
    res = _cli("agent", "--config", str(bad))
    assert res.returncode == 2
    assert "config error: metrics.listen: must be a string, got int 99" in res.stderr
