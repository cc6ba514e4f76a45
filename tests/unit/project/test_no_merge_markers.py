"""No tracked text file carries a merge's conflict markers (a README once shipped with them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MARKER = re.compile(rb"^(<{7} |>{7} |={7}$)", re.MULTILINE)


def test_no_tracked_file_has_conflict_markers() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    hits = []
    for name in filter(None, files):
        path = ROOT / name.decode()
        if not path.is_file() or path.name == Path(__file__).name:
            continue
        data = path.read_bytes()
        if b"\0" not in data[:8192] and MARKER.search(data):
            hits.append(name.decode())
    assert hits == []
