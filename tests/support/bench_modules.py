"""A bench script (bench/NAME.py) as a module, for the unit tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_bench(name: str) -> ModuleType:
    """bench/`name`.py as a module; sys.path as it was after (a bench puts bench/ in front)."""
    before = list(sys.path)
    try:
        module_name = f"bench_{name.strip('_')}"
        spec = importlib.util.spec_from_file_location(module_name, ROOT / "bench" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = before
