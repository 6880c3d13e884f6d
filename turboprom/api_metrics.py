"""Self-metrics of the Prometheus HTTP API (exposed on /metrics through prometheus-client)."""
from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter("turboprom_api_requests", "Prometheus-API HTTP requests by route and status code", ["handler", "code"])
DURATION = Histogram(
    "turboprom_api_request_duration_seconds",
    "Prometheus-API request latency by route (parameters, evaluation and JSON encoding)",
    ["handler"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
RESPONSE_BYTES = Counter("turboprom_api_response_bytes", "Bytes of Prometheus-API response bodies by route", ["handler"])
