"""A throw-away unprivileged local user for tests of what root does on a user's say-so."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int


@contextlib.contextmanager
def local_user() -> Iterator[LocalUser]:
    """A new system user (no home, no shell) that exists only inside the block; removed even on failure."""
    name = f"npt-{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group",
                    name], check=True, capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        yield LocalUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def run_as(user: LocalUser, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`argv` run as `user` (its own uid, gid and no supplementary groups)."""
    return subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=[], text=True,  # type: ignore[call-overload]
                          capture_output=True, check=True, env={"PATH": os.defpath}, **kwargs)
