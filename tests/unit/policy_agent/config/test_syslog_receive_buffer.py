"""syslog.destinations[].receive_buffer_bytes: the config reaches the forwarder's window; check-config bounds it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.process import ProcessForwarder
from auditlog.syslog.transport import receive_buffer_bound
from policy_agent.audit_trail import build_syslog as _build_syslog
from policy_agent.config.loader import ConfigError, loads


def _config(tmp_path: Path, extra: str) -> str:
    return (f"state_dir: {tmp_path}\naudit: {{path: {tmp_path / 'audit.jsonl'}}}\n"
            f"syslog:\n  destinations:\n    - {{url: 'tcp://127.0.0.1:1'{extra}}}\n")


@pytest.mark.parametrize("extra,expected", [("", None), (", receive_buffer_bytes: null", None),
                                            (", receive_buffer_bytes: 0", 0),
                                            (", receive_buffer_bytes: 65536", 65536)])
def test_receive_buffer_bytes_reaches_the_forwarders_the_agent_builds(tmp_path: Path, extra: str,
                                                                      expected: int | None) -> None:
    config = loads(_config(tmp_path, extra))
    assert config.syslog.destinations[0].receive_buffer_bytes == expected
    [child] = _build_syslog(config)  # by default in a child process, which builds the Forwarder from this
    assert isinstance(child, ProcessForwarder) and child.destination.receive_buffer_bytes == expected
    [fwd] = _build_syslog(dataclasses.replace(config, syslog=dataclasses.replace(config.syslog, process=False)))
    assert isinstance(fwd, Forwarder) and fwd.destination == child.destination
    # What the send window waits for after a batch before it counts as delivered: unset = the host's bound.
    assert fwd._window.unread_bytes == (receive_buffer_bound() if expected is None else expected)


@pytest.mark.parametrize("value,problem", [("-1", "must be between 0 and 2147483647"),
                                           (".inf", "must be an integer or null, got float inf"),
                                           ("1.5", "must be an integer or null, got float 1.5"),
                                           ("2147483648", "must be between 0 and 2147483647")])
def test_a_negative_infinite_or_huge_receive_buffer_is_refused_naming_the_field(value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads(f"syslog:\n  destinations: [{{url: 'tcp://h', receive_buffer_bytes: {value}}}]\n")
    [error] = info.value.errors
    assert error.startswith(f"syslog.destinations[0].receive_buffer_bytes: {problem}"), error


@pytest.mark.parametrize("value", ["-1", ".inf"])
def test_check_config_refuses_a_bad_receive_buffer_in_one_line(tmp_path: Path, value: str) -> None:
    bad = tmp_path / "npaudit.yaml"
    bad.write_text(f"syslog:\n  destinations: [{{url: 'tcp://h', receive_buffer_bytes: {value}}}]\n")
    check = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "check-config", str(bad)],
                           capture_output=True, text=True)
    assert check.returncode == 1, check.stdout + check.stderr
    assert check.stdout.startswith(f"{bad}: syslog.destinations[0].receive_buffer_bytes: must be "), check.stdout
    assert check.stdout.count("\n") == 1 and check.stderr == "", check.stdout + check.stderr
