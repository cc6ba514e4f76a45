"""The audit trail: packet decode, records, aggregation, the chained file set and its writer, verify, query, syslog."""
