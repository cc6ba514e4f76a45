"""Audit log pipeline: record model, enrichment, aggregation, writers, syslog (issue 4)."""
