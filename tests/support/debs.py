"""Debian packages unpacked beside the tree, never installed: `apt-get download` into a cache directory, then
`dpkg-deb -x` of each into a private root. For tools whose package would conflict with what the machine runs
(syslog-ng against rsyslog) or start a system service on install (prometheus, OVN's daemons); their users say
which packages and which file must be there."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence


def unpacked(cache: Path, packages: Sequence[str], wanted: str) -> Path:
    """The private root under `cache` holding `wanted` (a path inside it): downloaded and unpacked once, then
    reused. A root without its stamp (an unpack cut short) is unpacked again."""
    root, stamp = cache / "root", cache / "root.ok"
    if stamp.exists() and (root / wanted).exists():
        return root
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not list(debs.glob(f"{p}_*.deb"))]
    if missing:
        # apt drops privileges to _apt for downloads; a directory it can write avoids its warning.
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    for deb in sorted(d for p in packages for d in debs.glob(f"{p}_*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    if not (root / wanted).exists():
        raise RuntimeError(f"{', '.join(packages)} hold no {wanted} (looked in {root})")
    stamp.write_text("".join(f"{d.name}\n" for d in sorted(debs.glob("*.deb"))))
    return root
