"""`npaudit cluster`'s node agents as processes: started detached, found again by pid file and command line,
asked whether they are ready, and, for one that ended while `up` waited, how it ended.

`up` keeps the Popen of each agent it started (`_STARTED`): a Popen dropped while its child runs goes to
subprocess's own list, and the next Popen of the process (any `ip netns ...`) reaps the child if it has ended,
so its exit status was lost and `up` could say only that it "exited". Held, the child is reaped here and
nowhere else, and whether it still runs is its own status, not a look at /proc that can fail for other
reasons."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from policy_agent.cluster.local import NodePlan
from policy_agent.ovs.pids import pid_alive


def agent_pid(node: NodePlan) -> int | None:
    """The pid in the node's pid file while that process is still this node's agent (a pid reused by
    another process is not ours: its command line would not name this node's config)."""
    try:
        pid = int(node.pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return pid if str(node.config_path).encode() in cmdline and b"agent" in cmdline else None


_STARTED: dict[int, subprocess.Popen[bytes]] = {}  # pid -> the agent this process started (module docstring)


def start_agent(node: NodePlan) -> int:
    """`npaudit agent --config DIR/<node>/npaudit.yaml`, detached (a session of its own), output to its log."""
    with open(node.log_path, "ab") as log, open(os.devnull, "rb") as null:
        proc = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "agent", "--config",
                                 str(node.config_path)], stdin=null, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _STARTED[proc.pid] = proc
    node.pid_path.write_text(f"{proc.pid}\n")
    return proc.pid


def started_here_running(node: NodePlan) -> bool | None:
    """Whether the agent this process started for `node` (the pid in its pid file) still runs, by its own
    status (reaped here when it has ended); None when this process did not start it."""
    try:
        proc = _STARTED.get(int(node.pid_path.read_text().strip()))
    except (OSError, ValueError):
        return None
    return None if proc is None else proc.poll() is None


def readiness(node: NodePlan, timeout: float = 2.0) -> tuple[bool, str]:
    """(ready, why not) from the agent's own /readyz (status.readiness: OpenFlow, policy flows, CNI)."""
    try:
        with urllib.request.urlopen(f"http://{node.metrics_listen}/readyz", timeout=timeout) as resp:
            return resp.status == 200, ""
    except urllib.error.HTTPError as exc:
        return False, exc.read().decode(errors="replace").strip()[:200] or f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, f"/readyz: {getattr(exc, 'reason', exc)}"


def log_tail(node: NodePlan, lines: int = 15) -> str:
    try:
        return "\n".join(node.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def how_it_ended(node: NodePlan) -> str:
    """How this node's agent (our child, as `up` started it) ended: its exit status or the signal that ended
    it, reaped here; "" if it is not known (not our child, still running, no pid file)."""
    try:
        pid = int(node.pid_path.read_text().strip())
    except (OSError, ValueError):
        return ""
    proc = _STARTED.get(pid)
    if proc is not None:
        code = proc.poll()
        if code is None:
            return ""
        return f" (ended by {signal.Signals(-code).name})" if code < 0 else f" (exit status {code})"
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours to reap
        return ""
    if done != pid:
        return ""
    if os.WIFSIGNALED(status):
        return f" (ended by {signal.Signals(os.WTERMSIG(status)).name})"
    return f" (exit status {os.WEXITSTATUS(status)})"
