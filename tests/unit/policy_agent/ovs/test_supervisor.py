"""The OVS supervisor: restart order, backoff and cap decided on a fake clock; the adapter over fake daemons."""

from __future__ import annotations

import asyncio
import os
import resource
from typing import Sequence

import pytest

from prometheus_client import CollectorRegistry, generate_latest

from policy_agent.errors import OvsError
from policy_agent.ovs.pids import PidUnknown
from tests.support.pid_files import hold_pid_file, reap
from policy_agent.metrics import OvsSupervisorCollector
from policy_agent.ovs.supervisor import (
    OVSDB_SERVER, VSWITCHD, Decision, OvsSupervisor, RestartGovernor, RestartPolicy, daemons_to_restart,
)
from tests.support.clock import ManualClock

BOTH_UP = {OVSDB_SERVER: True, VSWITCHD: True}
VSWITCHD_DEAD = {OVSDB_SERVER: True, VSWITCHD: False}
DB_DEAD = {OVSDB_SERVER: False, VSWITCHD: True}
POLICY = RestartPolicy(backoff_min=1.0, backoff_max=8.0, window=100.0, max_restarts=4)


def governor(jitter: float = 1.0) -> RestartGovernor:
    return RestartGovernor(POLICY, lambda: jitter)


def test_a_dead_vswitchd_alone_is_restarted_alone() -> None:
    assert daemons_to_restart(VSWITCHD_DEAD) == (VSWITCHD,)
    assert daemons_to_restart(BOTH_UP) == ()


def test_a_dead_ovsdb_server_restarts_both_database_first_even_with_vswitchd_running() -> None:
    assert daemons_to_restart(DB_DEAD) == (OVSDB_SERVER, VSWITCHD)
    assert daemons_to_restart({OVSDB_SERVER: False, VSWITCHD: False}) == (OVSDB_SERVER, VSWITCHD)


def test_the_first_death_is_restarted_at_once_and_nothing_happens_while_both_run() -> None:
    g = governor()
    assert g.decide(BOTH_UP, 0.0) == Decision()
    assert g.decide(VSWITCHD_DEAD, 10.0) == Decision(restart=(VSWITCHD,))


def test_deaths_in_quick_succession_wait_a_doubling_backoff_after_the_previous_restart() -> None:
    g = governor()
    assert g.decide(VSWITCHD_DEAD, 0.0).restart == (VSWITCHD,)
    # Died again at once: 1 s after the previous restart, then 2 s, then 4 s.
    for previous, delay in ((0.0, 1.0), (1.0, 2.0), (3.0, 4.0)):
        assert g.decide(VSWITCHD_DEAD, previous + delay - 0.01).restart == ()
        assert g.decide(VSWITCHD_DEAD, previous + delay).restart == (VSWITCHD,)


def test_the_backoff_is_jittered_and_the_jitter_is_drawn_once_per_pending_restart() -> None:
    draws = iter([0.5, 1.0])
    g = RestartGovernor(POLICY, lambda: next(draws))
    g.decide(VSWITCHD_DEAD, 0.0)
    # 1 s backoff * 0.5: due at 0.5 s; looking again must not re-draw (the second draw would say 1 s).
    assert g.decide(VSWITCHD_DEAD, 0.2).restart == ()
    assert g.decide(VSWITCHD_DEAD, 0.5).restart == (VSWITCHD,)


def test_the_backoff_stops_growing_at_backoff_max() -> None:
    g = RestartGovernor(RestartPolicy(backoff_min=1.0, backoff_max=3.0, window=1000.0, max_restarts=10),
                        lambda: 1.0)
    now = 0.0
    times = []
    for _ in range(5):
        while not g.decide(VSWITCHD_DEAD, now).restart:
            now += 0.5
        times.append(now)
    assert [b - a for a, b in zip(times, times[1:])] == [1.0, 2.0, 3.0, 3.0]


def test_past_the_cap_restarts_are_held_back_until_the_oldest_leaves_the_window() -> None:
    g = governor()
    done = []
    now = 0.0
    while now < 50.0:
        decision = g.decide(DB_DEAD, now)
        if decision.restart:
            done.append(now)
        if decision.capped:
            break
        now += 0.5
    assert len(done) == POLICY.max_restarts and decision.capped
    assert g.decide(DB_DEAD, 99.5) == Decision(capped=True)
    # The first restart (at 0 s) leaves the 100 s window at 100 s: one more then, and the cap
    # holds again until the next ones (1, 3, 7 s) have left it too.
    assert done == [0.0, 1.0, 3.0, 7.0]
    assert g.decide(DB_DEAD, 100.0).restart == (OVSDB_SERVER, VSWITCHD)
    assert g.decide(DB_DEAD, 100.5) == Decision(capped=True)
    assert g.decide(DB_DEAD, 120.0).restart == (OVSDB_SERVER, VSWITCHD)


