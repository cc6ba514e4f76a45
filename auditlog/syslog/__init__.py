"""RFC 5424 syslog forwarding of the audit JSONL files (UDP, TCP, TLS; at-least-once via a checkpoint)."""
