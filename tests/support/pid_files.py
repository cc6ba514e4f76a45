"""Processes that hold a pid file as OVS's daemons do (the pid written, the file locked with fcntl), and
plain processes a stale pid file could name: for the tests of policy_agent/ovs/pids.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Locks `path` (a write lock on the whole file), writes its pid, says so on stdout, then waits.
_HOLDER = """
import fcntl, os, signal, sys, time
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
time.sleep(600)
"""


def hold_pid_file(path: Path, ignore_term: bool = False) -> subprocess.Popen[str]:
    """A child that holds `path` as a daemon holds its pid file, once it says it does."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), "ignore-term" if ignore_term else "-"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "locked":
        proc.kill()
        proc.wait()
        raise AssertionError(f"the pid file holder for {path} did not start")
    return proc


def bystander() -> subprocess.Popen[bytes]:
    """A process of no daemon's: what a reused pid belongs to."""
    return subprocess.Popen(["sleep", "600"])


def reap(*procs: subprocess.Popen) -> None:
    """Kill and reap the children a test started (by their Popen, so never a pid reused meanwhile)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
