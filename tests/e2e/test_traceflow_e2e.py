"""`npaudit trace` end to end (issue 11): the real agent, Pods through CNI, the CLI as an operator runs it.

One packet per trace, tagged and injected at the source Pod's port; the answer names each table it
met and the rule that decided. A trace packet never reaches the destination Pod (a sniffer in its
namespace), never gets a Reject answer (a sniffer in the source's), never creates an audit record,
and a logged-Drop flood that saturates the policy meter delays no trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import pytest

from tests.support.cluster import Cluster, PodHandle, _npaudit
from tests.support.overload_scenario import agent_counts
from tests.support.ports import free_port
from tests.support.traceflow_scenario import FLOOD, meter_drops, setup

# Prints one JSON line per IPv4 frame seen on eth0 of the namespace it runs in (AF_PACKET: before any
# socket, so it sees what a socket could): src, dst, dscp, proto, ports, TCP flags.
SNIFFER = r"""
import json, socket, struct, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("eth0", 0))
print("ready", flush=True)
while True:
    f = s.recv(65535)
    if f[12:14] != b"\x08\x00":
        continue
    ihl = (f[14] & 15) * 4
    l4 = f[14 + ihl:]
    out = {"src": socket.inet_ntoa(f[26:30]), "dst": socket.inet_ntoa(f[30:34]), "dscp": f[15] >> 2,
           "proto": f[23]}
    if f[23] in (6, 17) and len(l4) >= 4:
        out["sport"], out["dport"] = struct.unpack("!HH", l4[:4])
    if f[23] == 6 and len(l4) >= 14:
        out["flags"] = l4[13]
    print(json.dumps(out), flush=True)