def test_daemons_that_recover_by_themselves_cancel_the_pending_restart() -> None:
    g = governor()
    g.decide(VSWITCHD_DEAD, 0.0)
    assert g.decide(VSWITCHD_DEAD, 0.5).restart == ()  # backing off
    assert g.decide(BOTH_UP, 0.6) == Decision()
    # A later death is backed off from the last restart, not from the cancelled plan.
    assert g.decide(VSWITCHD_DEAD, 5.0).restart == (VSWITCHD,)


class FakeDaemons:
    """Pid files and restarts in memory; `fail` makes the next restarts raise."""

    def __init__(self) -> None:
        self.pids: dict[str, int | None] = {OVSDB_SERVER: 10, VSWITCHD: 11}
        self.restarts: list[tuple[str, ...]] = []
        self.fail = False
        self.unreadable: set[str] = set()  # look() cannot read these pid files (EMFILE ...)

    def pid(self, daemon: str) -> int | None:
        return None if daemon in self.unreadable else self.pids[daemon]  # as read_pid: an unreadable file is None

    def look(self, daemon: str) -> int | None:
        if daemon in self.unreadable:
            raise PidUnknown(f"/run/{daemon}.pid: Too many open files")
        return self.pids[daemon]

    def restart(self, daemons: Sequence[str]) -> None:
        self.restarts.append(tuple(daemons))
        if self.fail:
            raise OvsError("ovs-vswitchd did not come up within 15s")
        for daemon in daemons:
            self.pids[daemon] = 100 + len(self.restarts)


def supervisor(daemons: FakeDaemons, clock: ManualClock, restarting: bool = True) -> tuple[OvsSupervisor, list[str]]:
    ensured: list[str] = []

    async def after_restart() -> None:
        ensured.append("bridge")

    sup = OvsSupervisor(daemons, 1.0, restarting=restarting, after_restart=after_restart, policy=POLICY,
                        clock=clock, jitter=lambda: 1.0)
    return sup, ensured


def exposition(sup: OvsSupervisor) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OvsSupervisorCollector(sup))
    return generate_latest(registry).decode()


def test_an_ovsdb_server_death_restarts_both_re_ensures_the_bridge_and_is_exported() -> None:
    daemons, clock = FakeDaemons(), ManualClock()
    sup, ensured = supervisor(daemons, clock)
    asyncio.run(sup.check())
    assert daemons.restarts == [] and 'npaudit_ovs_up{daemon="ovsdb-server"} 1.0' in exposition(sup)
    daemons.pids[OVSDB_SERVER] = None
    asyncio.run(sup.check())
    assert daemons.restarts == [(OVSDB_SERVER, VSWITCHD)] and ensured == ["bridge"]
    text = exposition(sup)
    assert 'npaudit_ovs_restarts_total{daemon="ovsdb-server"} 1.0' in text
    assert 'npaudit_ovs_restarts_total{daemon="ovs-vswitchd"} 1.0' in text
    assert 'npaudit_ovs_up{daemon="ovsdb-server"} 1.0' in text
    assert "npaudit_ovs_restarts_capped 0.0" in text


def test_a_failed_restart_is_logged_counted_and_tried_again_after_backoff(caplog) -> None:
    daemons, clock = FakeDaemons(), ManualClock()
    sup, ensured = supervisor(daemons, clock)
    daemons.pids[VSWITCHD] = None
    daemons.fail = True
    asyncio.run(sup.check())
    assert "restart of ovs-vswitchd failed: ovs-vswitchd did not come up" in caplog.text
    assert ensured == [] and 'npaudit_ovs_up{daemon="ovs-vswitchd"} 0.0' in exposition(sup)
    daemons.fail = False
    clock.now = 0.5
    asyncio.run(sup.check())
    assert len(daemons.restarts) == 1  # backing off
    clock.now = 1.0
    asyncio.run(sup.check())
    assert daemons.restarts == [(VSWITCHD,), (VSWITCHD,)] and ensured == ["bridge"]
    assert 'npaudit_ovs_restarts_total{daemon="ovs-vswitchd"} 2.0' in exposition(sup)


