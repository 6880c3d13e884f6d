"""Errors the ingest paths raise; routes map them to HTTP answers."""
from __future__ import annotations


class IngestError(Exception):
    """A request that is refused as a whole. ``reason`` keys the rejection counters."""

    def __init__(self, reason: str, message: str, status: int = 400, samples: int = 0):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status
        self.samples = samples  # how many samples the refused request held (for counters), if known


class Overloaded(IngestError):
    """The bounded in-flight queue is full: the sender should back off and retry (429)."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__("overloaded", message, status=429)
        self.retry_after_s = retry_after_s
