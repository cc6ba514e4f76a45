"""Pid files and signals (policy_agent/ovs/pids.py): a pid counts only while its process holds the pid
file's lock, and a stop reaches only the process the caller means. Real child processes and real locks."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from policy_agent.ovs import pids
from policy_agent.ovs.embedded import EmbeddedOvs
from policy_agent.ovs.pids import look_pid, read_pid, stop_pid
from tests.support.pid_files import bystander, hold_pid_file, reap
from tests.support.processes import alive


@pytest.fixture
def children() -> Iterator[list]:
    made: list = []
    yield made
    reap(*made)


def test_a_pid_file_names_the_process_that_holds_its_lock(tmp_path: Path, children: list) -> None:
    path = tmp_path / "ovs-vswitchd.pid"
    holder = hold_pid_file(path)
    children.append(holder)
    assert look_pid(path) == holder.pid == read_pid(path)


def test_a_stale_pid_file_naming_another_running_process_names_none(tmp_path: Path, children: list) -> None:
    # The daemon died without removing its file and the kernel gave its pid to someone else: that process
    # is no daemon of ours, and taking it for one would keep the daemon from being restarted.
    other = bystander()
    children.append(other)
    path = tmp_path / "ovs-vswitchd.pid"
    path.write_text(f"{other.pid}\n")
    assert look_pid(path) is None and read_pid(path) is None
    assert alive(other.pid)


def test_a_pid_file_locked_by_another_process_than_the_one_it_names_names_none(tmp_path: Path,
                                                                              children: list) -> None:
    path = tmp_path / "ovsdb-server.pid"
    holder = hold_pid_file(path)
    other = bystander()
    children += [holder, other]
    path.write_text(f"{other.pid}\n")  # the same file (inode), still locked, now naming another process
    assert look_pid(path) is None


def test_the_file_of_a_daemon_killed_outright_names_none(tmp_path: Path, children: list) -> None:
    path = tmp_path / "ovs-vswitchd.pid"
    holder = hold_pid_file(path)
    holder.kill()
    holder.wait()
    assert path.read_text().strip() == str(holder.pid)  # left behind, as a crashed daemon leaves it
    assert look_pid(path) is None


def test_stopping_a_daemon_by_a_stale_pid_file_signals_nobody(tmp_path: Path, children: list) -> None:
    other = bystander()
    children.append(other)
    (tmp_path / "ovs-vswitchd.pid").write_text(f"{other.pid}\n")
    ovs = EmbeddedOvs(tmp_path)
    assert ovs.pid("ovs-vswitchd") is None
    assert ovs.stop_daemon("ovs-vswitchd", timeout=1.0) is False
    assert alive(other.pid), "a process that only has the stale pid was signalled"


def test_stopping_a_daemon_that_holds_its_pid_file_ends_it(tmp_path: Path, children: list) -> None:
    holder = hold_pid_file(tmp_path / "ovs-vswitchd.pid")
    children.append(holder)
    assert EmbeddedOvs(tmp_path).stop_daemon("ovs-vswitchd", timeout=10.0) is True
    assert holder.wait(10) == -signal.SIGTERM
    assert not (tmp_path / "ovs-vswitchd.pid").exists()


def test_stop_sends_nothing_when_the_pid_is_no_longer_the_callers(children: list) -> None:
    other = bystander()
    children.append(other)
    assert stop_pid(other.pid, lambda: False, timeout=1.0) is False
    assert alive(other.pid)


def test_stop_asks_whether_the_pid_is_still_the_callers_only_once_it_is_pinned(children: list) -> None:
    other = bystander()
    children.append(other)
    pinned: list[bool] = []

    def still_ours() -> bool:  # a pidfd of this process for `other` is open while the question is asked
        infos = []
        for fd in os.listdir("/proc/self/fdinfo"):
            try:
                infos.append(Path(f"/proc/self/fdinfo/{fd}").read_text())
            except OSError:  # the listing's own descriptor, closed by now
                pass
        pinned.append(any(f"Pid:\t{other.pid}\n" in info for info in infos))
        return True

    assert stop_pid(other.pid, still_ours, timeout=10.0) is True
    assert pinned == [True]
    assert other.wait(10) == -signal.SIGTERM


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path: Path, children: list) -> None:
    holder = hold_pid_file(tmp_path / "stubborn.pid", ignore_term=True)
    children.append(holder)
    assert stop_pid(holder.pid, lambda: True, timeout=0.5) is True
    assert holder.wait(10) == -signal.SIGKILL


def test_stop_of_a_pid_already_gone_sends_nothing(children: list) -> None:
    other = bystander()
    other.kill()
    other.wait()
    asked: list[int] = []

    def still_ours() -> bool:
        asked.append(1)
        return True

    # Reaped, its pid is free (pids are handed out in increasing order: not again for pid_max forks).
    assert stop_pid(other.pid, still_ours, timeout=1.0) is False
    assert asked == []


def test_without_pidfds_it_says_so_once_and_still_stops_only_the_callers_process(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, children: list) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    monkeypatch.setattr(pids, "_said_no_pidfd", False)
    first, second, spared = bystander(), bystander(), bystander()
    children += [first, second, spared]
    with caplog.at_level(logging.WARNING, logger="policy_agent.ovs.pids"):
        assert stop_pid(first.pid, lambda: True, timeout=10.0) is True
        assert stop_pid(second.pid, lambda: True, timeout=10.0) is True
        assert stop_pid(spared.pid, lambda: False, timeout=1.0) is False
    assert first.wait(10) == -signal.SIGTERM and second.wait(10) == -signal.SIGTERM
    assert alive(spared.pid)
    warnings = [r for r in caplog.records if "no pidfd here" in r.getMessage()]
    assert len(warnings) == 1
