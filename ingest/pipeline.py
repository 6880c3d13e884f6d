"""Ingest pipeline: every ingest path hands its SampleBatch here.

``submit`` appends to storage in a worker thread (never on the event loop), with a bounded
number of batches in flight: when full it raises ``Overloaded`` (routes answer 429 with
Retry-After). A request takes its slot only once its body is fully received (a slow upload holds
no slot); bodies still being received are bounded by the bytes they hold (``read_budget``). After storage answers, each sink's ``consume(batch)`` receives the samples storage
accepted (sinks: summarizer, congestion tracker, ...; ingest does not know them).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Executor
from typing import Any, Protocol

import numpy as np

from ingest import metrics
from ingest.errors import Overloaded
from storage.batch import SampleBatch
from storage.interface import AppendResult

log = logging.getLogger("turboprom.ingest")


class Sink(Protocol):
    def consume(self, batch: SampleBatch) -> None: ...


def accepted_part(batch: SampleBatch, result: AppendResult) -> SampleBatch | None:
    """The samples storage took. Needs ``result.accepted_mask`` (bool per sample) when some were
    rejected or were duplicates; without it such a batch cannot be split and sinks skip it."""
    if result.series_ids is not None:
        batch.series_ids = result.series_ids
    if result.rejected_total == 0 and not result.duplicates:
        return batch
    mask = getattr(result, "accepted_mask", None)
    if mask is None:
        # Without a per-sample answer we cannot tell which samples were taken: a sink must not
        # count re-sent duplicates twice, so the batch is skipped (and counted).
        metrics.SINK_SKIPPED.inc()
        return None
    mask = np.asarray(mask, bool)
    if mask.all():
        return batch
    if not mask.any():
        return None
    return SampleBatch(batch.series, batch.series_index[mask], batch.timestamps[mask], batch.values[mask],
                       metadata=batch.metadata, tenant=batch.tenant, series_ids=batch.series_ids)


# Known fields of ``ingest:`` in the server YAML (checked by turboprom/config.py). max_body_bytes,
# max_decompressed_bytes and overload_status are read by turboprom/routes/ingest_api.py.
CONFIG_FIELDS: dict[str, Any] = {
    "max_queue": "int", "max_reading_bytes": "int", "max_body_bytes": "int", "max_decompressed_bytes": "int",
    "overload_status": ("=429", "=503"),
    "scrape_group_window": "duration",  # read by the scraper (ingest/scrape/groups.py)
}


class IngestPipeline:
    def __init__(self, storage: Any, *, max_queue: int = 64, tenant_default: str = "default",
                 executor: Executor | None = None, metadata: Any = None, max_reading_bytes: int = 256 * 1024 * 1024):
        self.storage = storage
        self.max_queue = max_queue
        self.max_reading_bytes = max_reading_bytes
        self._reading_bytes = 0
        self.tenant_default = tenant_default
        self.executor = executor
        self.metadata = metadata  # ingest.metadata_store.MetadataStore or None
        self.sinks: list[Sink] = []
        # Tenants whose samples reach the sinks (None = all). The server sets it to the default tenant:
        # summaries and congestion signals are the operator's and never mix tenants.
        self.sink_tenants: frozenset[str] | None = None
        self._in_flight = 0
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, storage: Any, raw: dict, *, executor: Executor | None = None, metadata: Any = None) -> "IngestPipeline":
        """``ingest: {max_queue: N, max_reading_bytes: B}`` in the server YAML (default 64 batches in
        flight, 256 MiB of request bodies being received)."""
        section = raw.get("ingest") if isinstance(raw.get("ingest"), dict) else {}
        return cls(storage, max_queue=int(section.get("max_queue", 64)), executor=executor, metadata=metadata,
                   max_reading_bytes=int(section.get("max_reading_bytes", 256 * 1024 * 1024)))

    def add_sink(self, sink: Sink) -> None:
        self.sinks.append(sink)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def overloaded(self) -> bool:
        return self._in_flight >= self.max_queue

    def _reserve(self) -> None:
        with self._lock:
            if self._in_flight >= self.max_queue:
                raise Overloaded(f"ingest queue full ({self.max_queue} batches in flight); retry later")
            self._in_flight += 1
            metrics.IN_FLIGHT.set(self._in_flight)

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1
            metrics.IN_FLIGHT.set(self._in_flight)

    @property
    def reading_bytes(self) -> int:
        return self._reading_bytes

    def take_read_bytes(self, n: int) -> None:
        """Account ``n`` more bytes of request bodies being received (Overloaded when over budget)."""
        with self._lock:
            if self._reading_bytes + n > self.max_reading_bytes:
                raise Overloaded(f"ingest bodies being received hold {self._reading_bytes} bytes "
                                 f"(limit {self.max_reading_bytes}); retry later")
            self._reading_bytes += n

    def give_read_bytes(self, n: int) -> None:
        with self._lock:
            self._reading_bytes -= n

    @contextlib.contextmanager
    def slot(self):
        """Hold one in-flight slot for a received request (decode, append): raises Overloaded
        when none is free. ``submit(batch, reserved=True)`` inside it does not take another."""
        self._reserve()
        try:
            yield
        finally:
            self._release()

    async def submit(self, batch: SampleBatch, *, reserved: bool = False) -> AppendResult:
        if not reserved:
            self._reserve()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, self.append_sync, batch)
        finally:
            if not reserved:
                self._release()

    def submit_sync(self, batch: SampleBatch) -> AppendResult:
        """For callers already in a worker thread (scraper parse threads)."""
        self._reserve()
        try:
            return self.append_sync(batch)
        finally:
            self._release()

    def append_sync(self, batch: SampleBatch) -> AppendResult:
        if not batch.tenant:
            batch.tenant = self.tenant_default
        if batch.metadata and self.metadata is not None:
            self.metadata.update(batch.metadata, tenant=batch.tenant)
        if len(batch) == 0:
            return AppendResult()
        result = self.storage.append(batch)
        self.deliver(batch, result)
        return result

    def deliver(self, batch: SampleBatch, result: AppendResult) -> None:
        """Hand the samples storage took (``result``) to the sinks. Also for batches stored by
        another path than ``append`` (a history import writing blocks), so summaries fold them."""
        if self.sinks and (self.sink_tenants is None or batch.tenant in self.sink_tenants):
            part = accepted_part(batch, result)
            if part is not None and len(part):
                for sink in self.sinks:
                    try:
                        sink.consume(part)
                    except Exception:  # noqa: BLE001 - a sink must not fail ingestion
                        metrics.SINK_ERRORS.labels(sink=type(sink).__name__).inc()
                        log.exception("ingest sink %r failed", sink)
