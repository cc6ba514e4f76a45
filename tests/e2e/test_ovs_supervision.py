"""A killed OVS daemon is restarted by the agent: allowed traffic comes back, denied traffic never passes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import KNOCKER, server_behind_no_80
from tests.support.e2e_scenarios import daemon_pid

RECOVERY_BOUND = 20.0  # seconds; a bound for the test, not a speed claim


@pytest.mark.parametrize("daemon", ["ovs-vswitchd", "ovsdb-server"])
def test_a_killed_ovs_daemon_is_restarted_and_policy_holds_throughout(cluster: Cluster, daemon: str) -> None:
    server, client = server_behind_no_80(cluster)
    denied, allowed = f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"
    vswitchd_before = daemon_pid(cluster, "ovs-vswitchd")

    stop = cluster.dir / "stop-knocking"
    knocker = subprocess.Popen(["ip", "netns", "exec", client.netns, sys.executable, "-c", KNOCKER,
                                server.ip, "80", str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        os.kill(daemon_pid(cluster, daemon), signal.SIGKILL)
        killed = time.monotonic()
        outcome = {}
        while time.monotonic() - killed < RECOVERY_BOUND:
            outcome = cluster.probe(client.ref, [allowed], timeout=0.5)
            if outcome[allowed] == "connected":
                break
        recovered = time.monotonic() - killed
        time.sleep(0.5)  # the knocker keeps trying the denied port after the replay too
    finally:
        stop.touch()
        connected = int(knocker.communicate(timeout=30)[0].strip())
    assert outcome == {allowed: "connected"}, f"no recovery {RECOVERY_BOUND}s after killing {daemon}:\n{cluster.log()}"
    print(f"{daemon} killed: allowed traffic back after {recovered:.2f}s")
    assert connected == 0, f"{connected} connections to the denied port got through while {daemon} was down"
    assert cluster.probe(client.ref, [denied, allowed]) == {denied: "timeout", allowed: "connected"}
    # Both daemons run again; a dead database also took down its spinning vswitchd.
    assert daemon_pid(cluster, "ovsdb-server") and daemon_pid(cluster, "ovs-vswitchd") != vswitchd_before
    # The agent's OVSDB connection is back: a Pod added now gets a port and its policy.
    late = cluster.add_pod("x", "b", server=False)
    assert cluster.probe(late.ref, [denied, allowed]) == {denied: "timeout", allowed: "connected"}
