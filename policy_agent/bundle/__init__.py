"""The support bundle (`npaudit bundle`): what it collects, its redaction, and the tar.gz it writes."""
