"""The metrics of a live agent after real traffic: the verdict counter equals the audit records by disposition,
the latency histogram counts the records written at once, and the scrape passes `promtool check metrics`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import namespaces_and_pods, wait_records
from tests.support.ports import free_port
from tests.support.promtool import check_metrics, promtool  # noqa: F401 (fixture: the binary)

# A tiered policy with a logged rule of each verdict, and a logged Kubernetes isolation in z (no tier).
POLICIES = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: verdicts}
    spec:
      tier: securityops
      priority: 3
      appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
      ingress:
      - {name: drop-udp, action: Drop, enableLogging: true, ports: [{protocol: UDP, port: 53}],
         from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]}
      - {name: allow-web, action: Allow, enableLogging: true, ports: [{protocol: TCP, port: 80}],
         from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]}
      - {name: reject-81, action: Reject, enableLogging: true, ports: [{protocol: TCP, port: 81}],
         from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]}
    ---
    apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: z-nothing-in, namespace: z}
    spec:
      podSelector: {}
      policyTypes: [Ingress]
""")
UDP_PACKETS = 40


@pytest.fixture
def live() -> Iterator[tuple[Cluster, int]]:
    port = free_port()
    c = Cluster(metrics_listen=f"127.0.0.1:{port}")
    try:
        c.start()
        yield c, port
    finally:
        c.close()


def scrape(port: int) -> bytes:
    body: bytes = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return body


def verdicts_and_latency(body: bytes) -> tuple[Counter[str], dict[tuple[str, str, str], float], float]:
    """(verdict count by disposition, by (disposition, direction, tier), latency observations)."""
    by_disposition: Counter[str] = Counter()
    by_labels: dict[tuple[str, str, str], float] = {}
    observed = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "npaudit_policy_verdicts_total":
                by_disposition[s.labels["disposition"]] += int(s.value)
                by_labels[(s.labels["disposition"], s.labels["direction"], s.labels["tier"])] = s.value
            elif s.name == "npaudit_audit_record_latency_seconds_count":
                observed = s.value
    return by_disposition, by_labels, observed


def test_the_verdict_counter_equals_the_records_by_disposition_after_real_traffic(
        live: tuple[Cluster, int], promtool: Path) -> None:  # noqa: F811 (the imported fixture)
    cluster, port = live
    cluster.apply(namespaces_and_pods(logging_ns="z"))
    cluster.add_pod("x", "a", server=False)
    ya = cluster.add_pod("y", "a")
    za = cluster.add_pod("z", "a")
    cluster.apply(POLICIES)

    assert cluster.probe("x/a", [f"{ya.ip}:80/tcp"]) == {f"{ya.ip}:80/tcp": "connected"}     # Allow
    assert cluster.probe("x/a", [f"{ya.ip}:81/tcp"]) == {f"{ya.ip}:81/tcp": "refused"}       # Reject
    assert cluster.probe("x/a", [f"{za.ip}:80/tcp"], timeout=0.5) == {f"{za.ip}:80/tcp": "timeout"}  # K8s Drop
    code = (f"import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for i in range({UDP_PACKETS}):\n    s.sendto(b'v%d' % i, ('{ya.ip}', 53)); time.sleep(0.002)\n")
    subprocess.run(["ip", "netns", "exec", cluster.pods["x/a"].netns, sys.executable, "-c", code], check=True)

    def udp_packets(records: list[dict]) -> int:
        return sum(r["npaudit"]["aggregate"]["packets"] for r in records
                   if r.get("rule", {}).get("name") == "drop-udp")

    records = wait_records(cluster, lambda rs: udp_packets(rs) >= UDP_PACKETS, timeout=30.0)
    assert udp_packets(records) == UDP_PACKETS
    # The file is complete for this traffic; the counter counts a record once it is in the file.
    deadline = time.monotonic() + 30
    while True:
        records = [r for r in cluster.audit_records() if "disposition" in r.get("npaudit", {})]
        body = scrape(port)
        by_disposition, by_labels, observed = verdicts_and_latency(body)
        expected = Counter(r["npaudit"]["disposition"] for r in records)
        if by_disposition == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert by_disposition == expected
    assert {"Allow", "Drop", "Reject"} <= set(expected)
    assert by_labels == dict(Counter((r["npaudit"]["disposition"], r["network"].get("direction", ""),
                                      r.get("rule", {}).get("category", "")) for r in records))
    assert by_labels[("Reject", "ingress", "securityops")] >= 1
    assert any(d == "Drop" and tier == "" for d, _, tier in by_labels)  # the Kubernetes isolation: no tier
    # Records written at once: every Allow and Reject, and each flow's first Drop record; never more than all.
    assert expected["Allow"] + expected["Reject"] + 2 <= observed <= sum(expected.values())

    result = check_metrics(promtool, body)
    assert result.returncode == 0, result.stdout + result.stderr
