"""A cluster flooded with a new flow key per datagram, and when its counts have settled, shared by
the overload e2e tests and bench."""

from __future__ import annotations

import gzip
import json
import textwrap
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import Cluster
from tests.support.offload_scenario import NAMESPACES, pod_y
from tests.support.ports import free_port

FIRST_PORT, LAST_PORT = 1024, 65535
PORTS = LAST_PORT - FIRST_PORT + 1  # a new key per datagram for PORTS datagrams in a row


def new_key_flood_cluster(*, meter_rate: int, overload: bool, queue_size: int = 65536,
                          marks: tuple[float, float, float] = (0.05, 0.25, 0.01), fair_share: bool = False,
                          rotate_mb: int = 1024, syslog_url: str = "") -> Cluster:
    """A cluster (not started) for a new-key flood: the policy_deny meter at `meter_rate`, the
    policy category's token bucket wide open and its fair shares off unless `fair_share` (admission is
    policy, not capacity), no debug tap, overload mode on or off with marks (high, peers, low). The
    audit file rotates (and the rotated file is gzipped) every `rotate_mb` MiB, with every rotated
    file kept, so the flood's records can all be counted. `syslog_url`: a syslog destination every record is
    forwarded to, as the agent forwards by default (a child process)."""
    port = free_port()
    syslog = f"syslog:\n  destinations:\n    - url: {syslog_url}\n" if syslog_url else ""
    cluster = Cluster(extra_config=f"meters:\n  policy_deny:\n    rate: {meter_rate}\n    burst: {meter_rate}\n"
                                   + syslog, metrics_listen=f"127.0.0.1:{port}")
    cluster.metrics_port = port  # type: ignore[attr-defined]
    cluster.config.write_text(cluster.config.read_text().replace(f"  tap: {cluster.tap}\n", "  tap: ''\n"))
    cluster.add_settings("packetin", f"policy: {{rate: 1000000000, burst: 1000000000, queue_size: {queue_size}}}\n"
                                     f"fair_share: {{enabled: {str(fair_share).lower()}}}\n")
    high, peers, low = marks
    cluster.add_settings("audit", f"max_size_mb: {rotate_mb}\nbackups: 10000\n"
                                  f"overload: {{enabled: {str(overload).lower()}, high_mark: {high:.6f}, "
                                  f"peers_mark: {peers:.6f}, low_mark: {low:.6f}}}\n")
    return cluster


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
            elif s.name == "npaudit_audit_writer_total" and s.labels["event"] in ("rotations", "compressed"):
                out["audit_files_" + s.labels["event"]] = s.value
            elif s.name in ("npaudit_audit_packet_ins_total", "npaudit_audit_records_coarsened_total",
                            "npaudit_openflow_reads_pressed_total", "npaudit_openflow_packetins_grouped_total",
                            "npaudit_openflow_reads_total", "npaudit_openflow_reads_paced_total",
                            "npaudit_openflow_reads_urgent_total", "npaudit_openflow_reads_lone_total",
                            "npaudit_openflow_reads_quiet_total",
                            "npaudit_audit_records_early_total",
                            "npaudit_audit_overload_entered_total", "npaudit_audit_overload_entered_pressed_total"):
                out[s.name] = s.value
    return out


def flood_records(audit_path: Path) -> dict[str, int]:
    """The flood's records over the live audit file and its rotations: records, packets, coarsened
    records and the packets in them (loss records, which state gaps, are not flow records)."""
    for _ in range(20):
        try:
            return _flood_records(audit_path)
        except FileNotFoundError:  # the compressor turned a rotated file into .gz since the glob: count again
            time.sleep(0.05)
    return _flood_records(audit_path)


def _flood_records(audit_path: Path) -> dict[str, int]:
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


def start_flood_pods(cluster: Cluster) -> tuple[str, str]:
    """Applies MANIFESTS and adds x/a (the sender) and y/a (the target): (sender netns, target ip)."""
    cluster.apply(MANIFESTS)
    xa, ya = cluster.add_pod("x", "a", server=False), cluster.add_pod("y", "a", server=False)
    return xa.netns, ya.ip
