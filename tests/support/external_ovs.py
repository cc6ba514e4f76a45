"""An OVS the agent does not run (`ovs.mode: external`), started for a test as an admin would start one:
ovsdb-server and ovs-vswitchd (userspace datapath) with a run dir of their own (OVS_RUNDIR: db.sock,
pid files, ovs-vswitchd.<pid>.ctl) and the vswitchd in a network namespace the caller made.
Stopped by the pids in its pid files (while the daemon holds the file's lock), never by name; `down`
removes the run dir."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from policy_agent.ovs.pids import read_pid, stop_pid

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"


class ExternalOvs:
    def __init__(self, run_dir: Path, netns: str) -> None:
        self.run_dir = run_dir
        self.netns = netns

    @property
    def db(self) -> str:
        return f"unix:{self.run_dir / 'db.sock'}"

    def _env(self) -> dict[str, str]:
        d = str(self.run_dir)
        return dict(os.environ, OVS_RUNDIR=d, OVS_LOGDIR=d, OVS_DBDIR=d, OVS_SYSCONFDIR=d)

    def _run(self, *cmd: str) -> None:
        subprocess.run(list(cmd), check=True, capture_output=True, env=self._env(), timeout=30)

    def up(self, timeout: float = 20.0) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run("ovsdb-tool", "create", str(self.run_dir / "conf.db"), SCHEMA)
        self._run("ovsdb-server", str(self.run_dir / "conf.db"), f"--remote=punix:{self.run_dir / 'db.sock'}",
                  "--pidfile", "--log-file", "--no-chdir", "--detach")
        self._run("ovs-vsctl", f"--db={self.db}", "--no-wait", "init")
        self._run("ip", "netns", "exec", self.netns, "ovs-vswitchd", self.db, "--pidfile", "--log-file",
                  "--no-chdir", "--detach")
        deadline = time.monotonic() + timeout
        while not (self.pid("ovs-vswitchd") and list(self.run_dir.glob("ovs-vswitchd.*.ctl"))):
            if time.monotonic() > deadline:
                raise AssertionError(f"external ovs-vswitchd did not come up in {self.run_dir}")
            time.sleep(0.05)

    def pid(self, daemon: str) -> int | None:
        """The pid in `daemon`'s pid file while that process runs and holds the file's lock."""
        return read_pid(self.run_dir / f"{daemon}.pid")

    def mgmt(self, bridge: str = "br-int") -> str:
        return f"unix:{self.run_dir / (bridge + '.mgmt')}"

    def down(self) -> None:
        for daemon in ("ovs-vswitchd", "ovsdb-server"):
            pid = self.pid(daemon)
            if pid is not None:
                stop_pid(pid, lambda: self.pid(daemon) == pid)
        shutil.rmtree(self.run_dir, ignore_errors=True)
