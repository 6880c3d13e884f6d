"""Ingest self-metrics (prometheus-client, default registry -> served on /metrics)."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SAMPLES = Counter("turboprom_ingest_samples", "Samples accepted by storage, by protocol", ["protocol"])
REJECTED = Counter("turboprom_ingest_rejected_samples", "Samples refused, by reason and protocol", ["reason", "protocol"])
REQUESTS = Counter("turboprom_ingest_requests", "Ingest HTTP requests by protocol and status code", ["protocol", "code"])
EXEMPLARS_DROPPED = Counter("turboprom_ingest_exemplars_dropped", "Exemplars received and not stored", ["protocol"])
IN_FLIGHT = Gauge("turboprom_ingest_in_flight_batches", "Batches queued or being appended to storage")
SINK_ERRORS = Counter("turboprom_ingest_sink_errors", "Exceptions raised by ingest sinks", ["sink"])
REQUEST_SECONDS = Histogram("turboprom_ingest_request_duration_seconds", "Ingest request handling time", ["protocol"],
                            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
SCRAPES = Counter("turboprom_scrapes", "Scrapes by job and outcome", ["job", "outcome"])
SCRAPE_GROUPS = Counter("turboprom_scrape_groups", "Groups of scrapes processed and appended together (one worker job, one append)")
SCRAPE_LAG = Counter("turboprom_scrapes_missed", "Scrapes that started later than one interval after the previous", ["job"])


def reject(protocol: str, reason: str, n: int) -> None:
    if n > 0:
        REJECTED.labels(reason=reason, protocol=protocol).inc(n)
REJECTED_REQUESTS = Counter("turboprom_ingest_rejected_requests", "Ingest requests refused, by reason and protocol", ["reason", "protocol"])
SINK_SKIPPED = Counter("turboprom_ingest_sink_skipped_batches",
                       "Batches not given to sinks because storage rejected or deduplicated part of them without saying which")
