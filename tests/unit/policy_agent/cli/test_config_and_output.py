"""Where a verb finds its config without --config ($NPAUDIT_CONFIG, then /etc/npaudit/npaudit.yaml),
`verify --config` and `-o json`, and `-o` as an output format (bundle's file is --output-file)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from policy_agent.cli import common
from policy_agent.cli.main import main
from tests.support.audit_records import sample_record, write_set


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config naming an audit set of 30 records and a state_dir where no agent listens."""
    write_set(tmp_path / "logs" / "audit.jsonl", (sample_record(i) for i in range(30)), max_bytes=1 << 20)
    (tmp_path / "npaudit.yaml").write_text(f"state_dir: {tmp_path / 'state'}\nmetrics: {{listen: ''}}\n"
                                           f"ovs: {{run_dir: {tmp_path / 'ovs'}}}\n"
                                           f"audit: {{path: {tmp_path / 'logs' / 'audit.jsonl'}}}\n")
    monkeypatch.delenv("NPAUDIT_CONFIG", raising=False)
    monkeypatch.setattr(common, "DEFAULT_CONFIG", tmp_path / "absent.yaml", raising=False)
    return tmp_path


def test_verify_reads_audit_path_of_its_config(node: Path, capsys: Any) -> None:
    assert main(["verify", "--config", str(node / "npaudit.yaml"), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["records"] == 30


def test_verify_json_keeps_its_old_spelling(node: Path, capsys: Any) -> None:
    assert main(["verify", str(node / "logs"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 30
    assert main(["verify", str(node / "logs")]) == 0
    assert "30 records" in capsys.readouterr().out


def test_npaudit_config_names_the_config_of_every_verb(node: Path, capsys: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPAUDIT_CONFIG", str(node / "npaudit.yaml"))
    assert main(["verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 30
    assert main(["stats", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"]["records"] == 30
    assert main(["status"]) == 1  # no agent: the line names the socket of the config's state_dir
    assert str(node / "state" / "api.sock") in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["status", "--config", str(node / "other.yaml")])  # --config wins over the variable
    assert exited.value.code == 2
    assert "other.yaml" in capsys.readouterr().err


def test_npaudit_config_naming_a_missing_file_is_an_error(node: Path, capsys: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPAUDIT_CONFIG", str(node / "missing.yaml"))
    with pytest.raises(SystemExit) as exited:
        main(["verify"])
    assert exited.value.code == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_the_default_path_is_read_when_it_exists(node: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "DEFAULT_CONFIG", node / "npaudit.yaml", raising=False)
    assert main(["status"]) == 1
    assert str(node / "state" / "api.sock") in capsys.readouterr().err
    assert main(["verify", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 30


def test_bundle_writes_its_output_file_and_takes_o_as_a_deprecated_file_name(node: Path, capsys: Any) -> None:
    cfg = str(node / "npaudit.yaml")
    assert main(["bundle", "--config", cfg, "--output-file", str(node / "new.tar.gz")]) == 0
    assert (node / "new.tar.gz").stat().st_size > 0
    assert "deprecated" not in capsys.readouterr().err
    assert main(["bundle", "--config", cfg, "-o", str(node / "old.tar.gz")]) == 0
    assert (node / "old.tar.gz").stat().st_size > 0
    assert "-o/--output FILE is deprecated, use --output-file FILE" in capsys.readouterr().err


def _verb_parsers(parser: argparse.ArgumentParser, name: str = "npaudit") -> Iterator[tuple[str, Any]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                yield from _verb_parsers(sub, f"{name} {verb}")


def test_every_o_option_is_an_output_format() -> None:
    from policy_agent.cli.main import build_parser

    found = set()
    for name, parser in _verb_parsers(build_parser()):
        for action in parser._actions:
            if "-o" in action.option_strings:
                found.add(name)
                assert (action.choices and "json" in action.choices) or "deprecated" in (action.help or ""), name
    assert {"npaudit logs", "npaudit stats", "npaudit status", "npaudit trace", "npaudit verify",
            "npaudit syslog status", "npaudit bundle"} <= found
