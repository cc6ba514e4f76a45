"""Import and size rules for the production packages, checked on their source text.

- Layers: meters < packetin < auditlog < policy_agent; a lower layer never imports a higher one.
- Inside policy_agent (SUBPACKAGE_RULES): policy/ and ovs/ import no feature package; cni/,
  sources/ and traceflow/ import neither each other nor the top-level feature modules.
  For these two rules every import counts: at module level, inside a function (the agent imports
  lazily to keep `npaudit cni` lean, so a lazy import is caught too) and under TYPE_CHECKING.
- No import cycle among our modules. An edge is an import that runs: at module level AND inside
  a function (a lazy import is still a dependency, and moved to the top it fails at import
  time). Imports under `if TYPE_CHECKING:` never run and are no edge: they are how a module
  names the types of a Protocol's implementation without depending on it.
- Imports are written so that these checks can read them: no relative imports, no importlib /
  __import__ / file loaders for our packages.
- A module has at most MAX_LINES lines; over SOFT_LINES only with an entry in LONG_MODULES.

The rules are data (below) so that they can follow the tree. Exceptions are listed with a
reason each; an entry that no longer matches anything fails as well, so the lists only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
LAYERS = ("meters", "packetin", "auditlog", "policy_agent")

# --- policy_agent's subpackages (dotted prefixes: "policy_agent.cli" is cli.py or cli/ and all in it) ---
FEATURE_PACKAGES = ("policy_agent.cni", "policy_agent.sources", "policy_agent.traceflow", "policy_agent.bundle",
                    "policy_agent.limits", "policy_agent.cli", "policy_agent.cluster", "policy_agent.http")
TOP_LEVEL_FEATURES = ("policy_agent.agent", "policy_agent.engine", "policy_agent.policy_packetins",
                      "policy_agent.demo", "policy_agent.status", "policy_agent.http", "policy_agent.cli")
# importer prefix -> what it must not import. policy_agent.config (the typed configuration),
# errors, rpc and metrics are shared by all.
SUBPACKAGE_RULES: dict[str, tuple[str, ...]] = {
    # The policy model and compiler and the OVS plumbing are what the features stand on.
    "policy_agent.policy": FEATURE_PACKAGES,
    "policy_agent.ovs": FEATURE_PACKAGES,
    # A feature reaches the engine through a Protocol of its own (sources/sink.py); agent.py wires them.
    "policy_agent.cni": ("policy_agent.sources", "policy_agent.traceflow") + TOP_LEVEL_FEATURES,
    "policy_agent.sources": ("policy_agent.cni", "policy_agent.traceflow") + TOP_LEVEL_FEATURES,
    "policy_agent.traceflow": ("policy_agent.cni", "policy_agent.sources") + TOP_LEVEL_FEATURES,
}
# (importing module, forbidden prefix it imports) -> why it is still there.
KNOWN_CROSS_IMPORTS: dict[tuple[str, str], str] = {
}

# --- cycles: the modules of one strongly connected set -> why it is still there ---
KNOWN_CYCLES: dict[frozenset[str], str] = {
}

# --- size (STYLE.md: a module answers one question) ---
MAX_LINES = 500
SOFT_LINES = 450
LONG_MODULES: dict[str, str] = {
    "policy_agent/policy/compiler.py": "one pure pass from cluster state to flows; layout() (~80 lines) is the "
                                       "part to move out next",
    "auditlog/verify.py": "one walk over the files: damage, look-ahead and the per-node chains share its "
                          "position; the per-node bookkeeping is already in verify_nodes.py",
    "policy_agent/engine.py": "the transaction (plan, bundle, store, roll back) in one place",
    "policy_agent/policy/incremental.py": "one change through the compiler: the moved Pods' groups, classes and "
                                          "flows share one snapshot; Kubernetes isolation is in isolation.py already",
}


# --- reading the source ---

@dataclass(frozen=True)
class Import:
    target: str  # as written, absolute: "a.b" for `import a.b`, "a.b.c" for `from a.b import c`
    line: int
    runs: bool = True  # False under `if TYPE_CHECKING:`
    relative: bool = False


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _production_sources() -> dict[str, str]:
    """module -> its source; a compiled module (a C extension, known by its .pyi stub) imports nothing of ours,
    so `from packetin._layout_fast import X` is an import of it, not of the package packetin."""
    stubs = {module_name(p): "" for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.pyi"))
             if not p.with_suffix(".py").exists()}
    return stubs | {module_name(p): p.read_text() for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def _modules() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(source: str) -> list[Import]:
    """Every import statement in `source`, wherever it is."""
    found: list[Import] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, runs) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.extend(Import(f"{base}.{alias.name}" if base else alias.name, node.lineno, runs, node.level > 0)
                         for alias in node.names)
        elif isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(ast.parse(source), True)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _ours(name: str) -> bool:
    return any(_within(name, layer) for layer in LAYERS)


def imported_packages(source: str) -> set[str]:
    """The top-level package of every absolute import in `source`."""
    return {i.target.split(".")[0] for i in imports(source) if not i.relative}


def upward_imports(layer: str, source: str) -> set[str]:
    higher = set(LAYERS[LAYERS.index(layer) + 1:])
    return imported_packages(source) & higher


def cross_imports(sources: Mapping[str, str],
                  rules: Mapping[str, tuple[str, ...]] = SUBPACKAGE_RULES) -> dict[tuple[str, str], int]:
    """(module, forbidden prefix) -> the first line where the module imports under that prefix."""
    found: dict[tuple[str, str], int] = {}
    for module, source in sources.items():
        banned = [b for owner, forbidden in rules.items() if _within(module, owner) for b in forbidden]
        if not banned:
            continue
        for imp in imports(source):
            for prefix in banned:
                if not imp.relative and _within(imp.target, prefix):
                    found.setdefault((module, prefix), imp.line)
    return found


def _resolve(target: str, modules: Iterable[str]) -> str | None:
    """The module `target` loads: itself, or for `from m import name` the module m."""
    known = set(modules)
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports by imports that run."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        targets = {_resolve(i.target, sources) for i in imports(source) if i.runs and not i.relative}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def import_cycles(sources: Mapping[str, str]) -> dict[frozenset[str], list[str]]:
    """Each set of modules that import each other in a circle -> one such circle, as a path."""
    graph = import_graph(sources)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: dict[frozenset[str], list[str]] = {}

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.add(w)
                if w == v:
                    break
            if len(members) > 1:
                cycles[frozenset(members)] = _circle(graph, v, members)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def _circle(graph: Mapping[str, set[str]], start: str, members: set[str]) -> list[str]:
    """A shortest path from `start` back to itself inside `members`."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start}")


