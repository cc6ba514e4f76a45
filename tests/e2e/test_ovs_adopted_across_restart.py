"""The embedded OVS outlives an agent restart, as the systemd unit's KillMode=process leaves it: the agent's
SIGTERM stops the agent only, and the next agent adopts the same ovsdb-server and ovs-vswitchd."""

from __future__ import annotations

from policy_agent.ovs.embedded import pid_alive
from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import daemon_pid, server_behind_no_80

DAEMONS = ("ovsdb-server", "ovs-vswitchd")


def test_an_agent_restart_leaves_the_embedded_ovs_running_and_the_new_agent_adopts_it(cluster: Cluster) -> None:
    server, client = server_behind_no_80(cluster)
    target = [f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"]
    before = {d: daemon_pid(cluster, d) for d in DAEMONS}

    cluster.stop_agent()  # SIGTERM, exit 0: what systemd sends the main process
    assert all(pid_alive(pid) for pid in before.values()), before
    # No agent: the datapath still forwards and enforces what was installed (fail_mode=secure).
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "connected"}

    cluster.start()
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "connected"}
    # The same daemons: adopted by their pid files, neither restarted nor started twice.
    assert {d: daemon_pid(cluster, d) for d in DAEMONS} == before