"""


class Sniffer:
    def __init__(self, pod: PodHandle) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", pod.netns, sys.executable, "-c", SNIFFER],
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout is None or self.proc.stdout.readline().strip() != "ready":
            raise AssertionError(f"sniffer in {pod.ref} did not start")

    def stop(self) -> list[dict[str, Any]]:
        time.sleep(0.3)  # frames in flight
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def sniff() -> Iterator[Callable[[PodHandle], Sniffer]]:
    """Sniffers in Pod namespaces; the ones a failing test left running are stopped by pid."""
    started: list[Sniffer] = []

    def start(pod: PodHandle) -> Sniffer:
        started.append(Sniffer(pod))
        return started[-1]
    yield start
    for sniffer in started:
        if sniffer.proc.poll() is None:
            sniffer.proc.kill()
            sniffer.proc.wait()


def trace(cluster: Cluster, *args: str) -> tuple[int, dict[str, Any]]:
    res = _npaudit("trace", *args, "-o", "json", "--config", str(cluster.config))
    assert res.stdout, f"npaudit trace {args}: exit {res.returncode}, stderr {res.stderr.decode()}"
    return res.returncode, json.loads(res.stdout)


def rows(result: dict[str, Any]) -> list[tuple[int, str]]:
    return [(o["table"], o["action"]) for o in result["observations"]]


def test_trace_answers_forwarded_dropped_isolated_rejected_pass_allow_and_unknown(
        cluster: Cluster, sniff: Callable[[PodHandle], Sniffer]) -> None:
    pods = setup(cluster)
    yb = pods["y/b"]
    dst_sniffer, src_sniffer = sniff(yb), sniff(pods["x/a"])

    # Forwarded: no rule anywhere decides, the packet reaches table 70 for y/b.
    code, fwd = trace(cluster, "--from", "x/a", "--to", "y/b", "--protocol", "udp", "--port", "53")
    assert code == 0, fwd
    assert fwd["outcome"]["result"] == "delivered" and fwd["outcome"]["pod"] == "y/b"
    assert rows(fwd) == [(0, "accept"), (10, "track"), (20, "new"), (30, "default"), (31, "default"),
                         (32, "default"), (40, "default"), (41, "default"), (42, "default"), (60, "skip"),
                         (70, "output")]

    # ICMP echo and SCTP INIT meet the same pipeline.
    for proto in ("icmp", "sctp"):
        code, other = trace(cluster, "--from", "x/a", "--to", "y/b", "--protocol", proto)
        assert code == 0 and other["outcome"]["result"] == "delivered", other

    # Dropped by a tiered ClusterNetworkPolicy rule that does not log: policy, rule and tier named.
    code, drop = trace(cluster, "--from", "x/a", "--to", "y/b", "--port", "80")
    assert code == 1, drop
    assert drop["outcome"]["result"] == "dropped"
    rule = drop["outcome"]["rule"]
    assert (rule["policy"], rule["name"], rule["tier"], rule["action"]) == (
        "sec-drop-web", "no-web-from-x", "securityops", "Drop")
    assert rows(drop)[-1] == (40, "Drop")

    # Rejected by a logged rule: says what the Pod would get, but no RST is sent and nothing audited.
    code, rej = trace(cluster, "--from", "x/a", "--to", f"{yb.ip}", "--port", "81", "--source-port", "45001")
    assert code == 1, rej
    assert rej["outcome"]["result"] == "rejected" and rej["outcome"]["reply"] == "a TCP RST"
    assert rej["outcome"]["rule"]["policy"] == "reject-81"

    # Pass in the Antrea tier, then allowed by the K8s NetworkPolicy: both listed.
    code, passed = trace(cluster, "--from", "x/a", "--to", "y/c", "--port", "80")
    assert code == 0, passed
    decided = [(o["table"], o["action"], o["rule"]["policy"]) for o in passed["observations"] if "rule" in o]
    assert decided == [(40, "Pass", "pass-to-k8s"), (41, "Allow", "c-from-a")]

    # K8s isolation: after the Pass, no K8s rule allows port 81: the isolating policy is named.
    code, iso = trace(cluster, "--from", "x/a", "--to", "y/c", "--port", "81")
    assert code == 1, iso
    assert iso["outcome"]["result"] == "dropped"
    assert iso["outcome"]["rule"]["policy"] == "c-from-a" and iso["outcome"]["rule"]["namespace"] == "y"
    assert "isolated by NetworkPolicy y/c-from-a" in iso["outcome"]["detail"]

    # An IP no Pod has.
    code, unknown = trace(cluster, "--from", "x/a", "--to", "10.246.0.250")
    assert code == 1 and unknown["outcome"]["result"] == "unknown-destination", unknown
    assert unknown["to"]["pod"] is None

    # No trace packet reached y/b's interface, and no Reject answer reached x/a.
    seen_dst = dst_sniffer.stop()
    seen_src = src_sniffer.stop()
    assert [f for f in seen_dst if f["src"] == pods["x/a"].ip] == []
    assert [f for f in seen_src if f.get("flags", 0) & 0x04] == []
    # The sniffers do see real traffic (so the checks above can fail): a real probe and its RST.
    dst_sniffer, src_sniffer = sniff(yb), sniff(pods["x/a"])
    assert cluster.probe("x/a", [f"{yb.ip}:53/udp", f"{yb.ip}:81/tcp"]) == {
        f"{yb.ip}:53/udp": "connected", f"{yb.ip}:81/tcp": "refused"}
    assert any(f["src"] == pods["x/a"].ip and f.get("dport") == 53 for f in dst_sniffer.stop())
    assert any(f.get("flags", 0) & 0x04 for f in src_sniffer.stop())

    # The real Reject is audited; the traced one (source port 45001) is not.
    time.sleep(1.5)
    records = cluster.audit_records()
    assert any(r.get("destination", {}).get("port") == 81 for r in records), records
    assert not [r for r in records if r.get("source", {}).get("port") == 45001]
    # Nothing the traces sent was committed to conntrack.
    assert "45001" not in cluster.ovs_appctl("dpctl/dump-conntrack")

    # Usage errors and unknown Pods: exit 2, one line.
    res = _npaudit("trace", "--from", "x/nope", "--to", "y/b", "--config", str(cluster.config))
    assert res.returncode == 2 and res.stderr.decode().count("\n") == 1, res.stderr
    assert "no running Pod x/nope" in res.stderr.decode()


def test_two_concurrent_traces_each_get_their_own_answer(cluster: Cluster) -> None:
    setup(cluster)
    procs = {}
    for name, args in (("drop", ("--to", "y/b", "--port", "80")),
                       ("fwd", ("--to", "y/b", "--protocol", "udp", "--port", "53")),
                       ("pass", ("--to", "y/c", "--port", "80"))):
        procs[name] = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "trace", "--from", "x/a", *args,
                                        "-o", "json", "--config", str(cluster.config)], stdout=subprocess.PIPE)
    results = {name: (p.wait(60), json.loads(p.communicate()[0])) for name, p in procs.items()}
    assert results["drop"][0] == 1 and results["drop"][1]["outcome"]["rule"]["policy"] == "sec-drop-web"
    assert results["fwd"][0] == 0 and results["fwd"][1]["outcome"]["result"] == "delivered"
    assert results["pass"][0] == 0 and results["pass"][1]["outcome"]["result"] == "delivered"
    assert len({r[1]["tag"] for r in results.values()}) == 3
    # `npaudit status` counts them by outcome.
    res = _npaudit("status", "--config", str(cluster.config), "-o", "json", "--no-ebpf-probe")
    assert res.returncode == 0, res.stderr
    outcomes = json.loads(res.stdout)["traceflow"]["outcomes"]
    assert {k: n for k, n in outcomes.items() if n} == {"delivered": 2, "dropped": 1}
    table = _npaudit("status", "--config", str(cluster.config), "--no-ebpf-probe").stdout.decode()
    assert "3 traces since start: delivered 2, dropped 1;" in table, table


_METRICS = free_port()


@pytest.mark.cluster(metrics_listen=f"127.0.0.1:{_METRICS}")
def test_twenty_traces_complete_while_a_logged_drop_flood_saturates_the_policy_meter(cluster: Cluster) -> None:
    """The flood's packet-ins are read in paced batches (packetin/read_pacing.py); a trace's copies must not wait
    out a pause behind them: while a trace waits, the reads a pause would have followed are read on at once
    (npaudit_openflow_reads_urgent_total), and only then."""
    pods = setup(cluster)
    before = meter_drops(cluster, 2)
    urgent0 = agent_counts(_METRICS)["npaudit_openflow_reads_urgent_total"]
    flood = subprocess.Popen(["ip", "netns", "exec", pods["x/b"].netns, sys.executable, "-c", FLOOD,
                              pods["y/d"].ip, "12"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        outcomes = []
        for _ in range(20):
            code, res = trace(cluster, "--from", "x/a", "--to", "y/b", "--port", "80", "--timeout", "5")
            outcomes.append((code, res["outcome"]["result"], res["outcome"].get("rule", {}).get("name")))
        during = meter_drops(cluster, 2)
        urgent = agent_counts(_METRICS)["npaudit_openflow_reads_urgent_total"] - urgent0
    finally:
        flood.wait(30)
    assert outcomes == [(1, "dropped", "no-web-from-x")] * 20
    assert during - before > 1000, "the flood did not saturate the policy Drop meter"
    assert urgent > 0, "no read of the flood was kept from its pause while a trace waited for its copies"
    counts = agent_counts(_METRICS)
    time.sleep(1.0)  # no trace now: the flood is over, and nothing more is read on for a trace
    assert agent_counts(_METRICS)["npaudit_openflow_reads_urgent_total"] == counts["npaudit_openflow_reads_urgent_total"]
    assert counts["npaudit_openflow_reads_paced_total"] > 0, "the flood was never paced: the test proves nothing"
    records = cluster.audit_records()
    assert any(r.get("destination", {}).get("port") == 9 for r in records), "the flood was not audited"
    assert not [r for r in records if r.get("destination", {}).get("port") == 80]


def test_live_traces_follow_the_next_real_packet_which_is_still_forwarded_answered_and_audited(
        cluster: Cluster) -> None:
    pods = setup(cluster)
    yb = pods["y/b"]

    def live(target: str, *args: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        proc = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "trace", "--live", "--from", "x/a",
                                 "--to", "y/b", *args, "--timeout", "20", "-o", "json", "--config",
                                 str(cluster.config)], stdout=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 15
            while not any("priority=65000" in f for f in cluster.flows()):
                assert time.monotonic() < deadline and proc.poll() is None, "the live trace's flows never came"
                time.sleep(0.05)
            probe = cluster.probe("x/a", [target])
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, json.loads(out), probe

    code, dropped, probe = live(f"{yb.ip}:80/tcp", "--port", "80")
    assert probe == {f"{yb.ip}:80/tcp": "timeout"}
    assert code == 1 and dropped["live"] and isinstance(dropped["source_port"], int)
    assert dropped["outcome"]["rule"]["policy"] == "sec-drop-web"

    code, delivered, probe = live(f"{yb.ip}:53/udp", "--protocol", "udp", "--port", "53")
    assert probe == {f"{yb.ip}:53/udp": "connected"}  # the real packet was delivered (and answered)
    assert code == 0 and delivered["outcome"]["result"] == "delivered", delivered
    assert [o["table"] for o in delivered["observations"]][-2:] == [60, 70]

    code, rejected, probe = live(f"{yb.ip}:81/tcp", "--port", "81")
    assert probe == {f"{yb.ip}:81/tcp": "refused"}  # the agent answered the real packet
    assert code == 1 and rejected["outcome"]["result"] == "rejected"
    time.sleep(1.5)
    assert any(r.get("source", {}).get("port") == rejected["source_port"] for r in cluster.audit_records())
    deadline = time.monotonic() + 5
    while any("priority=65000" in f for f in cluster.flows()):
        assert time.monotonic() < deadline, "a live trace's flows stayed"
        time.sleep(0.05)
