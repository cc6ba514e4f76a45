"""Varied audit records for `npaudit logs` tests and its bench, written with the real AuditWriter."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

from auditlog.chain import RecordText
from auditlog.writer import AuditWriter

T0 = 1714529643.5  # 2024-05-01T02:14:03.500Z
NAMESPACES = ("frontend", "backend", "kube-system")
DISPOSITIONS = ("Allow", "Drop", "Reject", "Pass")
ACTIONS = {"Allow": "allowed", "Drop": "dropped", "Reject": "rejected", "Pass": "passed"}
PROTOCOLS = (("tcp", "6"), ("udp", "17"), ("icmp", "1"))


def stamp(t: float) -> str:
    ms = round(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def sample_record(i: int, *, t0: float = T0, step: float = 1.0) -> dict[str, Any]:
    """Record i: the fields vary with i by different moduli, so filters select different subsets."""
    disposition = DISPOSITIONS[i % 4]
    transport, number = PROTOCOLS[i % 3]
    src_ns, dst_ns = NAMESPACES[i % 3], NAMESPACES[(i // 3) % 3]
    src_ip = f"10.244.{i % 2}.{i % 7 + 2}" if i % 11 else f"fd00::{i % 7 + 2:x}"
    dst_ip = f"10.96.{i % 5}.{10 + i % 3}" if i % 11 else "fd00::99"
    record: dict[str, Any] = {
        "@timestamp": stamp(t0 + i * step),
        "event": {"action": ACTIONS[disposition], "kind": "event"},
        "source": {"ip": src_ip, "port": 40000 + i % 50},
        "destination": {"ip": dst_ip, "port": (80, 443, 53, 5432)[i % 4]},
        "network": {"transport": transport, "iana_number": number,
                    "direction": ("ingress", "egress")[(i // 2) % 2]},
        "rule": {"name": f"rule-{i % 3}", "id": str(100 + i % 3),
                 "ruleset": ("AntreaClusterNetworkPolicy:deny-all", f"NetworkPolicy:{dst_ns}/allow-web",
                             "AntreaNetworkPolicy:backend/db-guard")[i % 3],
                 "category": ("securityops", "application", "baseline")[(i // 4) % 3]},
        "observer": {"hostname": ("node-a", "node-b")[i % 2]},
        "npaudit": {"aggregate": {"packets": 1 + i % 9, "bytes": 60 * (1 + i % 9)},
                    "disposition": disposition,
                    "source": {"pod": {"namespace": src_ns, "name": f"client-{i % 4}-7d9f"}},
                    "destination": {"pod": {"namespace": dst_ns, "name": ("db-0", "web-5c", "dns-x")[i % 3]}}},
    }
    if i % 6 == 5:
        del record["npaudit"]["destination"]  # an address outside the cluster
    if i % 2:
        record["labels"] = {"log_label": ("audit-a", "audit-b")[i % 4 // 2]}
    return record


def write_set(live: Path, records: Iterable[dict[str, Any]], *, max_bytes: int, backup_count: int = 1000,
              compress: bool = True) -> None:
    """Write `records` with the real writer (rotating at `max_bytes`) and wait for its gzip thread."""
    writer = AuditWriter(live, max_bytes=max_bytes, backup_count=backup_count, max_age_days=0,
                         queue_size=1 << 20, compress=compress)
    writer.start()
    try:
        for record in records:
            if not writer.submit(RecordText.of(record)):
                raise RuntimeError("audit writer queue full")
        writer.flush_wait(60)
        if compress:
            writer.wait_compressed(60)
    finally:
        writer.close(60)
