"""The distributor's storage: an ``append`` that publishes a batch to the ingest log.

It sits where the TSDB sits under the single node's ingest pipeline, so the write routes
(turboprom/routes/ingest_api.py: decode, validation, tenancy, limits, overload) are the single
node's. ``append`` runs in an ingest worker thread: it splits the batch by virtual partition, encodes
each part as one Arrow IPC message, hands the messages to the event loop's NATS client (one async
publish per partition, the acks awaited together) and returns only after JetStream acknowledged all
of them. When the log does not acknowledge in time it raises an ``OSError(EIO)``, which the write
route answers with 503 and Retry-After: nothing is acknowledged without durability. Samples the
ingesters later refuse (out of order, duplicates with another value) are counted there, not
answered here: the sender already had its acknowledgement, as with any log-based ingest path.
"""
from __future__ import annotations

import asyncio
import errno
import logging

from storage.batch import SampleBatch
from storage.interface import AppendResult
from turboprom.cluster import columns_codec, partitions
from turboprom.cluster.ingest_log import IngestLog, LogUnavailable
from turboprom.cluster.settings import ClusterSettings

log = logging.getLogger("turboprom.cluster")


class LogPublisher:
    def __init__(self, settings: ClusterSettings):
        self.settings = settings
        self.log = IngestLog(settings, client_name="turboprom-distributor")
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.log.connect()
        await self.log.ensure_stream()

    async def stop(self) -> None:
        await self.log.close()

    def append(self, batch: SampleBatch) -> AppendResult:
        if len(batch) == 0:
            return AppendResult()
        keys = columns_codec.label_keys(batch.series)
        messages = [(p, columns_codec.encode(k, idx, ts, vs, tenant=batch.tenant, metadata=batch.metadata))
                    for p, k, idx, ts, vs in partitions.split(batch, keys, self.settings.partitions)]
        if self._loop is None:
            raise OSError(errno.EIO, "ingest log not connected yet (JetStream); nothing from this request was written")
        fut = asyncio.run_coroutine_threadsafe(self.log.publish(messages), self._loop)
        try:
            fut.result(self.settings.publish_timeout_s + 1.0)
        except (LogUnavailable, TimeoutError) as e:
            fut.cancel()
            log.warning("write not acknowledged: %s", e)
            raise OSError(errno.EIO, f"ingest log unavailable: {e}") from None
        return AppendResult(accepted=len(batch))

    def close(self) -> None:
        pass
