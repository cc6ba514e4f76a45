"""An Antrea ClusterNetworkPolicy matching ICMP by type (`protocols`): ping dropped, TCP untouched, audited."""

from __future__ import annotations

import subprocess
import textwrap

from tests.support.cluster import Cluster, PodHandle
from tests.support.e2e_scenarios import wait_records
from tests.support.e2e_scenarios import namespaces_and_pods

DROP_PING = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: no-ping-from-x-a}
    spec:
      tier: securityops
      priority: 2
      appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress:
      - name: drop-echo-from-x-a
        action: Drop
        enableLogging: true
        logLabel: no-ping
        from: [{podSelector: {matchLabels: {pod: a}},
                 namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
        protocols: [{icmp: {icmpType: 8}}]
""")


def ping(src: PodHandle, ip: str) -> bool:
    res = subprocess.run(["ip", "netns", "exec", src.netns, "ping", "-c", "2", "-i", "0.2", "-W", "1", ip],
                         capture_output=True)
    return res.returncode == 0


def test_an_icmp_echo_drop_stops_ping_from_one_pod_only_and_is_audited(cluster: Cluster) -> None:
    cluster.apply(namespaces_and_pods(logging_ns=""))
    xa = cluster.add_pod("x", "a", server=False)
    xb = cluster.add_pod("x", "b", server=False)
    ya = cluster.add_pod("y", "a")
    assert ping(xa, ya.ip)  # reachable before the policy
    cluster.apply(DROP_PING)

    assert not ping(xa, ya.ip)
    assert cluster.probe("x/a", [f"{ya.ip}:80/tcp"]) == {f"{ya.ip}:80/tcp": "connected"}  # TCP unaffected
    assert ping(xb, ya.ip)  # another Pod still pings

    def dropped(records: list[dict]) -> list[dict]:
        return [r for r in records if r.get("labels", {}).get("log_label") == "no-ping"]

    records = dropped(wait_records(cluster, lambda rs: bool(dropped(rs))))
    assert records, "no audit record for the dropped ping"
    for r in records:
        assert r["event"]["action"] == "dropped" and r["npaudit"]["disposition"] == "Drop"
        assert r["rule"]["name"] == "drop-echo-from-x-a"
        assert r["rule"]["ruleset"] == "AntreaClusterNetworkPolicy:no-ping-from-x-a"
        assert r["network"]["transport"] == "icmp" and r["npaudit"]["icmp"]["type"] == 8
        assert r["source"]["ip"] == xa.ip and r["destination"]["ip"] == ya.ip
    assert sum(r["npaudit"]["aggregate"]["packets"] for r in records) <= 2
