"""An agent restart keeps enforcing: applied policy comes back, old flows go only after new ones exist."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import KNOCKER, server_behind_no_80

def test_restart_keeps_policy_and_reconciles_flows(cluster: Cluster) -> None:
    server, client = server_behind_no_80(cluster)
    target = [f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"]
    round_before = int((cluster.state / "round").read_text())

    stop = cluster.dir / "stop-knocking"
    knocker = subprocess.Popen(["ip", "netns", "exec", client.netns, sys.executable, "-c", KNOCKER,
                                server.ip, "80", str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        cluster.stop_agent()
        time.sleep(0.5)  # no agent at all: OVS keeps enforcing (fail_mode=secure)
        cluster.start()
        time.sleep(0.5)
    finally:
        stop.touch()
        connected = int(knocker.communicate(timeout=30)[0].strip())
    assert connected == 0, f"{connected} connections to the blocked port got through during the restart"

    # The policy came back from the agent's state, and it still decides.
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "connected"}
    # Every flow belongs to the new round: the old round's leftovers are gone.
    round_after = int((cluster.state / "round").read_text())
    assert round_after == round_before + 1
    rounds = {int(m.group(1), 16) >> 32 for line in cluster.flows()
              if (m := re.search(r"cookie=(0x[0-9a-f]+)", line))}
    assert rounds == {round_after}, rounds
    # Pods survive the restart: CNI DEL of a Pod added before it still works.
    assert cluster.cni("DEL", client).returncode == 0
    cluster.pods.pop(client.ref)


def test_sigusr2_logs_every_threads_stack_and_the_agent_goes_on(cluster: Cluster) -> None:
    """What stop_agent asks of an agent that does not stop (tests/support/cluster.py): its stacks, in its log."""
    before = len(cluster.log())
    assert cluster.agent is not None
    cluster.agent.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while "(end of the stacks of" not in cluster.log()[before:] and time.monotonic() < deadline:
        time.sleep(0.1)
    dump = cluster.log()[before:]
    assert "(MainThread)" in dump and "asyncio/base_events.py" in dump, (cluster.agent.poll(), dump[-3000:])
    assert cluster.agent.poll() is None, cluster.log()[-3000:]  # a dump, not a stop
    cluster.stop_agent()  # and it still stops on SIGTERM, with 0
