"""The modules a command imports, read from `python -X importtime` (tests of what each verb loads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[2]


def modules_imported(argv: Sequence[str], *, module: str = "policy_agent.cli.main",
                     ok: Sequence[int] = (0,)) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules `python -m MODULE ARGV` imports, and the finished process (its exit status must be in `ok`)."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", module, *argv], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert res.returncode in ok, res.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}, res


def code_imports(code: str) -> set[str]:
    """The modules `python -c CODE` imports."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}


def under(modules: set[str], prefixes: Sequence[str]) -> list[str]:
    """The modules that are one of `prefixes` or inside one."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))
