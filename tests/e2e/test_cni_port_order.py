"""A Pod's port is attached while the agent installs its flows (the agent chose the port's
OpenFlow number, so the flows need not wait for the port): what that port can do before its
flows are in must be nothing. Asked of the running agent's OVS with ofproto/trace."""

from __future__ import annotations

import json
import subprocess

from tests.support.cluster import Cluster, PodHandle


def _ofport(cluster: Cluster, pod: PodHandle) -> int:
    state = json.loads((cluster.state / "cni" / "containers" / f"{pod.container_id}.json").read_text())
    return int(state["info"]["ofport"])


def _trace(cluster: Cluster, in_port: int, src: PodHandle, dst: PodHandle) -> str:
    packet = (f"in_port={in_port},tcp,dl_src={src.mac},dl_dst={dst.mac},nw_src={src.ip},nw_dst={dst.ip},"
              "nw_ttl=64,tp_src=40000,tp_dst=80,tcp_flags=syn")
    # --ct-next: the trace follows the packet through conntrack as a new connection.
    return cluster.ovs_appctl("ofproto/trace", "br-int", packet, "--ct-next", "trk,new")


def test_a_pods_port_forwards_nothing_before_its_flows_are_in(cluster: Cluster) -> None:
    a, b = cluster.add_pod("x", "a", server=False), cluster.add_pod("x", "b", server=False)
    to_a = f"output:{_ofport(cluster, a)}"
    # With its flows in, b's port reaches a (so the trace below can tell).
    assert to_a in _trace(cluster, _ofport(cluster, b), b, a)

    # A port with a number the agent chose and no flows yet: b's next incarnation, say, between
    # attach and pod_added. Its frames, even from the address its Pod will have, stop in table 0.
    port, number = f"npo{cluster.tag}", 4000
    ovs_ns = f"npe-{cluster.tag}"
    subprocess.run(["ip", "-n", ovs_ns, "link", "add", port, "type", "veth", "peer", "name", f"{port}p"],
                   check=True)
    subprocess.run(["ip", "-n", ovs_ns, "link", "set", port, "up"], check=True)
    db = f"unix:{cluster.dir / 'ovs' / 'db.sock'}"
    subprocess.run(["ovs-vsctl", f"--db={db}", "add-port", "br-int", port, "--", "set", "Interface", port,
                    f"ofport_request={number}"], check=True, capture_output=True)
    try:
        trace = _trace(cluster, number, b, a)
        assert "Datapath actions: drop" in trace, trace
        assert to_a not in trace
    finally:
        subprocess.run(["ovs-vsctl", f"--db={db}", "--if-exists", "del-port", "br-int", port], capture_output=True)
        subprocess.run(["ip", "-n", ovs_ns, "link", "del", port], capture_output=True)
