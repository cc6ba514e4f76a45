"""The one exception base for everything the audit log package raises."""

from __future__ import annotations


class AuditLogError(Exception):
    """Base class for auditlog errors (chain breaks, writer set-up, forwarding)."""
