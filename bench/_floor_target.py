"""Where a floor reader reads from: the agent's own OpenFlow transport, or the bridge's .mgmt socket.

Shared by bench/agent_latency.py and bench/agent_cpu.py, whose floors (bench/_of_floor.py, and the C reader
bench/_of_floor.c) stand in for the agent once it is stopped: compared like with like, a floor reads over the
transport the agent read over (over TCP, the agent's controller target, which OVS keeps listening on once the
agent is stopped, from the namespace OVS runs in).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from policy_agent.config.loader import loads

FLOOR = Path(__file__).resolve().parent / "_of_floor.py"


def agent_transport(log: Path) -> str:
    """What the agent connected over, from its log's "OpenFlow connected to <target>": tcp or unix."""
    found = re.findall(r"OpenFlow connected to (\S+)", log.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"{log} does not say where the agent connected")
    return "tcp" if found[-1].startswith("tcp:") else "unix"


def floor_reader(config: Path, transport: str) -> tuple[list[str], str]:
    """The floor reader's command line (without --append) and how it reads: over the agent's transport (`agent`:
    its controller target, over TCP from the namespace OVS listens in) or the bridge's .mgmt socket (`mgmt`)."""
    agent = loads(config.read_text(), str(config))
    floor = [sys.executable, str(FLOOR)]
    if transport == "mgmt":
        return [*floor, str(agent.ovs.ovs_rundir / f"{agent.ovs.bridge}.mgmt")], "unix (the bridge's .mgmt)"
    target = agent.openflow_target
    if target.startswith("tcp:"):
        netns = agent.openflow_netns
        return [*(["ip", "netns", "exec", netns] if netns else []), *floor, target], "tcp (the agent's target)"
    return [*floor, target], "unix (the agent's target)"
