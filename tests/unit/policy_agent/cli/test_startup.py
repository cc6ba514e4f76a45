"""`npaudit --version` and `--help` import no verb's machinery, and a verb imports its own module only
(start-up time itself is measured by bench/cli_startup.py, never asserted)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from policy_agent.cli import main

REPO = Path(__file__).resolve().parents[4]
HEAVY = ("os_ken", "prometheus_client", "yaml", "bcc", "auditlog.query", "auditlog.verify", "auditlog.syslog",
         "policy_agent.config.loader", "policy_agent.agent", "meters", "packetin")
VERB_MODULES = {f"policy_agent.cli.{p.stem}" for p in (REPO / "policy_agent" / "cli").glob("*.py")
                if p.stem not in ("__init__", "main", "common")}


def imported(*argv: str) -> tuple[set[str], str]:
    """The modules `npaudit ARGV` imports (from -X importtime) and its stdout."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "policy_agent.cli.main", *argv],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    modules = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    return modules, res.stdout


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["-h"]])
def test_version_and_help_import_no_verb(argv: list[str]) -> None:
    modules, out = imported(*argv)
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"{argv} imports {heavy}"
    assert modules & VERB_MODULES == set()
    if argv == ["--version"]:
        assert out == f"npaudit {metadata.version('npaudit')}\n"  # the installed version, on stdout
    else:
        assert "completion" in out and "show the version and exit" in out


def test_a_verb_imports_its_own_module_only() -> None:
    modules, out = imported("logs", "--help")
    assert "--disposition" in out
    assert modules & VERB_MODULES == {"policy_agent.cli.logs"}


def _help_lines(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in sub._choices_actions}


def test_help_lines_without_the_modules_are_the_modules_own() -> None:
    assert _help_lines(main.build_parser([])) == _help_lines(main.build_parser())
    assert list(_help_lines(main.build_parser())) == list(main.VERBS)


def test_every_verb_still_parses_its_own_options() -> None:
    args = main.build_parser(["verify"]).parse_args(["verify", "-o", "json", "x.jsonl"])
    assert args.output == "json" and args.paths == [Path("x.jsonl")] and callable(args.func)
    with pytest.raises(SystemExit):
        main.build_parser(["logs"]).parse_args(["logs", "--no-such-option"])
