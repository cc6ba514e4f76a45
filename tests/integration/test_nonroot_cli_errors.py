"""Root-only verbs run by an unprivileged user end in one line naming the cause, never a traceback
(issue 24, finding 6): `npaudit ovs down` on root's daemons, and `npaudit bundle` that cannot read what
it collects (a read failure, not "cannot write")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.local_user import LocalUser, local_user, run_as
from tests.support.pid_files import hold_pid_file, reap

pytestmark = pytest.mark.integration


@pytest.fixture
def user() -> Iterator[LocalUser]:
    with local_user() as made:
        yield made


@pytest.fixture
def root_dir() -> Iterator[Path]:
    """Root's node directories as an agent leaves them (state 0750), in a tree the user can reach."""
    made = Path(tempfile.mkdtemp(prefix="npaudit-nonroot-"))
    made.chmod(0o755)
    for sub in ("state/cni/containers", "logs", "ovs"):
        (made / sub).mkdir(parents=True)
    (made / "state").chmod(0o750)
    (made / "ovs").chmod(0o755)
    (made / "npaudit.yaml").write_text(json.dumps({
        "state_dir": str(made / "state"), "metrics": {"listen": ""}, "ovs": {"run_dir": str(made / "ovs")},
        "audit": {"path": str(made / "logs" / "audit.jsonl")}}))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _as_user(user: LocalUser, cwd: Path, *args: str) -> tuple[int, str]:
    try:
        res = run_as(user, [sys.executable, "-m", "policy_agent.cli.main", *args], cwd=str(cwd), timeout=120)
    except subprocess.CalledProcessError as exc:
        return exc.returncode, exc.stderr
    return res.returncode, res.stderr


def test_ovs_down_by_a_user_on_roots_daemon_is_one_line(user: LocalUser, root_dir: Path) -> None:
    # root's process, holding the run dir's pid file as a running vswitchd holds it
    daemon = hold_pid_file(root_dir / "ovs" / "ovs-vswitchd.pid")
    try:
        code, err = _as_user(user, root_dir, "ovs", "down", "--config", str(root_dir / "npaudit.yaml"),
                             "--netns", "")
        assert daemon.poll() is None  # untouched
    finally:
        reap(daemon)
    assert code == 1, err
    assert "Traceback" not in err, err
    assert err == "error: ovs down: Operation not permitted (npaudit ovs needs root)\n", err


def test_bundle_by_a_user_says_what_it_cannot_read(user: LocalUser, root_dir: Path) -> None:
    out = root_dir / "out"
    out.mkdir()
    shutil.chown(out, user.uid, user.gid)
    code, err = _as_user(user, out, "bundle", "--config", str(root_dir / "npaudit.yaml"), "-o", str(out / "b.tar.gz"))
    assert code == 1, err
    assert "Traceback" not in err and "cannot write" not in err, err
    assert err.splitlines()[-1] == f"npaudit bundle: cannot read {root_dir / 'state' / 'cni' / 'containers'}: " \
                                   "Permission denied", err
    assert not (out / "b.tar.gz").exists()
