"""Query errors, typed like Prometheus's API error types."""
from __future__ import annotations


class PromQLError(Exception):
    error_type = "execution"  # Prometheus API errorType
    http_status = 422


class BadData(PromQLError):
    """Parse errors and invalid parameters (HTTP 400, errorType bad_data)."""

    error_type = "bad_data"
    http_status = 400


class ExecutionError(PromQLError):
    """Runtime evaluation errors, e.g. many-to-many matching (HTTP 422, errorType execution)."""

    error_type = "execution"
    http_status = 422


class QueryTimeout(PromQLError):
    error_type = "timeout"
    http_status = 503


class QueryCanceled(PromQLError):
    error_type = "canceled"
    http_status = 503


class TooManySamples(ExecutionError):
    def __init__(self) -> None:
        super().__init__("query processing would load too many samples into memory in query execution")
