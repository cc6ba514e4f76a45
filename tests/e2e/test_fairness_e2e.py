"""Fair shares end to end: one Pod floods a logged Drop rule at full speed while five quiet
Pods open a few connections hit by logged rules; every quiet connection is in the log.

The OVS meters are set far above what OVS can emit here, so the agent's admission (the
policy category's token bucket, tier 2) is the limit the flood meets: this test is about
that tier. Per-rule fair OVS meters (meters.per_rule, off here) are tested in test_fair_meters_e2e.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from typing import Iterator

import pytest

from tests.support.cluster import Cluster

QUIET = 5

MANIFESTS = "---\n".join(
    [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    kubernetes.io/metadata.name: {ns}\n"
     for ns in ("flood", "quiet", "target")]
    + [f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    pod: {name}\n"
       for ns, name in [("flood", "f"), ("target", "t")] + [("quiet", f"q{i}") for i in range(QUIET)]]
) + textwrap.dedent("""
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: fair-audit}
    spec:
      tier: securityops
      priority: 3
      appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: target}}}]
      ingress:
      - name: drop-flood
        action: Drop
        enableLogging: true
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: flood}}}]
        ports: [{protocol: UDP, port: 53}]
      - name: allow-web
        action: Allow
        enableLogging: true
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: quiet}}}]
        ports: [{protocol: TCP, port: 80}]
      - name: drop-81
        action: Drop
        enableLogging: true
        from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: quiet}}}]
        ports: [{protocol: TCP, port: 81}]
""")

# Full speed: no pacing, one port, until the deadline.
FLOOD = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dst, end, n = (sys.argv[1], 53), time.time() + float(sys.argv[2]), 0
while time.time() < end:
    for _ in range(200):
        try:
            s.sendto(b"flood", dst); n += 1
        except OSError:
            pass
print(n, flush=True)
"""


@pytest.fixture
def small_budget_cluster() -> Iterator[Cluster]:
    """The agent with a small policy-category budget (300 packet-ins/s) and meters out of the way."""
    c = Cluster()
    text = c.config.read_text().replace(
        "packetin:\n", "packetin:\n  policy: {rate: 300, burst: 300}\n")
    c.config.write_text(text + "meters:\n  policy_allow: {rate: 1000000, burst: 1000000}\n"
                               "  policy_deny: {rate: 1000000, burst: 1000000}\n")
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_a_flooding_pod_does_not_starve_quiet_pods_of_their_audit_records(small_budget_cluster: Cluster) -> None:
    cluster = small_budget_cluster
    cluster.apply(MANIFESTS)
    flood = cluster.add_pod("flood", "f", server=False)
    target = cluster.add_pod("target", "t")
    quiet = [cluster.add_pod("quiet", f"q{i}", server=False) for i in range(QUIET)]

    sender = subprocess.Popen(["ip", "netns", "exec", flood.netns, sys.executable, "-c", FLOOD, target.ip, "8"],
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)  # the flood is in full swing and has used up the category's burst
        # Each quiet Pod: one allowed connection (port 80) and one dropped (81, SYN retried), at once.
        outcomes = cluster.probe_concurrently(
            {pod.ref: [f"{target.ip}:80/tcp", f"{target.ip}:81/tcp"] for pod in quiet}, timeout=2.5)
    finally:
        sent = int((sender.communicate(timeout=30)[0] or "0").strip() or 0)
    for pod in quiet:
        assert outcomes[pod.ref] == {f"{target.ip}:80/tcp": "connected", f"{target.ip}:81/tcp": "timeout"}

    def missing(records: list[dict]) -> list[str]:
        seen = {(r.get("source", {}).get("ip"), r.get("destination", {}).get("port"), r["event"]["action"])
                for r in records}
        return [f"{pod.ref}->{port} {action}" for pod in quiet for port, action in ((80, "allowed"), (81, "dropped"))
                if (pod.ip, port, action) not in seen]

    deadline = time.monotonic() + 10
    records = cluster.audit_records()
    while missing(records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = cluster.audit_records()
    flood_packets = sum(r["npaudit"]["aggregate"]["packets"] for r in records
                        if r.get("rule", {}).get("name") == "drop-flood")
    # The flood really was a flood, far above the category's 300/s, and it was logged too.
    assert sent > 20 * 300, sent
    assert flood_packets > 0
    assert missing(records) == [], (f"quiet connections missing from the log (flood sent {sent}, "
                                    f"{flood_packets} in records)")
