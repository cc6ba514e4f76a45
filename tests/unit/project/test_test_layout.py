"""The test tree's own rules: shared helpers live in tests/support, unit tests mirror the code.

No test or bench module imports from a test_*.py module (a helper there drags its module's
tests and fixtures along, and moves when the tests move); bench/ imports only tests.support;
tests/support imports no test folder; every test folder is a package (basenames repeat).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TEST_FOLDERS = ("unit", "integration", "e2e")


def imported_modules(source: str, package: str) -> set[str]:
    """Every module `source` imports, absolute or relative (resolved against `package`), lazy ones too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            # `from tests.unit import test_x` names the test module in the alias
            found.update(f"{module}.{alias.name}" for alias in node.names if alias.name.startswith("test_"))
    return found


def from_test_modules(modules: set[str]) -> set[str]:
    return {m for m in modules if any(part.startswith("test_") for part in m.split("."))}


def outside_support(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] == "tests" and not m.startswith("tests.support")
            and m != "tests"}


def _package(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def _python_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_walk_catches_absolute_relative_and_lazy_imports_of_a_test_module() -> None:
    # The check itself, on planted imports: each of these is caught, a support import is not.
    planted = {
        "from tests.unit.packetin.test_wire import oxm\n",
        "import tests.e2e.test_policy_e2e\n",
        "from .test_engine import Info\n",
        "from tests.unit.auditlog import test_writer\n",
        "def f():\n    from tests.integration.test_cni import rig\n",
    }
    for source in planted:
        assert from_test_modules(imported_modules(source, "tests.unit.policy_agent")), source
    fine = "from tests.support.flowsim import FlowTable\nfrom packetin import wire\n"
    assert not from_test_modules(imported_modules(fine, "tests.unit.policy_agent"))
    assert outside_support(imported_modules("from tests.support.cluster import Cluster\n", "bench")) == set()
    assert outside_support(imported_modules("from tests.e2e.conftest import x\n", "bench")) == {"tests.e2e.conftest"}


def test_no_test_or_bench_module_imports_from_a_test_module() -> None:
    offenders = {}
    for path in _python_files("tests") + _python_files("bench"):
        bad = from_test_modules(imported_modules(path.read_text(), _package(path)))
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}, f"move the shared helpers to tests/support/: {offenders}"


def test_bench_imports_only_tests_support() -> None:
    offenders = {}
    for path in _python_files("bench"):
        bad = outside_support(imported_modules(path.read_text(), _package(path)))
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}, f"bench/ may import only tests.support: {offenders}"


def test_support_imports_no_test_folder() -> None:
    offenders = {}
    for path in _python_files("tests/support"):
        bad = outside_support(imported_modules(path.read_text(), _package(path)))
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}, f"tests/support is below every test folder: {offenders}"


def test_unit_tests_sit_in_folders_that_mirror_the_code() -> None:
    flat = sorted(p.name for p in (ROOT / "tests" / "unit").glob("test_*.py"))
    assert flat == [], f"put these under tests/unit/<package>/...: {flat}"


def test_every_test_folder_is_a_package() -> None:
    # Test basenames repeat across folders (config/test_syslog.py, cli/test_syslog.py): without
    # __init__.py pytest would import two modules under one name.
    folders = {p.parent for folder in TEST_FOLDERS + ("support",) for p in _python_files(f"tests/{folder}")}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert missing == [], f"add an __init__.py to: {missing}"
