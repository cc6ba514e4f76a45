"""`npaudit completion bash|zsh`: a script generated from the parser, loaded by a real bash, completing
verbs, sub-verbs, options and their choices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent  # the venv's `npaudit` script
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}


def bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=ENV, timeout=60)


def test_the_bash_script_registers_a_completion_for_npaudit() -> None:
    res = bash("source <(npaudit completion bash); complete -p npaudit")
    assert res.returncode == 0, res.stderr
    assert "-F _npaudit" in res.stdout and res.stdout.rstrip().endswith(" npaudit")


@pytest.mark.parametrize(("words", "expected"), [
    ("npaudit sta", "status stats"),
    ("npaudit syslog ''", "status test"),
    ("npaudit status -o ''", "table json"),
    ("npaudit logs --config x.yaml -o ''", "table compact json"),
    ("npaudit verify -o j", "json"),
    ("npaudit syslog status --c", "--config"),
    ("npaudit ovs ''", "up down status"),
    ("npaudit completion ''", "bash zsh"),
    ("npaudit status --pro", "--probe-kernel"),
])
def test_bash_completes_what_the_parser_has(words: str, expected: str) -> None:
    res = bash("source <(npaudit completion bash)\n"
               f"COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _npaudit\n"
               'echo "${COMPREPLY[*]}"')
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == expected.split()


def test_a_value_without_choices_completes_file_names(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text("")
    res = bash(f"cd {tmp_path}; source <(npaudit completion bash)\n"
               "COMP_WORDS=(npaudit status --config no); COMP_CWORD=3; _npaudit\n"
               'echo "${COMPREPLY[*]}"')
    assert res.stdout.split() == ["node.yaml"], res.stderr
