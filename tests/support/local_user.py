"""A throw-away unprivileged local user for tests of what root does on a user's say-so."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# What the user runs: this interpreter's environment (the venv) and the checkout it imports the
# project from. A clean clone in `mktemp -d` sits under a 0700 directory the user cannot pass through.
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int


def _closed_ancestors(paths: list[Path]) -> list[Path]:
    """Directories on the way to `paths` that others cannot pass through, outermost first."""
    closed: list[Path] = []
    for path in paths:
        for directory in reversed(path.resolve().parents):
            if not os.stat(directory).st_mode & stat.S_IXOTH and directory not in closed:
                closed.append(directory)
    return closed


@contextlib.contextmanager
def _traversal_for(uid: int, paths: list[Path]) -> Iterator[None]:
    """Lets `uid` (and only it) pass through the closed directories on the way to `paths` while the
    block runs: an ACL entry `u:<uid>:--x` per directory, removed afterwards. Fails loudly where the
    file system takes no ACLs, rather than opening the directories to everyone."""
    granted: list[Path] = []
    try:
        for directory in _closed_ancestors(paths):
            done = subprocess.run(["setfacl", "-m", f"u:{uid}:x", str(directory)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"cannot let the test user pass through {directory} (no ACLs here?): "
                                   f"{done.stderr.strip()}; run the suite from a directory others can enter")
            granted.append(directory)
        yield
    finally:
        for directory in reversed(granted):
            subprocess.run(["setfacl", "-x", f"u:{uid}", str(directory)], check=False, capture_output=True)


@contextlib.contextmanager
def local_user() -> Iterator[LocalUser]:
    """A new system user (no home, no shell) that exists only inside the block; removed even on failure.
    It can run this checkout's interpreter and import the project, wherever the checkout lies."""
    name = f"npt-{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group",
                    name], check=True, capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        with _traversal_for(entry.pw_uid, [Path(sys.prefix), REPO]):
            yield LocalUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def run_as(user: LocalUser, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`argv` run as `user` (its own uid, gid and no supplementary groups)."""
    return subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=[], text=True,  # type: ignore[call-overload]
                          capture_output=True, check=True, env={"PATH": os.defpath}, **kwargs)
