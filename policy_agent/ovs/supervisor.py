"""Keeps the embedded OVS running: a pure restart decision, and the task that acts on it.

vswitchd's state (flows, meters, the userspace datapath) dies with it, but the
bridge, controller and Pod ports live in the OVSDB file: a new vswitchd reads
them back, and the OpenFlow channel reconnects and replays meters, groups and
flows (one atomic bundle). Until then the switch forwards nothing (fail closed). OVS 3.1's vswitchd
spins and stops forwarding once its ovsdb-server is gone, so an ovsdb-server
death restarts both. With an external OVS the same watch only reports.

The daemons are looked at after each death notice (a pidfd per daemon: ovs/death_notice.py),
so a death is seen at once and an idle agent does not poll; the pid files are looked at every
`interval` only while a daemon is not covered by a notice (dead and waiting for its restart's
backoff, or no pidfd here), and every SAFETY_LOOK seconds otherwise.

A look that could not be made (a pid file or /proc unreadable: EMFILE, ENFILE,
EACCES ...) is not a death: it is counted and logged at a limited rate, and
nothing is concluded or restarted from it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Protocol, Sequence

from packetin.ratelimited_log import RateLimitedLog
from packetin.tasks import cancel_and_wait, within
from policy_agent.errors import AgentError
from policy_agent.ovs.death_notice import DeathNotices
from policy_agent.ovs.pids import PidUnknown

log = logging.getLogger(__name__)

OVSDB_SERVER = "ovsdb-server"
VSWITCHD = "ovs-vswitchd"
DAEMONS = (OVSDB_SERVER, VSWITCHD)
# Seconds between looks at the pid files while every watched daemon's death is notified: only a safety
# net (a notice cannot be missed while its pidfd is open), long enough that an idle agent does not poll.
SAFETY_LOOK = 60.0


@dataclass(frozen=True)
class RestartPolicy:
    """How often the supervisor may restart OVS."""

    # The first restart inside `window` is immediate; each further one waits
    # backoff_min * 2**(n-1) seconds after the previous (jittered to 50-100%), at most backoff_max.
    backoff_min: float = 0.5
    backoff_max: float = 30.0
    # More than max_restarts in `window` seconds: OVS is crash-looping; restarts are held
    # back (logged at error level, npaudit_ovs_restarts_capped=1) until the oldest leaves the window.
    window: float = 300.0
    max_restarts: int = 5


@dataclass(frozen=True)
class Decision:
    """What to do after one look at the daemons."""

    restart: tuple[str, ...] = ()  # daemons to restart now, in this order
    capped: bool = False  # a restart is due but the per-window cap holds it back


def daemons_to_restart(alive: Mapping[str, bool]) -> tuple[str, ...]:
    """Which daemons a restart must cover, database first; () when both run."""
    if not alive[OVSDB_SERVER]:
        return (OVSDB_SERVER, VSWITCHD)  # a vswitchd that lost its database spins: it goes too
    if not alive[VSWITCHD]:
        return (VSWITCHD,)
    return ()


class RestartGovernor:
    """Decides, from which daemons are alive and the time, what to restart: backoff and cap.

    Pure apart from its own memory of recent restarts; the clock and the jitter are passed in.
    """

    def __init__(self, policy: RestartPolicy, jitter: Callable[[], float]) -> None:
        self.policy = policy
        self._jitter = jitter  # returns a factor in [0.5, 1.0]
        self._recent: deque[float] = deque()  # times of restarts inside the window
        self._due: float | None = None  # when the pending restart may run (backoff fixed once)

    def decide(self, alive: Mapping[str, bool], now: float) -> Decision:
        """Look once; a returned restart counts as done at `now` (a failed one still counts)."""
        wanted = daemons_to_restart(alive)
        if not wanted:
            self._due = None
            return Decision()
        policy = self.policy
        while self._recent and self._recent[0] <= now - policy.window:
            self._recent.popleft()
        if len(self._recent) >= policy.max_restarts:
            self._due = None
            return Decision(capped=True)
        if self._due is None:
            self._due = now if not self._recent else self._recent[-1] + self._backoff(len(self._recent))
        if now < self._due:
            return Decision()
        self._due = None
        self._recent.append(now)
        return Decision(restart=wanted)

    def _backoff(self, restarts: int) -> float:
        delay = min(self.policy.backoff_max, self.policy.backoff_min * 2 ** (restarts - 1))
        return delay * self._jitter()


@dataclass(frozen=True)
class SupervisorStats:
    """A snapshot for metrics: which daemons run, restarts done, whether the cap holds them back."""

    up: Mapping[str, bool]
    restarts: Mapping[str, int]
    capped: bool
    restarting: bool  # False with an external OVS: watched and reported only
    checks_failed: Mapping[str, int] = field(default_factory=dict)  # looks that could not be made


class DaemonControl(Protocol):
    """The OVS daemons as the supervisor sees them (EmbeddedOvs, or pid files only)."""

    def pid(self, daemon: str) -> int | None: ...

    def look(self, daemon: str) -> int | None:
        """As pid(), but raises PidUnknown when the pid file or /proc could not be read."""

    def restart(self, daemons: Sequence[str]) -> None: ...


class OvsSupervisor:
    """Polls the daemons every `interval` seconds and restarts them (embedded) or reports (external).

    `after_restart` re-ensures what the agent configured in OVSDB (bridge, controller).
    """

    def __init__(self, daemons: DaemonControl, interval: float, *, restarting: bool,
                 after_restart: Callable[[], Awaitable[None]],
                 policy: RestartPolicy = RestartPolicy(),
                 clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0),
                 notices: Callable[[], DeathNotices] | None = DeathNotices) -> None:
        """`notices` makes the death notices on the running loop (None: poll every `interval` only)."""
        self._daemons = daemons
        self._interval = interval
        self._restarting = restarting
        self._after_restart = after_restart
        self._clock = clock
        self._governor = RestartGovernor(policy, jitter)
        self._up: dict[str, bool] = {d: True for d in DAEMONS}
        self._pids: dict[str, int] = {}  # the live pid of each daemon at the last look
        self._make_notices = notices
        # External: only daemons found running at the first look (their pid files may live
        # elsewhere than we look); embedded: both, always.
        self._watched: tuple[str, ...] | None = DAEMONS if restarting else None
        self._restarts: dict[str, int] = dict.fromkeys(DAEMONS, 0)
        self._checks_failed: dict[str, int] = dict.fromkeys(DAEMONS, 0)
        self._look_log = RateLimitedLog(log, interval=30.0, clock=clock)
        self._capped = False
        self._task: asyncio.Task[None] | None = None

    def snapshot(self) -> SupervisorStats:
        watched = self._watched or ()
        return SupervisorStats(up={d: self._up[d] for d in watched}, restarts=dict(self._restarts), capped=self._capped,
                               restarting=self._restarting,
                               checks_failed={d: self._checks_failed[d] for d in self._watched or DAEMONS})

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ovs-supervisor")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        notices = self._make_notices() if self._make_notices is not None else None
        try:
            while True:
                try:
                    await self.check()
                except asyncio.CancelledError:
                    raise
                except Exception:  # the watch must outlive any one failed look or restart
                    log.exception("OVS supervisor: check failed; looking again in %.1fs", self._interval)
                await self._wait(notices)
        finally:
            if notices is not None:
                notices.close()

    async def _wait(self, notices: DeathNotices | None) -> None:
        """Until a watched daemon ends, or the next look by time: SAFETY_LOOK when every watched daemon
        runs with its death notified, `interval` otherwise (one is dead or not covered)."""
        watched = self._watched or ()
        running = [self._pids[d] for d in watched if d in self._pids]
        covered = notices is not None and len(running) == len(watched) and notices.watch(running)
        if notices is None or not covered:
            await asyncio.sleep(self._interval)
            return
        try:
            await within(notices.ended.wait(), max(self._interval, SAFETY_LOOK))
        except asyncio.TimeoutError:
            pass
        notices.ended.clear()

    async def check(self) -> None:
        """One look at the daemons, and a restart if one is due."""
        alive = self._look()
        if alive is None:
            return
        if self._watched is None:
            self._watched = tuple(d for d in DAEMONS if alive[d])
            for daemon in sorted(set(DAEMONS) - set(self._watched)):
                log.warning("OVS supervisor: external %s not found by its pid file: not watched", daemon)
        self._report({d: alive[d] for d in self._watched})
        if not self._restarting:
            return
        decision = self._governor.decide(alive, self._clock())
        if decision.capped and not self._capped:
            policy = self._governor.policy
            log.error("OVS supervisor: %d restarts within %.0fs; NOT restarting %s until the window "
                      "allows: Pods do not forward meanwhile", policy.max_restarts, policy.window,
                      " and ".join(daemons_to_restart(alive)))
        self._capped = decision.capped
        if not decision.restart:
            return
        log.warning("OVS supervisor: restarting %s", " and ".join(decision.restart))
        for daemon in decision.restart:
            self._restarts[daemon] += 1
        try:
            await asyncio.to_thread(self._daemons.restart, decision.restart)
            await self._after_restart()
        except (AgentError, OSError) as exc:  # OSError: no descriptor for the daemon's pipes, say
            log.error("OVS supervisor: restart of %s failed: %s", " and ".join(decision.restart), exc)
            return
        after = self._look()
        if after is not None:
            self._report(after)

    def _look(self) -> dict[str, bool] | None:
        """Which daemons run; None when one could not be looked at (then nothing is concluded)."""
        alive: dict[str, bool] = {}
        failed: list[str] = []
        pids: dict[str, int] = {}
        for daemon in DAEMONS:
            try:
                pid = self._daemons.look(daemon)
            except PidUnknown as exc:
                self._checks_failed[daemon] += 1
                failed.append(f"{daemon}: {exc}")
                continue
            alive[daemon] = pid is not None
            if pid is not None:
                pids[daemon] = pid
        self._pids = pids
        if failed:
            self._look_log.log(logging.WARNING, "look", "OVS supervisor: could not check %s; not a death: nothing "
                               "restarted, looking again in %.1fs", "; ".join(failed), self._interval)
            return None
        return alive

    def _report(self, alive: Mapping[str, bool]) -> None:
        for daemon, now_up in alive.items():
            if now_up == self._up[daemon]:
                continue
            self._up[daemon] = now_up
            if now_up:
                log.warning("OVS supervisor: %s is running again (pid %s)", daemon, self._daemons.pid(daemon))
            elif self._restarting:
                log.error("OVS supervisor: %s is not running: Pods do not forward until it is restarted", daemon)
            else:
                log.error("OVS supervisor: external %s is not running: Pods do not forward until it "
                          "returns (the agent reconnects then)", daemon)
