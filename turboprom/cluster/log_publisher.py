"""The distributor's storage: an ``append`` that publishes a batch to the ingest log.

It sits where the TSDB sits under the single node's ingest pipeline, so the write routes
(turboprom/routes/ingest_api.py: decode, validation, tenancy, limits, overload) are the single
node's. ``append`` runs in an ingest worker thread and returns only after JetStream acknowledged
every message carrying its samples. When the log does not acknowledge in time it raises an
``OSError(EIO)``, which the write route answers with 503 and Retry-After: nothing is acknowledged
without durability. Samples the ingesters later refuse (out of order, duplicates with another
value) are counted there, not answered here: the sender already had its acknowledgement, as with
any log-based ingest path.

Group commit: writes that arrive while a publish is in flight join the next *group*; one of their
threads publishes the whole group as one message per (tenant, partition), joining the parts of all
its writes, and every write of the group is answered when JetStream has acknowledged all of the
group's messages. An idle distributor publishes a lone write at once; a busy one publishes fewer,
larger messages (fewer JetStream stores, replications, deliveries and acks per sample). Series
travel by log reference; a series' label key is in a message only where its definition is due
(series_dictionary.py), and is marked defined once the message carrying it is acknowledged.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import threading
from collections import defaultdict

import numpy as np
from prometheus_client import Counter

from storage.batch import MetricMetadata, SampleBatch
from storage.interface import AppendResult
from turboprom.cluster import columns_codec, partitions
from turboprom.cluster.ingest_log import IngestLog, LogUnavailable
from turboprom.cluster.series_dictionary import BatchKeys, SeriesKeys
from turboprom.cluster.settings import ClusterSettings

log = logging.getLogger("turboprom.cluster")
GROUPS = Counter("turboprom_cluster_log_groups", "Groups of writes this distributor published together (one group commit "
                 "each; a group's writes are answered when JetStream has acknowledged all of its messages).")
MESSAGES = Counter("turboprom_cluster_log_messages", "Messages this distributor published to the ingest log and JetStream "
                   "acknowledged (one per tenant and partition of a group).")
MESSAGE_BYTES = Counter("turboprom_cluster_log_message_bytes", "Bytes of the messages counted in "
                        "turboprom_cluster_log_messages_total.")
SAMPLES = Counter("turboprom_cluster_log_samples", "Samples in the messages counted in turboprom_cluster_log_messages_total.")


class _Group:
    """Writes published together."""

    def __init__(self) -> None:
        self.writes: list[tuple[SampleBatch, BatchKeys, list]] = []
        self.done = False
        self.error: OSError | None = None


class LogPublisher:
    def __init__(self, settings: ClusterSettings):
        self.settings = settings
        self.log = IngestLog(settings, client_name="turboprom-distributor")
        self.keys = SeriesKeys(settings.partitions)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond = threading.Condition()
        self._open = _Group()
        self._publishing = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.log.connect()
        await self.log.ensure_stream()

    async def stop(self) -> None:
        await self.log.close()

    def append(self, batch: SampleBatch) -> AppendResult:
        if len(batch) == 0:
            return AppendResult()
        if self._loop is None:
            raise OSError(errno.EIO, "ingest log not connected yet (JetStream); nothing from this request was written")
        keys = self.keys.lookup(batch)
        parts = partitions.split(batch, keys.part)
        with self._cond:
            group = self._open
            group.writes.append((batch, keys, parts))
            while not group.done and (self._publishing or self._open is not group):
                self._cond.wait()
            lead = not group.done
            if lead:
                self._publishing = True
                self._open = _Group()
        if lead:
            try:
                self._publish(group)
            except OSError as e:
                group.error = e
            except BaseException as e:  # nothing of the group may be acknowledged
                group.error = OSError(errno.EIO, f"publishing to the ingest log failed: {e!r}")
                raise
            finally:
                with self._cond:
                    group.done = True
                    self._publishing = False
                    self._cond.notify_all()
        if group.error is not None:
            raise OSError(group.error.errno, group.error.strerror)
        return AppendResult(accepted=len(batch))

    def _messages(self, group: _Group) -> tuple[list[tuple[int, bytes]], list[tuple[BatchKeys, np.ndarray]]]:
        """One message per (tenant, partition) of the group; and the definitions they carry."""
        pieces: dict[tuple[str, int], list] = defaultdict(list)
        metadata: dict[str, list[MetricMetadata]] = defaultdict(list)
        for batch, keys, parts in group.writes:
            metadata[batch.tenant].extend(batch.metadata)
            for p, sel in parts:
                pieces[(batch.tenant, p)].append((batch, keys, sel))
        messages: list[tuple[int, bytes]] = []
        defined: list[tuple[BatchKeys, np.ndarray]] = []
        for (tenant, p), ps in pieces.items():
            h1, h2, ts, vs, key_list = [], [], [], [], []
            for batch, keys, sel in ps:
                series = batch.series_index[sel]
                h1.append(keys.h1[series])
                h2.append(keys.h2[series])
                ts.append(batch.timestamps[sel])
                vs.append(batch.values[sel])
                chunk: list[bytes | None] = [None] * len(sel)
                due = keys.due[series]
                if due.any():  # the first sample of each series whose definition is due carries its key
                    uniq, first = np.unique(series[due], return_index=True)
                    for j in np.flatnonzero(due)[first].tolist():
                        chunk[j] = keys.key(int(series[j]))
                    defined.append((keys, uniq))
                key_list.extend(chunk)
            cat = (lambda xs: xs[0]) if len(ps) == 1 else np.concatenate
            messages.append((p, columns_codec.encode_log_message(cat(h1), cat(h2), key_list, cat(ts), cat(vs),
                                                                 tenant=tenant, metadata=metadata[tenant])))
        return messages, defined

    def _publish(self, group: _Group) -> None:
        messages, defined = self._messages(group)
        fut = asyncio.run_coroutine_threadsafe(self.log.publish(messages), self._loop)
        try:
            fut.result(self.settings.publish_timeout_s + 1.0)
        except (LogUnavailable, TimeoutError) as e:
            fut.cancel()
            log.warning("write not acknowledged: %s", e)
            raise OSError(errno.EIO, f"ingest log unavailable: {e}") from None
        for keys, positions in defined:
            self.keys.acknowledged(keys, positions)
        GROUPS.inc()
        MESSAGES.inc(len(messages))
        MESSAGE_BYTES.inc(sum(len(m) for _, m in messages))
        SAMPLES.inc(sum(len(batch) for batch, _, _ in group.writes))

    def close(self) -> None:
        pass
