"""`npaudit bundle -o` in a directory a local user can write: nothing the user planted receives the bundle.

Run as root (the bundle is a root command) against names an unprivileged user made by the test put in
the output directory: a symlink or a held-open file at the old fixed `<output>.partial` name, or a
symlink at the output name itself.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.local_user import LocalUser, local_user, run_as

pytestmark = pytest.mark.integration
PRECIOUS = b"root's file: not to be truncated or overwritten\n"


@pytest.fixture
def user() -> Iterator[LocalUser]:
    with local_user() as made:
        yield made


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the user can reach (pytest's own are root's 0700 tree)."""
    made = Path(tempfile.mkdtemp(prefix="npaudit-bundle-"))
    made.chmod(0o755)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def setup(tmp_path: Path, user: LocalUser) -> tuple[Path, Path, Path]:
    """(the user's directory for -o, a root-owned file outside it, the agent config)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, user.uid, user.gid)
    victim_dir = tmp_path / "root-only"
    victim_dir.mkdir(mode=0o755)
    victim = victim_dir / "precious"
    victim.write_bytes(PRECIOUS)
    victim.chmod(0o644)
    config = tmp_path / "npaudit.yaml"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "metrics": {"listen": ""},
                                  "audit": {"path": str(tmp_path / "logs" / "audit.jsonl")},
                                  "ovs": {"run_dir": str(tmp_path / "ovs")}}))
    return shared, victim, config


def _bundle(config: Path, output: Path) -> subprocess.CompletedProcess[str]:
    npaudit = str(Path(sys.executable).with_name("npaudit"))
    return subprocess.run([npaudit, "bundle", "--config", str(config), "-o", str(output)],
                          capture_output=True, text=True, timeout=120, check=False)


def _is_roots_private_bundle(path: Path) -> None:
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode), f"{path} is not a regular file"
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600), (st.st_uid, oct(st.st_mode))
    with tarfile.open(path) as tar:
        assert any(m.name.endswith("manifest.json") for m in tar.getmembers())


def test_a_symlink_planted_at_the_partial_name_leaves_its_target_untouched(
        setup: tuple[Path, Path, Path], user: LocalUser) -> None:
    shared, victim, config = setup
    run_as(user, ["ln", "-s", str(victim), str(shared / "b.tar.gz.partial")])
    done = _bundle(config, shared / "b.tar.gz")
    assert done.returncode == 0, done.stderr
    assert victim.read_bytes() == PRECIOUS
    _is_roots_private_bundle(shared / "b.tar.gz")
    assert [p.name for p in shared.iterdir() if not p.is_symlink()] == ["b.tar.gz"]  # no temporary left


def test_a_file_the_user_created_and_holds_open_receives_nothing(
        setup: tuple[Path, Path, Path], user: LocalUser) -> None:
    shared, _, config = setup
    partial = shared / "b.tar.gz.partial"
    # The user makes the file world-writable and keeps it open, to read what root writes into it.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import os,sys\n"
         f"fd = os.open({str(partial)!r}, os.O_RDWR | os.O_CREAT, 0o666); os.fchmod(fd, 0o666)\n"
         "print('open', flush=True); sys.stdin.readline()\n"
         "os.lseek(fd, 0, 0); print(len(os.read(fd, 1 << 20)), flush=True)\n"],
        user=user.uid, group=user.gid, extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "open"
        done = _bundle(config, shared / "b.tar.gz")
        assert done.returncode == 0, done.stderr
        holder.stdin.write("read\n")
        holder.stdin.flush()
        assert int(holder.stdout.readline()) == 0, "the user's file received bytes of the bundle"
    finally:
        holder.kill()
        holder.wait()
    _is_roots_private_bundle(shared / "b.tar.gz")


def test_a_symlink_at_the_output_name_is_replaced_not_followed(
        setup: tuple[Path, Path, Path], user: LocalUser) -> None:
    shared, victim, config = setup
    run_as(user, ["ln", "-s", str(victim), str(shared / "b.tar.gz")])
    done = _bundle(config, shared / "b.tar.gz")
    assert done.returncode == 0, done.stderr
    assert victim.read_bytes() == PRECIOUS
    _is_roots_private_bundle(shared / "b.tar.gz")
