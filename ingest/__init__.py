"""Log-format ingestors, run discovery and the ingest pipeline."""
