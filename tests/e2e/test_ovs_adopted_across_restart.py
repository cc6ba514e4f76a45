"""The embedded OVS outlives an agent restart, as the systemd unit's KillMode=process leaves it: the agent's
SIGTERM stops the agent only, and the next agent adopts the same ovsdb-server and ovs-vswitchd."""

from __future__ import annotations

import os
import signal

from policy_agent.ovs.pids import pid_alive
from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import daemon_pid, server_behind_no_80
from tests.support.pid_files import bystander, reap
from tests.support.processes import alive
from tests.support.waiting import wait_for

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


def test_a_crashed_vswitchd_whose_pid_now_names_another_process_is_started_again_and_that_process_spared(
        cluster: Cluster) -> None:
    server, client = server_behind_no_80(cluster)
    target = [f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"]
    cluster.stop_agent()
    crashed = daemon_pid(cluster, "ovs-vswitchd")
    os.kill(crashed, signal.SIGKILL)  # a crash: the pid file stays behind
    wait_for(lambda: not pid_alive(crashed), timeout=10, what=f"vswitchd {crashed} gone")
    assert not pid_alive(crashed)
    pidfile = cluster.dir / "ovs" / "ovs-vswitchd.pid"
    assert pidfile.read_text().strip() == str(crashed)
    other = bystander()
    try:
        pidfile.write_text(f"{other.pid}\n")  # the kernel has given that pid to another process since
        cluster.start()
        # Not taken for the vswitchd: a new one was started, and it enforces the policy again.
        assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "connected"}
        assert daemon_pid(cluster, "ovs-vswitchd") not in (crashed, other.pid)
        cluster.stop_agent()
        cluster.close()  # `npaudit ovs down`: stops the daemons its pid files name
        assert alive(other.pid), "the process that had the crashed daemon's pid was signalled"
    finally:
        reap(other)
