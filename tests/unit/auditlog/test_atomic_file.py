"""auditlog.atomic_file: whole or nothing, private from the first byte, never into a planted name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from auditlog.atomic_file import commit, stage, write_atomically
from auditlog.syslog.checkpoint import Position, save_checkpoint


def test_the_file_is_replaced_whole_and_no_temporary_is_left(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def fail(f: object) -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_atomically(target, fail)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_the_temporary_is_private_while_written_and_the_mode_is_applied(tmp_path: Path) -> None:
    modes: list[int] = []
    write_atomically(tmp_path / "a", lambda f: modes.append(stat.S_IMODE(os.fstat(f.fileno()).st_mode)))
    assert modes == [0o600]
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600
    write_atomically(tmp_path / "b", b"x", mode=0o640)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o640


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "out").symlink_to(victim)
    write_atomically(tmp_path / "out", b"bundle")
    assert victim.read_bytes() == b"keep"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_bytes() == b"bundle"


def test_a_staged_file_is_not_in_force_until_committed(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    staged = stage(target, lambda f: f.write(b"{}"), prefix=".c1.")
    assert staged.name.startswith(".c1.") and staged.name.endswith(".tmp") and not target.exists()
    commit(staged, target)
    assert target.read_bytes() == b"{}" and not staged.exists()


def test_a_syslog_checkpoint_is_readable_only_by_its_owner(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "cp" / "dest.json", Position(1, 2, 3, 4))
    assert stat.S_IMODE((tmp_path / "cp" / "dest.json").stat().st_mode) == 0o600
