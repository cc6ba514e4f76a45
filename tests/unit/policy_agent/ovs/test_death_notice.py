"""Death notices (policy_agent/ovs/death_notice.py) and the supervisor that waits on them instead of
polling: real child processes, a real event loop, the poll interval set far beyond the test."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Iterator, Sequence

import pytest

from policy_agent.ovs.death_notice import DeathNotices
from policy_agent.ovs.supervisor import OVSDB_SERVER, VSWITCHD, OvsSupervisor


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for proc in made:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def sleeper(made: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "600"])
    made.append(proc)
    return proc


def test_a_watched_process_that_ends_sets_the_notice_and_is_let_go(sleepers: list) -> None:
    a, b = sleeper(sleepers), sleeper(sleepers)

    async def run() -> tuple[bool, bool, bool]:
        notices = DeathNotices()
        assert notices.watch([a.pid, b.pid])
        await asyncio.sleep(0.05)
        quiet = not notices.ended.is_set()
        a.kill()
        await asyncio.wait_for(notices.ended.wait(), 5.0)
        notices.ended.clear()
        await asyncio.sleep(0.05)  # the ended pidfd is closed: it does not wake the loop again
        again = notices.ended.is_set()
        rewatched = notices.watch([b.pid])
        notices.close()
        return quiet, again, rewatched

    quiet, again, rewatched = asyncio.run(run())
    assert quiet and not again and rewatched


def test_a_pid_without_a_pidfd_is_not_covered_so_the_caller_polls() -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    async def run() -> bool:
        notices = DeathNotices(no_pidfd)
        covered = notices.watch([1])
        notices.close()
        return covered

    assert asyncio.run(run()) is False


class ChildDaemons:
    """The two daemons as child processes; a restart starts new ones."""

    def __init__(self, made: list[subprocess.Popen[bytes]]) -> None:
        self.made = made
        self.procs = {OVSDB_SERVER: sleeper(made), VSWITCHD: sleeper(made)}
        self.restarts: list[tuple[str, ...]] = []
        self.restarted = asyncio.Event()

    def pid(self, daemon: str) -> int | None:
        proc = self.procs[daemon]
        return proc.pid if proc.poll() is None else None

    look = pid

    def restart(self, daemons: Sequence[str]) -> None:
        self.restarts.append(tuple(daemons))
        for daemon in daemons:
            self.procs[daemon] = sleeper(self.made)


def test_a_daemon_death_is_restarted_at_once_without_waiting_for_the_poll_interval(sleepers: list) -> None:
    async def run() -> list[tuple[str, ...]]:
        daemons = ChildDaemons(sleepers)
        restarted = asyncio.Event()

        async def after_restart() -> None:
            restarted.set()

        sup = OvsSupervisor(daemons, 3600.0, restarting=True, after_restart=after_restart, jitter=lambda: 1.0)
        sup.start()
        await asyncio.sleep(0.2)  # the first look, then waiting on the notices
        daemons.procs[VSWITCHD].kill()
        await asyncio.wait_for(restarted.wait(), 5.0)
        await sup.close()
        return daemons.restarts

    assert asyncio.run(run()) == [(VSWITCHD,)]


def test_without_death_notices_a_death_is_seen_by_polling_every_interval(sleepers: list) -> None:
    async def run() -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
        daemons = ChildDaemons(sleepers)
        restarted = asyncio.Event()

        async def after_restart() -> None:
            restarted.set()

        def no_pidfd(pid: int) -> int:
            raise OSError(1, "Operation not permitted")

        sup = OvsSupervisor(daemons, 0.2, restarting=True, after_restart=after_restart, jitter=lambda: 1.0,
                            notices=lambda: DeathNotices(no_pidfd))
        sup.start()
        await asyncio.sleep(0.1)
        daemons.procs[VSWITCHD].kill()
        daemons.procs[VSWITCHD].wait()
        before = list(daemons.restarts)
        await asyncio.wait_for(restarted.wait(), 5.0)
        await sup.close()
        return before, daemons.restarts

    before, after = asyncio.run(run())
    assert before == [] and after == [(VSWITCHD,)]
