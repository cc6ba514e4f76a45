"""A private ovsdb-server + ovs-vswitchd (userspace datapath) in a run directory of ours.

Never touches a system OVS: its own database file, sockets, pid files and logs
live in `run_dir`, and ovs-vswitchd runs in a network namespace of its own so
that its `ovs-netdev` tap cannot collide with another instance. Daemons are
stopped by the pids they wrote, never by name.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from policy_agent.errors import OvsError
from policy_agent.ovs.pids import look_pid, read_pid, stop_pid

log = logging.getLogger(__name__)

SCHEMA_CANDIDATES = ("/usr/share/openvswitch/vswitch.ovsschema",)
_NETNS_MARK = "netns.created"


def _run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 30) -> str:
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError as exc:
        raise OvsError(f"{cmd[0]} not found: install openvswitch-switch (make setup does)") from exc
    except subprocess.CalledProcessError as exc:
        raise OvsError(f"{' '.join(cmd)} failed ({exc.returncode}): {exc.stderr.strip()}") from exc
    except subprocess.TimeoutExpired as exc:
        raise OvsError(f"{' '.join(cmd)} timed out after {timeout}s") from exc
    return out.stdout


@dataclass(frozen=True)
class OvsPidFiles:
    """The pid files of an OVS the agent does not manage (ovs.mode external): watched, never restarted."""

    run_dir: Path

    def pid(self, daemon: str) -> int | None:
        return read_pid(self.run_dir / f"{daemon}.pid")

    def look(self, daemon: str) -> int | None:
        """As pid(), but PidUnknown when the pid file or /proc could not be read."""
        return look_pid(self.run_dir / f"{daemon}.pid")

    def restart(self, daemons: Sequence[str]) -> None:
        raise OvsError(f"{', '.join(daemons)} in {self.run_dir} belong to an external OVS: not restarted")


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


@dataclass(frozen=True)
class EmbeddedOvs:
    """Paths and lifecycle of one private OVS instance."""

    run_dir: Path
    netns: str = ""

    @property
    def db_file(self) -> Path:
        return self.run_dir / "conf.db"

    @property
    def db_sock(self) -> Path:
        return self.run_dir / "db.sock"

    @property
    def db_remote(self) -> str:
        return f"unix:{self.db_sock}"

    def _pidfile(self, daemon: str) -> Path:
        return self.run_dir / f"{daemon}.pid"

    def pid(self, daemon: str) -> int | None:
        """The pid in `daemon`'s pid file if that process is alive."""
        return read_pid(self._pidfile(daemon))

    def look(self, daemon: str) -> int | None:
        """As pid(), but PidUnknown when the pid file or /proc could not be read."""
        return look_pid(self._pidfile(daemon))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(OVS_RUNDIR=str(self.run_dir), OVS_LOGDIR=str(self.run_dir),
                   OVS_DBDIR=str(self.run_dir), OVS_SYSCONFDIR=str(self.run_dir))
        return env

    def _in_netns(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd

    def up(self, timeout: float = 15.0, started: list[str] | None = None) -> None:
        """Start whatever is not running; idempotent. What this call started ("netns", then the daemons'
        names) is appended to `started` as it happens, so a caller can undo a start that fails later."""
        started = [] if started is None else started
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o750)
        if self.netns and not netns_exists(self.netns):
            _run(["ip", "netns", "add", self.netns])
            (self.run_dir / _NETNS_MARK).write_text(self.netns)
            started.append("netns")
            _run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"])
        if not self.db_file.exists():
            schema = next((s for s in SCHEMA_CANDIDATES if Path(s).exists()), None)
            if schema is None:
                raise OvsError("vswitch.ovsschema not found: is openvswitch-common installed?")
            _run(["ovsdb-tool", "create", str(self.db_file), schema])
        env = self._env()
        if self.pid("ovsdb-server") is None:
            self.db_sock.unlink(missing_ok=True)
            _run(["ovsdb-server", str(self.db_file), f"--remote=punix:{self.db_sock}",
                  f"--pidfile={self._pidfile('ovsdb-server')}",
                  f"--unixctl={self.run_dir / 'ovsdb-server.ctl'}",
                  f"--log-file={self.run_dir / 'ovsdb-server.log'}",
                  "--no-chdir", "--detach"], env=env)
            started.append("ovsdb-server")
            self._wait_for(self.db_sock, "ovsdb-server", timeout)
        _run(["ovs-vsctl", f"--db={self.db_remote}", "--no-wait", "init"], env=env)
        if self.pid("ovs-vswitchd") is None:
            _run(self._in_netns([
                "ovs-vswitchd", self.db_remote,
                f"--pidfile={self._pidfile('ovs-vswitchd')}",
                f"--unixctl={self.run_dir / 'ovs-vswitchd.ctl'}",
                f"--log-file={self.run_dir / 'ovs-vswitchd.log'}",
                "--no-chdir", "--detach"]), env=env)
            started.append("ovs-vswitchd")
            self._wait_for(self.run_dir / "ovs-vswitchd.ctl", "ovs-vswitchd", timeout)
        log.info("embedded OVS up in %s (netns %s): ovsdb-server %s, ovs-vswitchd %s",
                 self.run_dir, self.netns or "-", self.pid("ovsdb-server"), self.pid("ovs-vswitchd"))

    def _wait_for(self, path: Path, daemon: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and self.pid(daemon) is not None:
                return
            time.sleep(0.02)
        raise OvsError(f"{daemon} did not come up within {timeout}s; see {self.run_dir / (daemon + '.log')}")

    def stop_daemon(self, daemon: str, timeout: float = 10.0) -> bool:
        """SIGTERM the daemon its pid file names (SIGKILL after `timeout`) and wait for it to end; True if
        one was running. Only the process holding the pid file's lock is signalled (policy_agent/ovs/pids.py)."""
        pid = self.pid(daemon)
        if pid is None:
            return False
        if not stop_pid(pid, lambda: self.pid(daemon) == pid, timeout):
            return False
        self._pidfile(daemon).unlink(missing_ok=True)
        return True

    def restart(self, daemons: Sequence[str], stop_timeout: float = 2.0) -> None:
        """Stop whichever of `daemons` still runs (a vswitchd spinning without its database),
        vswitchd before its database, then start what is missing."""
        for daemon in reversed(daemons):
            self.stop_daemon(daemon, timeout=stop_timeout)
        self.up()

    def undo(self, started: Sequence[str]) -> None:
        """Stop what one up() started (its `started` list): those daemons, then the namespace it made."""
        for daemon in ("ovs-vswitchd", "ovsdb-server"):
            if daemon in started:
                self.stop_daemon(daemon)
        mark = self.run_dir / _NETNS_MARK
        if "netns" in started and mark.exists():
            if netns_exists(self.netns):
                _run(["ip", "netns", "delete", self.netns])
            mark.unlink(missing_ok=True)

    def down(self, purge: bool = False) -> None:
        """Stop both daemons; remove the namespace if we created it; `purge` deletes run_dir."""
        self.stop_daemon("ovs-vswitchd")
        self.stop_daemon("ovsdb-server")
        mark = self.run_dir / _NETNS_MARK
        if mark.exists():
            name = mark.read_text().strip()
            if name and netns_exists(name):
                _run(["ip", "netns", "delete", name])
            mark.unlink(missing_ok=True)
        if purge and self.run_dir.exists():
            shutil.rmtree(self.run_dir)

    def status(self) -> dict[str, object]:
        return {
            "run_dir": str(self.run_dir),
            "netns": self.netns or None,
            "ovsdb_server_pid": self.pid("ovsdb-server"),
            "ovs_vswitchd_pid": self.pid("ovs-vswitchd"),
            "db": self.db_remote,
        }