def test_a_crash_loop_hits_the_cap_which_is_logged_once_and_exported(caplog) -> None:
    daemons, clock = FakeDaemons(), ManualClock()
    sup, _ = supervisor(daemons, clock)
    daemons.fail = True
    daemons.pids[VSWITCHD] = None
    for step in range(40):
        clock.now = step * 0.5
        asyncio.run(sup.check())
    assert len(daemons.restarts) == POLICY.max_restarts
    assert caplog.text.count("NOT restarting ovs-vswitchd") == 1
    assert "npaudit_ovs_restarts_capped 1.0" in exposition(sup)


def test_an_external_ovs_is_reported_but_never_restarted(caplog) -> None:
    daemons, clock = FakeDaemons(), ManualClock()
    sup, ensured = supervisor(daemons, clock, restarting=False)
    asyncio.run(sup.check())
    daemons.pids[VSWITCHD] = None
    asyncio.run(sup.check())
    asyncio.run(sup.check())
    assert daemons.restarts == [] and ensured == []
    assert caplog.text.count("external ovs-vswitchd is not running") == 1
    assert 'npaudit_ovs_up{daemon="ovs-vswitchd"} 0.0' in exposition(sup)
    daemons.pids[VSWITCHD] = 12
    asyncio.run(sup.check())
    assert "ovs-vswitchd is running again" in caplog.text
    assert 'npaudit_ovs_up{daemon="ovs-vswitchd"} 1.0' in exposition(sup)


def test_an_external_daemon_without_a_pid_file_at_the_first_look_is_not_reported_as_down(caplog) -> None:
    daemons, clock = FakeDaemons(), ManualClock()
    daemons.pids[OVSDB_SERVER] = None  # e.g. its pid file lives in another directory
    sup, _ = supervisor(daemons, clock, restarting=False)
    asyncio.run(sup.check())
    assert "external ovsdb-server not found by its pid file: not watched" in caplog.text
    text = exposition(sup)
    assert 'daemon="ovsdb-server"' not in text and 'npaudit_ovs_up{daemon="ovs-vswitchd"} 1.0' in text
    assert "is not running" not in caplog.text


def test_a_pid_file_that_cannot_be_read_is_counted_and_logged_never_taken_for_a_death(caplog) -> None:
    daemons, clock = FakeDaemons(), ManualClock()
    sup, ensured = supervisor(daemons, clock)
    asyncio.run(sup.check())
    # Out of descriptors: neither pid file can be opened, while both daemons run (and even if one had died).
    daemons.unreadable = {OVSDB_SERVER, VSWITCHD}
    for step in range(1, 40):
        clock.now = step * 0.5
        asyncio.run(sup.check())
    assert daemons.restarts == [] and ensured == []
    assert "is not running" not in caplog.text
    assert caplog.text.count("could not check ovsdb-server") == 1  # once per 30 s, not once per look
    text = exposition(sup)
    assert 'npaudit_ovs_checks_failed_total{daemon="ovsdb-server"} 39.0' in text
    assert 'npaudit_ovs_up{daemon="ovs-vswitchd"} 1.0' in text and "npaudit_ovs_restarts_capped 0.0" in text


def test_one_unreadable_pid_file_holds_back_a_restart_until_the_look_is_whole(caplog) -> None:
    daemons, clock = FakeDaemons(), ManualClock()
    sup, ensured = supervisor(daemons, clock)
    daemons.pids[VSWITCHD] = None
    daemons.unreadable = {OVSDB_SERVER}  # vswitchd looks dead, but the database's state is unknown
    asyncio.run(sup.check())
    assert daemons.restarts == []
    daemons.unreadable = set()
    clock.now = 1.0
    asyncio.run(sup.check())
    assert daemons.restarts == [(VSWITCHD,)] and ensured == ["bridge"]


def test_pid_files_and_proc_tell_a_dead_daemon_from_one_that_could_not_be_checked(tmp_path) -> None:
    from policy_agent.ovs.embedded import OvsPidFiles

    files = OvsPidFiles(tmp_path)
    assert files.look(VSWITCHD) is None  # no pid file: dead
    holder = hold_pid_file(tmp_path / f"{VSWITCHD}.pid")  # as a running vswitchd holds its file
    try:
        assert files.look(VSWITCHD) == holder.pid
        # No descriptor left: the soft limit at the lowest free descriptor number, so the next open fails (EMFILE).
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.dup(0)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            with pytest.raises(PidUnknown, match="Too many open files"):
                files.look(VSWITCHD)
            assert files.pid(VSWITCHD) is None  # the two-state reader other callers use is unchanged
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert files.look(VSWITCHD) == holder.pid
    finally:
        reap(holder)
    assert files.look(VSWITCHD) is None  # its file left behind, unlocked: dead
    (tmp_path / f"{VSWITCHD}.pid").write_text("999999999\n")
    assert files.look(VSWITCHD) is None  # no such process: dead
