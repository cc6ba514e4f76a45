"""The package layers hold (meters < packetin < auditlog < policy_agent) and modules stay small.

Every import in a module counts, including the ones inside functions (the agent
imports lazily to keep `npaudit cni` lean), so a lazy upward import is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LAYERS = ("meters", "packetin", "auditlog", "policy_agent")
MAX_LINES = 500  # STYLE.md: a module answers one question


def _modules() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def imported_packages(source: str) -> set[str]:
    """The top-level package of every absolute import in `source`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def upward_imports(layer: str, source: str) -> set[str]:
    higher = set(LAYERS[LAYERS.index(layer) + 1:])
    return imported_packages(source) & higher


def test_the_walk_sees_every_layer_and_catches_a_lazy_upward_import() -> None:
    # The check itself: an import inside a function is found, a sibling or lower layer is fine.
    lazy = "def f():\n    from policy_agent.engine import PolicyEngine\n"
    assert upward_imports("auditlog", lazy) == {"policy_agent"}
    assert upward_imports("policy_agent", lazy) == set()
    assert upward_imports("packetin", "import meters.token_bucket\nfrom packetin import wire\n") == set()
    assert {p.relative_to(ROOT).parts[0] for p in _modules()} == set(LAYERS)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_higher_layer(path: Path) -> None:
    layer = path.relative_to(ROOT).parts[0]
    assert upward_imports(layer, path.read_text()) == set(), (
        f"{path.relative_to(ROOT)} ({layer}) imports a higher layer; order: {' < '.join(LAYERS)}")
@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_the_size_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by what it does"
