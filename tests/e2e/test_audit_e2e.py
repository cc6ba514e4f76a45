"""Audit records end to end: real Pods, policies and traffic; the test asserts the exact records.

Modelled on Antrea's testAuditLoggingBasic and testAuditLoggingEnableK8s, on
our JSON: a tiered ClusterNetworkPolicy with logging and a log label, a
Kubernetes NetworkPolicy in a Namespace with logging enabled; TCP, UDP and
ping; every record validated against config/audit-record.schema.json, and the
file's hash chain verified.
"""

from __future__ import annotations

import subprocess
import sys

import jsonschema

from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import namespaces_and_pods
from tests.support.e2e_scenarios import POLICIES, SCHEMA, wait_records

def send_udp(cluster: Cluster, src: str, ip: str, port: int, count: int) -> None:
    code = (f"import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for i in range({count}):\n    s.sendto(b'audit%d' % i, ('{ip}', {port})); time.sleep(0.002)\n")
    subprocess.run(["ip", "netns", "exec", cluster.pods[src].netns, sys.executable, "-c", code], check=True)


def test_audit_records_name_policy_rule_tier_label_pods_and_count_exactly(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_pods(logging_ns="z"))
    xa = cluster.add_pod("x", "a", server=False)
    ya = cluster.add_pod("y", "a")
    za = cluster.add_pod("z", "a")
    yb = cluster.add_pod("y", "b", server=False)
    cluster.apply(POLICIES)

    assert cluster.probe("x/a", [f"{ya.ip}:80/tcp"]) == {f"{ya.ip}:80/tcp": "connected"}  # logged Allow
    send_udp(cluster, "x/a", ya.ip, 53, 50)  # 50 logged Drops of one flow
    assert cluster.probe("x/a", [f"{za.ip}:81/tcp"]) == {f"{za.ip}:81/tcp": "connected"}  # K8s allow, logged ns
    assert cluster.probe("y/b", [f"{za.ip}:80/tcp"], timeout=0.5) == {f"{za.ip}:80/tcp": "timeout"}  # K8s isolation
    ping = subprocess.run(["ip", "netns", "exec", xa.netns, "ping", "-c", "2", "-i", "0.2", "-W", "1", za.ip],
                          capture_output=True)
    assert ping.returncode == 0

    def udp_total(records: list[dict]) -> int:
        return sum(r["npaudit"]["aggregate"]["packets"] for r in records if r.get("labels", {}).get("log_label") == "sec-udp")

    records = wait_records(cluster, lambda rs: udp_total(rs) >= 50, timeout=6.0)
    for record in records:
        jsonschema.validate(record, SCHEMA)

    # The Allow: one record for the connection, everything named.
    web = [r for r in records if r.get("labels", {}).get("log_label") == "sec-web"]
    assert len(web) == 1
    w = web[0]
    assert w["event"]["action"] == "allowed" and w["npaudit"]["disposition"] == "Allow"
    assert w["rule"]["name"] == "allow-web-from-x" and w["rule"]["ruleset"] == "AntreaClusterNetworkPolicy:sec-audit"
    assert w["rule"]["category"] == "securityops" and w["network"]["direction"] == "ingress"
    assert w["network"]["transport"] == "tcp" and w["destination"] == {"ip": ya.ip, "port": 80}
    assert w["source"]["ip"] == xa.ip
    assert w["npaudit"]["source"]["pod"] == {"namespace": "x", "name": "a"}
    assert w["npaudit"]["destination"]["pod"] == {"namespace": "y", "name": "a"}
    assert w["npaudit"]["aggregate"]["packets"] == 1
    # ECS: the same facts where a SIEM looks for them.
    assert w["ecs"] == {"version": "8.11.0"} and w["event"]["dataset"] == "npaudit.audit"
    assert w["related"] == {"ip": [xa.ip, ya.ip]} and w["network"]["packets"] == 1
    assert w["event"]["start"] == w["event"]["end"] == w["@timestamp"]
    assert (w["observer"]["vendor"], w["observer"]["product"]) == ("npaudit project", "Open vSwitch")

    # The Drops: the first packet at once, the rest aggregated; counts sum exactly.
    udp = [r for r in records if r.get("labels", {}).get("log_label") == "sec-udp"]
    assert udp_total(records) == 50
    assert udp[0]["npaudit"]["aggregate"]["packets"] == 1 and len(udp) >= 2
    for r in udp:
        assert r["event"]["action"] == "dropped" and r["rule"]["name"] == "drop-udp-from-x"
        assert r["network"]["transport"] == "udp" and r["destination"] == {"ip": ya.ip, "port": 53}
        assert r["npaudit"]["source"]["pod"]["name"] == "a" and r["npaudit"]["destination"]["pod"]["namespace"] == "y"
        assert r["network"]["packets"] == r["npaudit"]["aggregate"]["packets"]
        assert (r["event"]["start"], r["event"]["end"]) == (r["npaudit"]["aggregate"]["first"],
                                                          r["npaudit"]["aggregate"]["last"])
    assert sum(r["network"]["packets"] for r in udp) == 50

    # The K8s NetworkPolicy in the logging-enabled Namespace: its allows and its isolation drop.
    k8s = [r for r in records if r.get("rule", {}).get("ruleset") == "K8sNetworkPolicy:z/z-from-x"]
    allowed_tcp = [r for r in k8s if r["event"]["action"] == "allowed" and r["network"]["transport"] == "tcp"]
    assert len(allowed_tcp) == 1 and allowed_tcp[0]["destination"]["port"] == 81
    icmp = [r for r in k8s if r["network"]["transport"] == "icmp"]
    assert len(icmp) == 1 and icmp[0]["npaudit"]["icmp"]["type"] == 8  # two pings, one connection
    isolated = [r for r in k8s if r["event"]["action"] == "dropped"]
    assert isolated and isolated[0]["rule"]["name"] == "default-isolation"
    assert isolated[0]["source"]["ip"] == yb.ip and isolated[0]["npaudit"]["source"]["pod"] == {"namespace": "y", "name": "b"}
    for r in records:
        assert r["@timestamp"].endswith("Z") and len(r["@timestamp"]) == len("2026-11-30T02:14:03.512Z")
        assert r["observer"]["hostname"]

    # The chain over the whole file verifies, and so does a copy jq re-encoded (as a SIEM pipeline would).
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "verify", str(cluster.dir / "audit")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    live = cluster.dir / "audit" / "audit.jsonl"
    copy = cluster.dir / "audit-copy.jsonl"
    copy.write_bytes(subprocess.run(["jq", "-c", "."], input=live.read_bytes(), capture_output=True,
                                    check=True).stdout)
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "verify", str(copy)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
