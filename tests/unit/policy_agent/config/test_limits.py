"""Configuration values that cannot work are refused at load, each with its field; unreadable files are one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policy_agent.config import loader as config


def _errors(text: str) -> list[str]:
    with pytest.raises(config.ConfigError) as err:
        config.loads(text)
    return err.value.errors


@pytest.mark.parametrize("field, section", [
    ("echo_timeout", "openflow"), ("reconnect_max", "openflow"), ("window", "audit"),
    ("poll_interval", "policy"), ("sync_timeout", "kubernetes"), ("pod_wait", "kubernetes"),
])
@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_non_finite_timeouts_windows_and_rates_are_refused(field: str, section: str, value: str) -> None:
    errors = _errors(f"{section}: {{{field}: {value}}}")
    assert len(errors) == 1 and errors[0].startswith(f"{section}.{field}: must be a finite number"), errors


def test_a_non_finite_token_bucket_rate_is_refused() -> None:
    assert _errors("packetin: {policy: {rate: .inf, burst: .nan}}") == [
        "packetin.policy.rate: must be a finite number, got float inf",
        "packetin.policy.burst: must be a finite number, got float nan",
    ]


@pytest.mark.parametrize("text, field", [
    ("audit: {max_size_mb: 1000000000000000000000000000000}", "audit.max_size_mb"),
    ("audit: {backups: 100000000}", "audit.backups"),
    ("audit: {max_age_days: 100000000}", "audit.max_age_days"),
    ("audit: {queue_size: 100000000000}", "audit.queue_size"),
    ("packetin: {policy: {queue_size: 100000000000}}", "packetin.policy.queue_size"),
    ("meters: {policy_deny: {rate: 10000000000}}", "meters.policy_deny.rate"),
    ("meters: {traceflow: {burst: 10000000000}}", "meters.traceflow.burst"),
])
def test_absurd_sizes_are_refused_naming_the_cap(text: str, field: str) -> None:
    errors = _errors(text)
    assert len(errors) == 1 and errors[0].startswith(f"{field}: must be between "), errors


def test_the_caps_leave_real_sizes_alone() -> None:
    cfg = config.loads("audit: {max_size_mb: 1048576, backups: 10000, queue_size: 10000000}\n"
                       "meters: {policy_allow: {rate: 4294967295, burst: 4294967295}}")
    assert cfg.audit.max_size_mb == 1048576 and cfg.meters.policy_allow.rate == 4294967295


@pytest.mark.parametrize("text, field", [
    ("state_dir: run/npaudit", "state_dir"),
    ("audit: {path: audit.jsonl}", "audit.path"),
    ("ovs: {run_dir: ./ovs}", "ovs.run_dir"),
    ("policy: {manifest_dir: policies}", "policy.manifest_dir"),
])
def test_relative_paths_are_refused(text: str, field: str) -> None:
    errors = _errors(text)
    assert len(errors) == 1 and errors[0].startswith(f"{field}: must be an absolute path"), errors


def test_an_empty_manifest_dir_still_means_none() -> None:
    assert config.loads("policy: {manifest_dir: ''}").policy.manifest_dir == ""


@pytest.mark.parametrize("bridge", ["b" * 16, "br int", "br/int", "br:int", "", "-br", "br\nint"])
def test_bridge_names_that_are_not_interface_names_are_refused(bridge: str) -> None:
    errors = _errors(f"ovs: {{bridge: {json.dumps(bridge)}}}")
    assert len(errors) == 1 and errors[0].startswith("ovs.bridge: must be an interface name"), errors


def test_a_fifteen_character_bridge_name_is_accepted() -> None:
    assert config.loads("ovs: {bridge: br-int_0123.abc}").ovs.bridge == "br-int_0123.abc"


@pytest.mark.parametrize("field", ["node_name", "cluster_name"])
@pytest.mark.parametrize("value", ["node\nforged INFO line", "a\tb", "x\x1b[31m", "x\u2028y"])
def test_control_characters_in_names_written_into_records_are_refused(field: str, value: str) -> None:
    errors = _errors(f"{field}: {json.dumps(value)}")
    assert len(errors) == 1 and errors[0].startswith(f"{field}: must not contain control"), errors
    assert "\n" not in errors[0] and "\x1b" not in errors[0]


@pytest.mark.parametrize("netns", ["a/b", "..", ".", "ns with space", "n" * 256])
def test_netns_names_that_cannot_be_a_file_in_var_run_netns_are_refused(netns: str) -> None:
    errors = _errors(f'ovs: {{netns: "{netns}"}}')
    assert len(errors) == 1 and errors[0].startswith("ovs.netns: must be a network namespace name"), errors


def test_an_empty_netns_still_means_the_agents_own() -> None:
    assert config.loads("ovs: {netns: ''}").ovs.netns == ""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *args], capture_output=True, text=True)


def test_a_non_utf8_config_file_is_one_line_naming_the_file_and_byte(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"node_name: ok\ncluster_name: caf\xe9\n")
    check = _cli("check-config", str(bad))
    assert check.returncode == 1
    assert check.stdout == f"{bad}: {bad}: not UTF-8 at line 2 (byte 31)\n", check.stdout + check.stderr
    agent = _cli("agent", "--config", str(bad))
    assert agent.returncode == 2
    assert agent.stderr == f"config error: {bad}: not UTF-8 at line 2 (byte 31)\n", agent.stderr


def test_a_yaml_syntax_error_is_one_line_with_its_position() -> None:
    errors = _errors("ovs:\n  bridge: [unclosed\n")
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert errors[0].startswith("<config>: not valid YAML") and "line 3" in errors[0], errors


@pytest.mark.parametrize("value", ["0", "-1", "0.01", "86400"])
def test_a_meter_statistics_interval_outside_a_tenth_of_a_second_to_an_hour_is_refused(value: str) -> None:
    errors = _errors(f"meters: {{stats_interval: {value}}}")
    assert len(errors) == 1 and errors[0].startswith("meters.stats_interval: must be between 0.1 and 3600"), errors
    assert config.loads("meters: {stats_interval: 0.5}").meters.stats_interval == 0.5


def test_the_longest_read_pause_is_bounded_by_its_default() -> None:
    assert config.loads("openflow: {read_pace_max: 0.1}").openflow.read_pace_max == 0.1  # a record lags less
    assert config.loads("openflow: {read_pace_max: 0}").openflow.read_pace_max == 0  # no pacing
    assert config.loads("{}").openflow.read_pace_max == 0.2  # the default, and the most a record lags
    assert _errors("openflow: {read_pace_max: 0.21}") == ["openflow.read_pace_max: must be 0..0.2 seconds, got 0.21"]
    assert _errors("openflow: {read_pace_max: -0.01}") == ["openflow.read_pace_max: must be 0..0.2 seconds, got -0.01"]
