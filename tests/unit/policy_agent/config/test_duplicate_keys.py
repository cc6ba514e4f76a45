"""A key given twice in one mapping of the config is refused, naming it (YAML alone keeps the last
silently, so half of a setting written twice would be ignored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policy_agent.cli.main import main
from policy_agent.config.loader import ConfigError, loads

TWICE = """\
state_dir: /tmp/a
audit:
  path: /tmp/x.jsonl
  path: /tmp/y.jsonl
syslog:
  destinations:
    - {url: "tcp://127.0.0.1:514", url: "udp://127.0.0.1:514"}
state_dir: /tmp/b
"""


def test_every_duplicate_key_is_named_with_its_lines() -> None:
    with pytest.raises(ConfigError) as refused:
        loads(TWICE)
    assert refused.value.errors == [
        "audit.path: duplicate key (line 3, again at line 4); YAML would keep only the last: give it once",
        "syslog.destinations[0].url: duplicate key (line 7, again at line 7); YAML would keep only the last: "
        "give it once",
        "state_dir: duplicate key (line 1, again at line 8); YAML would keep only the last: give it once",
    ]


def test_the_same_key_in_different_mappings_and_yaml_merges_still_load() -> None:
    config = loads("audit:\n  path: /tmp/a.jsonl\nsyslog:\n  destinations:\n"
                   "    - &d {url: 'tcp://127.0.0.1:514', framing: octet-counting}\n"
                   "    - {<<: *d, url: 'tcp://127.0.0.2:514'}\n")
    assert config.audit.path == "/tmp/a.jsonl"
    assert [(d.url, d.framing) for d in config.syslog.destinations] == [
        ("tcp://127.0.0.1:514", "octet-counting"), ("tcp://127.0.0.2:514", "octet-counting")]


def test_check_config_refuses_the_file(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "npaudit.yaml"
    path.write_text(TWICE)
    assert main(["check-config", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: audit.path: duplicate key" in out and f"{path}: state_dir: duplicate key" in out
