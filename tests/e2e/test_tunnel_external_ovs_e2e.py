"""Traffic between nodes with `ovs.mode: external`: each node's OVS is one the test starts itself, as an
admin would (ovsdb-server and a userspace ovs-vswitchd with a run dir of their own, in the node's
namespace: tests/support/external_ovs.py), and the agent, run in that namespace, only uses it. Geneve
between two such nodes (tests/support/multinode.py), Pods through `npaudit cni`.

On the userspace (netdev) datapath the agent makes br-phy with cluster.underlay_interface as on its own
OVS: without it no tunnel packet leaves (an address the kernel holds is no route for that datapath).
The kernel datapath is not exercised: this machine has no openvswitch module.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Iterator

import pytest

from tests.support.crossnode import connect, datagram_arrives, labelled, place_pods, wait_records
from tests.support.multinode import MultiNode


@pytest.fixture
def external() -> Iterator[MultiNode]:
    m = MultiNode(2, "geneve", external_ovs=True)
    try:
        m.start()
        yield m
    finally:
        m.close()


def bridges(m: MultiNode, i: int) -> set[str]:
    out = subprocess.run(["ovs-vsctl", f"--db={m.external[i].db}", "list-br"], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def ovs_up(m: MultiNode, i: int) -> dict[str, float]:
    """npaudit_ovs_up of node i's agent, read inside its namespace (where its metrics listen)."""
    text = subprocess.run(["ip", "netns", "exec", m.nodes[i].node_netns, sys.executable, "-c",
                           "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10)"
                           ".read().decode())", m.metrics[i]], capture_output=True, text=True, check=True).stdout
    return {d: float(v) for d, v in re.findall(r'^npaudit_ovs_up\{daemon="([^"]+)"\} (\S+)$', text, re.M)}


def test_pods_on_two_external_userspace_ovs_talk_through_geneve_a_drop_is_recorded_on_its_node_and_a_restart_leaves_ovs(
        external: MultiNode) -> None:
    n1, n2 = external.nodes[1], external.nodes[2]
    pids = {i: (e.pid("ovsdb-server"), e.pid("ovs-vswitchd")) for i, e in external.external.items()}
    assert all(a and b for a, b in pids.values()), pids
    # The agent used the OVS it was given: its bridges there, no embedded OVS of its own.
    for i, c in external.nodes.items():
        assert bridges(external, i) == {"br-int", "br-phy"}
        assert not (c.dir / "ovs").exists()
        # It watches that OVS's own pid files (beside its db.sock), so it reports it up.
        deadline = time.monotonic() + 15  # (the supervisor's first look follows the agent's start)
        while not (up := ovs_up(external, i)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert up == {"ovsdb-server": 1.0, "ovs-vswitchd": 1.0}, c.log()
        assert "not found by its pid file" not in c.log()
        assert "Traceback" not in c.log()

    a, b = place_pods(external)
    assert a.ip.startswith("10.246.1.") and b.ip.startswith("10.246.2.")
    # The first packet into the fresh tunnel, a lone UDP datagram, arrives: the agent resolved node 2's
    # underlay next hop for this OVS too (policy_agent/ovs/tunnel_neighbours.py).
    assert datagram_arrives(a.netns, b.netns, b.ip, 53), n1.log()
    t80, t81 = f"{b.ip}:80/tcp", f"{b.ip}:81/tcp"
    assert connect(n1, "x/client", [t80]) == {t80: "connected"}
    # Dropped (and logged) by the client's egress rule on node 1.
    assert n1.probe("x/client", [t81], timeout=2.0) == {t81: "timeout"}
    r1 = wait_records(n1, lambda rs: bool(labelled(rs, "egress-drop")))
    drop = labelled(r1, "egress-drop")
    assert drop and drop[0]["event"]["action"] == "dropped" and drop[0]["observer"]["hostname"] == "node-1", r1
    assert drop[0]["npaudit"]["destination"]["pod"] == {"namespace": "y", "name": "server"}
    r2 = wait_records(n2, lambda rs: bool(labelled(rs, "ingress-allow")))
    assert labelled(r2, "ingress-allow") and not labelled(r2, "egress-drop"), r2
    # The tunnel carried it: node 1's flow to node 2's Pod subnet counted packets.
    assert [f for f in n1.flows() if "->tun_dst" in f and "n_packets=0," not in f], n1.flows()

    # The agent stops and starts again: the external OVS is never stopped (same pids), its flows keep
    # enforcing meanwhile, and the restarted agent carries traffic again.
    n1.stop_agent()
    assert (external.external[1].pid("ovsdb-server"), external.external[1].pid("ovs-vswitchd")) == pids[1]
    assert n1.probe("x/client", [t80], timeout=5.0) == {t80: "connected"}
    assert n1.probe("x/client", [t81], timeout=2.0) == {t81: "timeout"}
    n1.start(120)
    assert connect(n1, "x/client", [t80]) == {t80: "connected"}
    assert {i: (e.pid("ovsdb-server"), e.pid("ovs-vswitchd")) for i, e in external.external.items()} == pids
    assert "Traceback" not in n1.log()
