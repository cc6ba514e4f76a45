"""Audit overload mode in the running agent on real OVS (root): a flood in which every packet is a new
audit key (a new UDP destination port each) into a logged Drop rule over a port range.

With small overload marks the agent coarsens (records without ports, marked
npaudit.aggregate.coarsened, covering many keys), its reader then hands packet-ins over in
groups (packetin/groups.py), and the counts stay exact: the
packets in records plus what the agent's admission dropped plus what ovs-vswitchd
lost before sending equal the packet-ins OVS emitted (its controller flows'
n_packets minus the meter bands' drops).
"""

from __future__ import annotations

import gzip
import json
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import Cluster
from tests.e2e.test_offload_e2e import NAMESPACES, pod_y
from tests.support.rsyslog import free_port
from tests.support.udp_flood import send_flood

FIRST_PORT, LAST_PORT = 1024, 65535
PORTS = LAST_PORT - FIRST_PORT + 1  # a new key per datagram for PORTS datagrams in a row

# The logged Drop: UDP from namespace x to y/a (app: web) on every port from FIRST_PORT.
POLICY = textwrap.dedent(f"""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {{name: new-key-flood}}
    spec:
      tier: securityops
      priority: 1
      appliedTo: [{{podSelector: {{matchLabels: {{app: web}}}}}}]
      ingress:
      - name: no-udp-range
        action: Drop
        enableLogging: true
        logLabel: flood
        from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
        ports: [{{protocol: UDP, port: {FIRST_PORT}, endPort: {LAST_PORT}}}]
""")
MANIFESTS = "---\n".join([NAMESPACES, pod_y("web"), POLICY])

def new_key_flood_cluster(*, meter_rate: int, overload: bool, queue_size: int = 65536,
                          marks: tuple[float, float, float] = (0.05, 0.25, 0.01)) -> Cluster:
    """A cluster (not started) for a new-key flood: the policy_deny meter at `meter_rate`, the
    policy category's token bucket wide open and its fair shares off (admission is policy, not
    capacity), no debug tap, overload mode on or off with marks (high, peers, low)."""
    port = free_port()
    cluster = Cluster(extra_config=f"meters:\n  policy_deny:\n    rate: {meter_rate}\n    burst: {meter_rate}\n",
                      metrics_listen=f"127.0.0.1:{port}")
    cluster.metrics_port = port  # type: ignore[attr-defined]
    cluster.config.write_text(cluster.config.read_text().replace(f"  tap: {cluster.tap}\n", "  tap: ''\n"))
    cluster.add_settings("packetin", f"policy: {{rate: 1000000000, burst: 1000000000, queue_size: {queue_size}}}\n"
                                     "fair_share: {enabled: false}\n")
    high, peers, low = marks
    cluster.add_settings("audit", "max_size_mb: 1024\n"
                                  f"overload: {{enabled: {str(overload).lower()}, high_mark: {high:.6f}, "
                                  f"peers_mark: {peers:.6f}, low_mark: {low:.6f}}}\n")
    return cluster


def start_flood_pods(cluster: Cluster) -> tuple[str, str]:
    """Applies MANIFESTS and adds x/a (the sender) and y/a (the target): (sender netns, target ip)."""
    cluster.apply(MANIFESTS)
    xa, ya = cluster.add_pod("x", "a", server=False), cluster.add_pod("y", "a", server=False)
    return xa.netns, ya.ip