_LOADERS = {"import_module", "__import__", "spec_from_file_location", "SourceFileLoader", "load_module"}


def unreadable_imports(source: str) -> list[str]:
    """Imports the checks above cannot follow: relative ones, and importlib-style loads of our modules."""
    found = [f"line {i.line}: relative import of {i.target or '.'}" for i in imports(source) if i.relative]
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else \
            node.func.attr if isinstance(node.func, ast.Attribute) else ""
        if name not in _LOADERS:
            continue
        first = node.args[0] if node.args else None
        literal = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
        if literal is None or _ours(literal) or name in ("spec_from_file_location", "SourceFileLoader"):
            found.append(f"line {node.lineno}: {name}({literal or '...'})")
    return found


def size_problem(relative_path: str, lines: int, long_modules: Mapping[str, str] = LONG_MODULES) -> str | None:
    if lines > MAX_LINES:
        return f"{relative_path} has {lines} lines (at most {MAX_LINES}): split it by what it does"
    if lines > SOFT_LINES and relative_path not in long_modules:
        return (f"{relative_path} has {lines} lines (over {SOFT_LINES}): split it, or give it an entry in "
                f"LONG_MODULES with the reason")
    return None


# --- the checks checked, on planted source ---

def test_the_walk_sees_every_layer_and_catches_a_lazy_upward_import() -> None:
    # An import inside a function is found, a sibling or lower layer is fine.
    lazy = "def f():\n    from policy_agent.engine import PolicyEngine\n"
    assert upward_imports("auditlog", lazy) == {"policy_agent"}
    assert upward_imports("policy_agent", lazy) == set()
    assert upward_imports("packetin", "import meters.token_bucket\nfrom packetin import wire\n") == set()
    assert {p.relative_to(ROOT).parts[0] for p in _modules()} == set(LAYERS)


def test_a_planted_cycle_is_found_through_a_lazy_import_but_not_through_a_type_only_one() -> None:
    planted = {
        "packetin.a": "import packetin.b\n",
        "packetin.b": "from packetin.c import thing\n",
        "packetin.c": "def f() -> None:\n    from packetin import a\n",
        "packetin.d": "from packetin.a import x\n",  # imports into the circle, is no part of it
    }
    assert import_cycles(planted) == {frozenset({"packetin.a", "packetin.b", "packetin.c"}):
                                      ["packetin.a", "packetin.b", "packetin.c", "packetin.a"]}
    type_only = {**planted, "packetin.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from packetin import a\n"}
    assert import_cycles(type_only) == {}


