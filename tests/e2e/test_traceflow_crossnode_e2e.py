"""`npaudit trace` to a Pod of another node: the tunnel hop, then the destination node's own part.

Uses tests/support/local_cluster.py: 2 nodes by `npaudit cluster up` (Geneve), x/a on n1, y/b on n2.
- no policy: the trace from x/a (asked of n1's agent) shows n1's tables up to "into the Geneve tunnel to
  node n2 (198.51.100.12)", then n2's tables, from the tunnel up to the output to y/b: delivered on n2;
  the trace packet never reaches y/b (a sniffer in its namespace), and n2 counts the trace it ran;
- a logged ingress Drop on y from x (judged on n2): the trace ends on n2, in its ingress table, with
  the policy and rule that dropped it; n1's part still ends in the tunnel; no audit record of it;
- n2's agent gone (SIGKILL, by the pid `cluster up` recorded): the answer comes within the trace's timeout
  and says node n2 did not report its part;
- routed mode (no tunnel, no mark): the trace ends on n1, handed to the gateway, and says n2 is not traced.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.local_cluster import LocalCluster, npaudit
from tests.support.processes import alive
from tests.support.waiting import wait_for

N2_ADDRESS = "198.51.100.12"  # node 2's underlay address in a local cluster (policy_agent/cluster/local.py)

# One JSON line per IPv4 TCP frame to port 80 seen on eth0 of the namespace it runs in (AF_PACKET).
SNIFFER = r"""
import json, socket, struct
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("eth0", 0))
print("ready", flush=True)
while True:
    f = s.recv(65535)
    if f[12:14] != b"\x08\x00" or f[23] != 6:
        continue
    l4 = f[14 + (f[14] & 15) * 4:]
    sport, dport = struct.unpack("!HH", l4[:4])
    if dport == 80:
        print(json.dumps({"src": socket.inet_ntoa(f[26:30]), "dscp": f[15] >> 2, "sport": sport}), flush=True)
"""


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    c = LocalCluster()
    try:
        c.up(2, "--encapsulation", "geneve")
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def pods(local: LocalCluster) -> dict[str, dict[str, str]]:
    a = local.add_pod("n1", "x/a", "app=a")
    b = local.add_pod("n2", "y/b", "app=b")
    wait_for(lambda: [local.node_status(n)["policy"]["pods"] for n in ("n1", "n2")] == [2, 2], timeout=120,
             what="both Pods known on both nodes")
    # Real traffic first: the tunnel's first packets to a peer may be lost while its underlay neighbour resolves.
    wait_for(lambda: local.probe(a["netns"], [f"{b['ip']}:80/tcp"]) == {f"{b['ip']}:80/tcp": "connected"},
             timeout=60, interval=0.5, what="x/a reaching y/b across the tunnel")
    return {"a": a, "b": b}


def trace(local: LocalCluster, *args: str, timeout: float = 5.0) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    res = npaudit("trace", "--from", "x/a", "--to", "y/b", *args, "--timeout", str(timeout), "-o", "json",
                  "--config", local.config("n1"), timeout=120)
    elapsed = time.monotonic() - started
    assert res.stdout, f"npaudit trace: exit {res.returncode}, stderr {res.stderr}"
    return res.returncode, json.loads(res.stdout), elapsed


def on(result: dict[str, Any], node: str) -> list[dict[str, Any]]:
    return [o for o in result["observations"] if o.get("node") == node]


def hop(result: dict[str, Any]) -> dict[str, Any]:
    """n1's last observation: table 70 sending the packet into the tunnel."""
    last = on(result, "n1")[-1]
    assert (last["table"], last["action"]) == (70, "tunnel"), result["observations"]
    return last


