"""A non-editable install carries what the agent reads at run time besides Python modules, and the record
encoder's C part built from its source."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_wheel_ships_the_xdp_program_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("packetin", "auditlog", "meters", "policy_agent"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                    "-w", str(tmp_path / "out")], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "out").glob("npaudit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "meters/ebpf/xdp_offload.c" in names and "policy_agent/limits/offload_cache.py" in names
    assert any(n.startswith("auditlog/_record_fast.") and n.endswith(".so") for n in names), names