def test_a_planted_cross_import_between_policy_agent_subpackages_is_found() -> None:
    planted = {
        "policy_agent.cni.plugin": "from policy_agent.sources import x\nfrom policy_agent.policy import model\n",
        "policy_agent.cni.server": "def f():\n    from policy_agent.engine import PolicyEngine\n",
        "policy_agent.traceflow.flows": "import policy_agent.cni.wire\nfrom policy_agent.ovs import tables\n",
        "policy_agent.policy.compiler": "from policy_agent.config import AgentConfig\nfrom policy_agent.ovs import t\n",
        "policy_agent.ovs.bridge": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from policy_agent.cli.common import version\n",
        "policy_agent.agent": "from policy_agent.cni import plugin\nfrom policy_agent.sources import kubernetes\n",
    }
    assert cross_imports(planted) == {
        ("policy_agent.cni.plugin", "policy_agent.sources"): 1,
        ("policy_agent.cni.server", "policy_agent.engine"): 2,
        ("policy_agent.traceflow.flows", "policy_agent.cni"): 1,
        ("policy_agent.ovs.bridge", "policy_agent.cli"): 3,
    }
    # Prefixes are whole names: policy_agent.cni_x is not under policy_agent.cni.
    assert cross_imports({"policy_agent.sources.x": "import policy_agent.cni_x\n"}) == {}


def test_planted_relative_and_importlib_imports_are_found() -> None:
    planted = ("from . import wire\nfrom ..engine import PolicyEngine\nimport importlib\n"
               "m = importlib.import_module('policy_agent.engine')\n"
               "n = __import__('packetin.wire')\ndef f(name):\n    return importlib.import_module(name)\n"
               "y = importlib.import_module('yaml')\n")
    assert unreadable_imports(planted) == [
        "line 1: relative import of wire", "line 2: relative import of engine.PolicyEngine",
        "line 4: import_module(policy_agent.engine)", "line 5: __import__(packetin.wire)",
        "line 7: import_module(...)"]
    assert unreadable_imports("from importlib.metadata import version\nimport yaml\n") == []


def test_the_size_rule_takes_the_allow_list_below_the_hard_cap_only() -> None:
    assert size_problem("packetin/x.py", SOFT_LINES) is None
    assert "LONG_MODULES" in (size_problem("packetin/x.py", SOFT_LINES + 1, {}) or "")
    assert size_problem("packetin/x.py", SOFT_LINES + 1, {"packetin/x.py": "a reason"}) is None
    assert "at most" in (size_problem("packetin/x.py", MAX_LINES + 1, {"packetin/x.py": "a reason"}) or "")


# --- the tree ---

@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_higher_layer(path: Path) -> None:
    layer = path.relative_to(ROOT).parts[0]
    assert upward_imports(layer, path.read_text()) == set(), (
        f"{path.relative_to(ROOT)} ({layer}) imports a higher layer; order: {' < '.join(LAYERS)}")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_the_size_limit(path: Path) -> None:
    problem = size_problem(str(path.relative_to(ROOT)), len(path.read_text().splitlines()))
    assert problem is None, problem


def test_every_long_module_entry_is_still_needed() -> None:
    stale = [p for p in LONG_MODULES
             if not (ROOT / p).exists() or len((ROOT / p).read_text().splitlines()) <= SOFT_LINES]
    assert stale == [], f"no longer over {SOFT_LINES} lines (or gone): delete their LONG_MODULES entries: {stale}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_of_ours_is_an_absolute_import_statement(path: Path) -> None:
    assert unreadable_imports(path.read_text()) == []


def test_policy_agent_subpackages_keep_to_their_rules() -> None:
    found = cross_imports(_production_sources())
    new = {f"{module} imports {prefix} (line {line})" for (module, prefix), line in found.items()
           if (module, prefix) not in KNOWN_CROSS_IMPORTS}
    assert not new, f"against SUBPACKAGE_RULES: {sorted(new)}"
    stale = [key for key in KNOWN_CROSS_IMPORTS if key not in found]
    assert not stale, f"gone: delete their KNOWN_CROSS_IMPORTS entries: {stale}"


def test_no_import_cycles() -> None:
    found = import_cycles(_production_sources())
    new = [" -> ".join(path) for members, path in found.items() if members not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    stale = [sorted(members) for members in KNOWN_CYCLES if members not in found]
    assert not stale, f"broken: delete their KNOWN_CYCLES entries: {stale}"
