"""Storage self-metrics (prometheus-client, default registry). Defined once per process."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

APPENDED = Counter("turboprom_storage_appended_samples_total", "Samples accepted into the head (WAL written).")
DUPLICATES = Counter("turboprom_storage_duplicate_samples_total", "Samples identical to a stored one (idempotent, not stored twice).")
REJECTED = Counter("turboprom_storage_rejected_samples_total", "Samples rejected on append, by reason.", ["reason"])
HEAD_SERIES = Gauge("turboprom_storage_head_series", "Series with samples in the head.")
HEAD_SAMPLES = Gauge("turboprom_storage_head_samples", "Samples in the head.")
SERIES_CREATED = Counter("turboprom_storage_series_created_total", "Series ids created.")
BLOCKS = Gauge("turboprom_storage_blocks", "Persisted blocks.")
UNREADABLE_BLOCKS = Gauge("turboprom_storage_unreadable_blocks", "Block directories skipped at start-up because they could not be read (their samples are missing from queries).")
BLOCK_BYTES = Gauge("turboprom_storage_blocks_bytes", "Bytes of persisted blocks on disk.")
BLOCKS_WRITTEN = Counter("turboprom_storage_blocks_written_total", "Blocks written from the head.")
COMPACTIONS = Counter("turboprom_storage_compactions_total", "Block compactions completed.")
COMPACTION_FAILURES = Counter("turboprom_storage_compaction_failures_total", "Block compactions or head cuts that failed.")
RETENTION_DELETED = Counter("turboprom_storage_retention_deleted_blocks_total", "Blocks deleted by retention.", ["reason"])
WAL_FSYNC = Histogram("turboprom_storage_wal_fsync_seconds", "WAL fsync latency.",
                      buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
WAL_BYTES = Counter("turboprom_storage_wal_written_bytes_total", "Bytes written to the WAL.")
WAL_CORRUPTIONS = Counter("turboprom_storage_wal_corruptions_total", "Torn or corrupt WAL tails truncated on replay.")
WAL_REPLAY_SECONDS = Gauge("turboprom_storage_wal_replay_seconds", "Duration of the last WAL replay.")
