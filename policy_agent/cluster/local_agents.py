"""`npaudit cluster`'s node agents as processes: started detached, found again by pid file and command line,
asked whether they are ready, and, for one that ended while `up` waited, how it ended."""

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


def start_agent(node: NodePlan) -> int:
    """`npaudit agent --config DIR/<node>/npaudit.yaml`, detached (a session of its own), output to its log."""
    with open(node.log_path, "ab") as log, open(os.devnull, "rb") as null:
        proc = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "agent", "--config",
                                 str(node.config_path)], stdin=null, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    node.pid_path.write_text(f"{proc.pid}\n")
    return proc.pid


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
        done, status = os.waitpid(pid, os.WNOHANG)
    except (OSError, ValueError):  # ChildProcessError: not ours to reap
        return ""
    if done != pid:
        return ""
    if os.WIFSIGNALED(status):
        return f" (ended by {signal.Signals(os.WTERMSIG(status)).name})"
    return f" (exit status {os.WEXITSTATUS(status)})"
