"""Storage configuration."""
from __future__ import annotations

from dataclasses import dataclass

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass
class StorageOptions:
    block_duration_ms: int = 2 * HOUR_MS  # head -> block cut, time-partitioned
    out_of_order_window_ms: int = 0  # 0 = out-of-order samples rejected (Prometheus default)
    retention_ms: int = 15 * DAY_MS  # measured from the newest sample, like Prometheus
    retention_bytes: int = 0  # 0 = no size limit
    wal_segment_bytes: int = 128 * 1024 * 1024
    wal_fsync: str = "always"  # "always" (fsync before ack) | "batch" (group commit) | "never"
    future_tolerance_ms: int = 10 * 60_000  # samples further in the future are rejected
