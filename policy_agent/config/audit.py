"""The `audit:` config section: the audit log writer."""

from __future__ import annotations

from dataclasses import dataclass, field

from policy_agent.config.checks import QUEUE_MAX, bounded, checked, file_path
from policy_agent.config.overload import OverloadConfig


@dataclass(frozen=True)
class AuditConfig:
    # Write policy audit records (category 0 packet-ins) as JSON lines.
    enabled: bool = True
    path: str = field(default="/var/log/npaudit/audit.jsonl", metadata=checked(file_path))
    # Size rotation (MiB, at most 1048576 = 1 TiB), gzip of rotated files, keep this many
    # (at most 10000) and this many days (at most 36500).
    max_size_mb: int = field(default=100, metadata=checked(bounded(1, 1 << 20)))
    backups: int = field(default=10, metadata=checked(bounded(1, 10_000)))
    max_age_days: int = field(default=28, metadata=checked(bounded(1, 36_500)))
    # Aggregation window in seconds for Drop/Reject/Pass (0 = a record per packet).
    window: float = field(default=1.0, metadata=checked(lambda v: None if v >= 0 else f"must be >= 0, got {v}"))
    # Records waiting for the writer thread (at most 10,000,000); a full queue drops and counts.
    queue_size: int = field(default=100000, metadata=checked(bounded(1, QUEUE_MAX)))
    # A read's records, or a lone record at a low rate, are written by the event loop itself (no
    # writer-thread wake-up: less CPU and latency); false: always the writer thread. Off by itself on NFS, CIFS, Ceph,
    # FUSE and other filesystems whose writes can block while a server is away.
    inline_writes: bool = True
    overload: OverloadConfig = OverloadConfig()  # coarser records under load (config/overload.py)
