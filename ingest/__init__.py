"""ingest stage (see ../shared/DESIGN.md)."""
