"""No asyncio.wait_for in the agent's code: on Python 3.11 it swallows a cancel that arrives as what it waits for
finishes, and a stop then waits for ever on the task that kept running (packetin/tasks.py says how the agent
once stayed up after SIGTERM). packetin.tasks.within and wait_event are the agent's timed waits."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUTSIDE = ("tests/", "bench/")  # the suite's and the benches' own waits are not the agent's


def wait_for_uses(source: str) -> list[int]:
    """Lines that call or import asyncio's wait_for."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "wait_for" and isinstance(node.value, ast.Name) \
                and node.value.id == "asyncio":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio" and \
                any(alias.name == "wait_for" for alias in node.names):
            lines.append(node.lineno)
    return lines


def test_the_finder_sees_both_spellings() -> None:
    assert wait_for_uses("import asyncio\nasync def f(x):\n    await asyncio.wait_for(x, 1)\n") == [3]
    assert wait_for_uses("from asyncio import sleep, wait_for\n") == [1]
    assert wait_for_uses("from packetin.tasks import within\nasync def f(x):\n    await within(x, 1)\n") == []


def test_the_agents_code_never_waits_with_asyncio_wait_for() -> None:
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    product = [f for f in files if not f.startswith(OUTSIDE)]
    assert len(product) > 100  # the walk sees the agent's packages
    hits = [f"{name}:{line}" for name in product for line in wait_for_uses((ROOT / name).read_text())]
    assert hits == [], "use packetin.tasks.within (or wait_event) in place of asyncio.wait_for"