def agent_counts(port: int) -> dict[str, float]:
    """Admission drops (every dropped_* outcome), OVS-side packet-in losses, queue depths, audit totals."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {"admission_dropped": 0.0, "ovs_lost": 0.0, "queued": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "npaudit_packetin_total" and s.labels["outcome"].startswith("dropped_"):
                out["admission_dropped"] += s.value
                out[s.labels["outcome"]] = out.get(s.labels["outcome"], 0.0) + s.value
            elif s.name == "npaudit_ovs_packetin_lost_total":
                out["ovs_lost"] += s.value
            elif s.name in ("npaudit_packetin_queue_depth", "npaudit_audit_writer_queue_depth"):
                out["queued"] += s.value
            elif s.name in ("npaudit_audit_packet_ins_total", "npaudit_audit_records_coarsened_total",
                            "npaudit_openflow_reads_pressed_total", "npaudit_openflow_packetins_grouped_total"):
                out[s.name] = s.value
    return out


def flood_records(audit_path: Path) -> dict[str, int]:
    """The flood's records over the live audit file and its rotations: records, packets, coarsened
    records and the packets in them (loss records, which state gaps, are not flow records)."""
    out = {"records": 0, "packets": 0, "coarsened_records": 0, "coarsened_packets": 0}
    for f in sorted(audit_path.parent.glob(audit_path.name + "*")):
        with (gzip.open(f, "rt") if f.suffix == ".gz" else open(f)) as fh:
            for line in fh:
                record = json.loads(line) if line.strip() else {}
                if record.get("labels", {}).get("log_label") != "flood":
                    continue
                agg = record["npaudit"]["aggregate"]
                out["records"] += 1
                out["packets"] += agg["packets"]
                if agg.get("coarsened"):
                    out["coarsened_records"] += 1
                    out["coarsened_packets"] += agg["packets"]
    return out


def settled(cluster: Cluster, timeout: float = 60.0) -> tuple[dict[str, float], dict[str, int]]:
    """(agent counts, flood records) once the queues are empty and neither changed for 2.5 s
    (longer than an aggregation window, so every window is closed and written)."""
    port, path = cluster.metrics_port, cluster.dir / "audit" / "audit.jsonl"  # type: ignore[attr-defined]
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        now = (agent_counts(port), flood_records(path))
        if now[0]["queued"] or now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 2.5:
            break
        time.sleep(0.25)
    return last or (agent_counts(port), flood_records(path))


@pytest.fixture
def small_marks() -> Iterator[Cluster]:
    # A small policy queue and low marks: the agent coarsens as soon as a few hundred packet-ins wait.
    c = new_key_flood_cluster(meter_rate=30000, overload=True, queue_size=4096, marks=(0.02, 0.5, 0.005))
    try:
        c.start(timeout=120)
        yield c
    finally:
        c.close()


def test_a_new_key_flood_coarsens_records_and_every_packet_in_ovs_emitted_is_accounted(small_marks) -> None:
    cluster = small_marks
    netns, ip = start_flood_pods(cluster)
    counts0, records0 = settled(cluster)
    flows0, meter0 = cluster.controller_flow_packets(), cluster.meter_band_drops()
    sent = send_flood(netns, ip, 3.0, port=FIRST_PORT, ports=PORTS)
    counts1, records1 = settled(cluster)
    emitted = (cluster.controller_flow_packets() - flows0) - (cluster.meter_band_drops() - meter0)
    in_records = records1["packets"] - records0["packets"]
    admission = int(counts1["admission_dropped"] - counts0["admission_dropped"])
    ovs_lost = int(counts1["ovs_lost"] - counts0["ovs_lost"])
    print(f"sent {sent}, OVS emitted {emitted}: {in_records} in {records1['records']} records "
          f"({records1['coarsened_records']} coarsened), admission {admission}, lost in OVS {ovs_lost}")
    assert emitted > 10_000, "the flood did not reach the controller"
    assert records1["coarsened_records"] > 0, "overload never engaged"
    assert records1["records"] < in_records, "coarsened records cover several keys each"
    grouped = counts1.get("npaudit_openflow_packetins_grouped_total", 0) - counts0.get(
        "npaudit_openflow_packetins_grouped_total", 0)
    assert grouped > 0, "in overload the reader hands packet-ins over in groups"
    assert in_records + admission + ovs_lost == emitted