def test_an_allowed_trace_shows_the_tunnel_hop_and_the_destination_node_delivering(
        local: LocalCluster, pods: dict[str, dict[str, str]]) -> None:
    sniffer = subprocess.Popen(["ip", "netns", "exec", pods["b"]["netns"], sys.executable, "-c", SNIFFER],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sniffer.stdout is not None and sniffer.stdout.readline().strip() == "ready"
        code, result, _ = trace(local, "--port", "80", "--source-port", "45100")
        time.sleep(0.3)  # a frame in flight
    finally:
        sniffer.terminate()
        out, _ = sniffer.communicate(timeout=10)
    assert code == 0, result
    assert result["to"] == {"pod": "y/b", "ip": pods["b"]["ip"], "node": "n2"}
    tunnel = hop(result)
    assert tunnel["tunnel"] == {"node": "n2", "address": N2_ADDRESS}
    assert "to Pod y/b on node n2 (198.51.100.12)" in tunnel["detail"]
    theirs = on(result, "n2")
    assert theirs[0]["table"] == 0 and theirs[0]["detail"] == "from the tunnel: node n1 (198.51.100.11)"
    assert [o["table"] for o in theirs] == [0, 10, 20, 30, 31, 32, 40, 41, 42, 60, 70]
    assert theirs[-1]["action"] == "output" and theirs[-1]["detail"].startswith("to Pod y/b on port ")
    assert result["outcome"]["result"] == "delivered" and result["outcome"]["node"] == "n2"
    assert result["outcome"]["detail"].startswith("on node n2: delivered to Pod y/b")
    # The trace packet stopped in n2's table 70: y/b never saw it (only real SYNs would show here).
    assert [f for f in out.splitlines() if json.loads(f)["sport"] == 45100] == []
    assert local.node_status("n2")["traceflow"]["received"] >= 1
    assert local.node_status("n1")["traceflow"]["reports"] >= 1
    table = npaudit("trace", "--from", "x/a", "--to", "y/b", "--config", local.config("n1"), timeout=120)
    lines = table.stdout.splitlines()
    assert table.returncode == 0 and lines[1].split()[:2] == ["NODE", "TABLE"], table.stdout + table.stderr
    assert any(line.split()[:2] == ["n1", "70"] and "node n2 (198.51.100.12)" in line for line in lines)
    assert lines[-1].startswith("outcome: delivered: on node n2: delivered to Pod y/b")


def test_a_trace_dropped_by_an_ingress_rule_on_the_destination_node_names_that_node_and_rule(
        local: LocalCluster, pods: dict[str, dict[str, str]], tmp_path: Path) -> None:
    drop = ("apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: y-drop-80}\n"
            "spec:\n  tier: securityops\n  priority: 4\n"
            "  appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]\n"
            "  ingress:\n  - name: no-80-from-x\n    action: Drop\n    enableLogging: true\n    logLabel: tf-x\n"
            "    from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]\n"
            "    ports: [{protocol: TCP, port: 80}]\n")
    (tmp_path / "drop.yaml").write_text(drop)
    res = local.cluster("apply", "-f", str(tmp_path / "drop.yaml"))
    assert res.returncode == 0, res.stderr
    wait_for(lambda: [local.node_status(n)["policy"]["policies"] for n in ("n1", "n2")] == [1, 1], timeout=120,
             what="the Drop on both nodes")
    code, result, _ = trace(local, "--port", "80")
    assert code == 1, result
    hop(result)  # egress on n1 lets it go: the Drop is n2's, on ingress
    outcome = result["outcome"]
    assert (outcome["result"], outcome["node"], outcome["table"]) == ("dropped", "n2", 40)
    assert (outcome["rule"]["policy"], outcome["rule"]["name"]) == ("y-drop-80", "no-80-from-x")
    dropped = [o for o in on(result, "n2") if o["action"] == "Drop"]
    assert [(o["table"], o["rule"]["policy"]) for o in dropped] == [(40, "y-drop-80")]
    assert outcome["detail"].startswith("on node n2: Drop by AntreaClusterNetworkPolicy y-drop-80, rule no-80-from-x")
    time.sleep(1.0)  # a record of the packet's first copy would be written by now
    assert [r for r in local.audit_records("n2") if r.get("labels", {}).get("log_label") == "tf-x"] == []


def test_a_destination_node_that_does_not_answer_is_named_within_the_timeout(
        local: LocalCluster, pods: dict[str, dict[str, str]]) -> None:
    pid = int((local.dir / "n2" / "agent.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # the agent `cluster up` started for n2; its OVS keeps the flows
    wait_for(lambda: not alive(pid), timeout=10, what="n2's agent gone")
    code, result, elapsed = trace(local, "--port", "81", timeout=3.0)
    assert code == 3, result
    hop(result)
    outcome = result["outcome"]
    assert (outcome["result"], outcome["node"], outcome["address"]) == ("no-report", "n2", N2_ADDRESS)
    assert "node n2 did not report its part" in outcome["detail"]
    assert on(result, "n2") == []
    assert elapsed < 3.0 + 10  # the answer at the timeout (plus the CLI's start), never a hang


def test_routed_mode_traces_the_source_node_and_says_the_other_is_not_traced() -> None:
    c = LocalCluster()
    try:
        c.up(2, "--encapsulation", "routed")
        c.add_pod("n1", "x/a", server=False)
        b = c.add_pod("n2", "y/b", server=False)
        wait_for(lambda: c.node_status("n1")["policy"]["pods"] == 2, timeout=120, what="y/b known on n1")
        code, result, _ = trace(c, "--port", "80")
        assert code == 0, result
        assert result["to"] == {"pod": "y/b", "ip": b["ip"], "node": "n2"}
        assert result["outcome"]["result"] == "forwarded"
        assert result["outcome"]["detail"].endswith("routed mode: node n2 (198.51.100.12) is not traced (Geneve only)")
        assert all("node" not in o for o in result["observations"])
    finally:
        c.close()
