"""An ingester: consumes the partitions etcd assigns it from the ingest log into its local TSDB.

Per owned partition a fetch loop pulls from the partition's durable consumer and queues what it
got; one appender drains the queue, decodes every message (columns_codec), resolves the series'
log references in the node's series dictionary (series_dictionary.py: label keys are parsed only
for series it has not seen), joins them into one batch per tenant, each series once and known to
storage by a local reference, and appends through the node's ordinary ingest pipeline (TSDB with its WAL, then
the summarizer and congestion sinks), in a worker thread. Only then is each partition acknowledged
up to its last appended message (ack policy *all*): the consumer's ack floor is the last sequence
persisted locally, so after a crash or restart the partition resumes from it (messages appended but
not yet acknowledged come again, and storage takes identical samples as idempotent duplicates).
The consumer is recreated to start right after the ack floor, so what an earlier process had been
delivered but never acknowledged comes first, in order; a gap in delivery sequences (a fetch answer
lost while reconnecting) re-reads the partition from what was applied the same way.

Partitions advance unevenly (a replay after a restart, a burst of old data on some of them): the
node's storage cuts no head range past the oldest sample time a busy partition (fetched from in the
last ``IDLE_S`` seconds, or not caught up yet) has applied (``cut_hold``; ``TSDB.hold_cuts``), so
what a lagging partition still has to apply is never "too old" for the storage.

``cluster-node.json`` in the data dir names the node and the partitions whose data it holds; when
it is missing (a new or wiped disk), the node's old consumers are deleted so its partitions replay
from the start of the log. A partition counts as caught up once its applied sequence reaches the
log's last sequence as of when the node took it; queriers prefer caught-up owners.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from nats.errors import TimeoutError as NatsTimeout

import numpy as np
from prometheus_client import Counter

from storage.batch import SampleBatch, SeriesRefColumn
from storage.matchers import Matcher
from turboprom.cluster import columns_codec
from turboprom.cluster.columns_codec import LogPart
from turboprom.cluster.ingest_log import IngestLog
from turboprom.cluster.membership import ClusterState, Membership
from turboprom.cluster.series_dictionary import SeriesDictionary
from turboprom.cluster.settings import ClusterSettings

log = logging.getLogger("turboprom.cluster")
FETCH_BATCH = 256
MAX_DRAIN = 1024  # messages joined into one append at most
IDLE_S = 30.0  # a caught-up partition with nothing fetched for this long holds no head cut back
# a partition this far behind the newest one this node applied holds cuts back no further (a partition
# stalled for a day must not grow the head without end); what it applies older than that may be refused
MAX_HOLD_MS = 24 * 3_600_000
UNDEFINED = Counter("turboprom_cluster_undefined_series_samples", "Samples from the ingest log dropped because their "
                    "series' label key was neither in the log read nor in this node's storage (a replay that starts "
                    "after the series' last definition, e.g. at a log truncated by retention).")
REFUSED = Counter("turboprom_cluster_refused_samples", "Samples from the ingest log this node's storage refused "
                  "(out of order, too old, a different value at an existing timestamp: what a single node would "
                  "have answered the sender with a 400; the distributor had already acknowledged them).")
ALL_SERIES = [[Matcher("__name__", "=~", ".*")]]


def cut_hold(owned: list[int], caught_up: set[int], inflight: dict[int, int], fetched_at: dict[int, float],
             applied_ts: dict[int, int], now: float) -> int | None:
    """The oldest sample time a partition may still append (None: no limit): the minimum over the busy
    partitions (not caught up, with batches queued, or fetched from in the last ``IDLE_S`` seconds) of
    the newest sample time each has applied; a busy partition that has applied nothing yet holds
    everything back. Never more than ``MAX_HOLD_MS`` behind the newest applied sample time."""
    hold = None
    for p in owned:
        if p in caught_up and not inflight.get(p) and now - fetched_at.get(p, now - IDLE_S) >= IDLE_S:
            continue
        ts = applied_ts.get(p, -(1 << 63))
        hold = ts if hold is None else min(hold, ts)
    if hold is not None and applied_ts:
        hold = max(hold, max(applied_ts.values()) - MAX_HOLD_MS)
    return hold


class PartitionIngester:
    def __init__(self, settings: ClusterSettings, membership: Membership, pipeline: Any, executor: Any, data_dir: str,
                 storage: Any):
        self.settings = settings
        self.membership = membership
        self.node_id = membership.node_id
        self.pipeline = pipeline
        self.executor = executor
        self.marker = Path(data_dir) / "cluster-node.json"
        self.log = IngestLog(settings, client_name=f"turboprom-ingester-{self.node_id}")
        self.applied: dict[int, int] = {}  # partition -> stream sequence appended and acknowledged
        self.targets: dict[int, int] = {}  # partition -> log's last sequence when the node took it
        self.held: set[int] = set()
        self._fresh = False
        self._loops: dict[int, asyncio.Task] = {}
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=4096)
        self._appender: asyncio.Task | None = None
        self.dictionary = SeriesDictionary(lambda: storage.series(ALL_SERIES, -(1 << 62), 1 << 62))
        self._reconcile_lock = asyncio.Lock()
        self._inflight: dict[int, int] = defaultdict(int)  # partition -> batches queued, not yet acknowledged
        self.applied_ts: dict[int, int] = {}  # partition -> newest sample time appended from it
        self._fetched_at: dict[int, float] = {}  # partition -> monotonic time of its last non-empty fetch
        storage.hold_cuts(self.cut_hold)

    def durable(self, partition: int) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "_", f"{self.node_id}-p{partition:04d}")

    def _save_marker(self) -> None:
        tmp = self.marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"node": self.node_id, "partitions": self.settings.partitions, "held": sorted(self.held)}))
        tmp.replace(self.marker)

    async def start(self) -> None:
        if self.marker.exists():
            m = json.loads(self.marker.read_text())
            if m.get("node") != self.node_id:
                raise RuntimeError(f"data dir belongs to ingester {m.get('node')!r}, not {self.node_id!r} (--cluster.node-id)")
            self.held = set(m.get("held", []))
        else:
            self._fresh = True
            self._save_marker()
        await self.log.connect()
        await self.log.ensure_stream()
        loop = asyncio.get_running_loop()
        self._appender = loop.create_task(self._append_loop(), name="partition appender")
        self.membership.on_change.append(lambda st: loop.create_task(self.reconcile(st)))

    def owned(self, st: ClusterState) -> set[int]:
        a = st.assignment
        return a.owned_by(self.node_id) if a is not None and a.partitions == self.settings.partitions else set()

    async def reconcile(self, st: ClusterState) -> None:
        """Start loops for newly owned partitions, stop those no longer owned."""
        if self._reconcile_lock.locked():
            return
        async with self._reconcile_lock:
            want = self.owned(st)
            for p in sorted(set(self._loops) - want):
                self._loops.pop(p).cancel()
                self.membership.caught_up.discard(p)
                log.info("partition %d released", p)
            for p in [p for p, t in self._loops.items() if t.done()]:  # a loop that ended: start it again
                log.error("partition %d: fetch loop ended (%r); restarting it", p, self._loops.pop(p).exception())
            for p in sorted(want - set(self._loops)):
                self._loops[p] = asyncio.get_running_loop().create_task(self._fetch_loop(p), name=f"partition {p} fetch")

    async def _open(self, p: int):
        """The partition's consumer, delivering right after what this node has applied."""
        while True:
            try:
                floor = 0 if self._fresh and p not in self.applied else await self.log.ack_floor(self.durable(p))
                after = max(floor, self.applied.get(p, 0))
                sub = await self.log.consumer_after(p, self.durable(p), after)
                self.applied[p] = after
                if p not in self.targets:
                    self.targets[p] = await self.log.last_seq(p)
                return sub
            except Exception as e:  # noqa: BLE001 - no leader yet, reconnecting, ...: retry
                log.warning("partition %d: consumer not ready: %r", p, e)
                await asyncio.sleep(0.5)

    async def _fetch_loop(self, p: int) -> None:
        sub = await self._open(p)
        if p not in self.held:
            self.held.add(p)
            self._save_marker()
        self._check_caught_up(p)
        last_cseq, last_sseq = 0, self.applied[p]
        while True:
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=1.0)
            except (NatsTimeout, asyncio.TimeoutError):
                continue
            except Exception as e:  # noqa: BLE001 - a partition's loop must outlive any client error
                log.warning("partition %d: fetch failed: %r", p, e)
                await asyncio.sleep(0.2)
                continue
            keep = []
            gap = False
            for m in msgs:
                seq = m.metadata.sequence
                if int(seq.consumer) != last_cseq + 1:  # a delivery lost on the way: start again after it
                    gap = True
                    break
                last_cseq = int(seq.consumer)
                if int(seq.stream) > last_sseq:  # not a redelivery of something already queued
                    keep.append(m)
                    last_sseq = int(seq.stream)
            if keep:
                self._fetched_at[p] = time.monotonic()
                self._inflight[p] += 1
                await self._queue.put((p, keep))
            if gap:
                log.warning("partition %d: delivery gap after stream sequence %d; re-reading from what was applied", p, last_sseq)
                while self._inflight[p]:
                    await asyncio.sleep(0.05)
                sub = await self._open(p)
                last_cseq, last_sseq = 0, self.applied[p]

    def cut_hold(self) -> int | None:
        """``cut_hold`` of this node's owned partitions now (the storage's maintenance thread asks)."""
        return cut_hold(list(self._loops), self.membership.caught_up, self._inflight, self._fetched_at,
                        self.applied_ts, time.monotonic())

    def _check_caught_up(self, p: int) -> None:
        if self.applied.get(p, 0) >= self.targets.get(p, 1 << 62):
            self.membership.caught_up.add(p)

    def _batch_of(self, parts: list[LogPart]) -> SampleBatch:
        """One tenant's decoded messages as one batch, each series once, by local reference."""
        one = len(parts) == 1
        cat = (lambda f: getattr(parts[0], f)) if one else (lambda f: np.concatenate([getattr(x, f) for x in parts]))
        h1, h2, ts, vs = cat("h1"), cat("h2"), cat("timestamps"), cat("values")
        local = self.dictionary.define(h1, h2, parts[0].keys if one else [k for x in parts for k in x.keys])
        if (local < 0).any():
            keep = local >= 0
            UNDEFINED.inc(int((~keep).sum()))
            log.warning("ingest log: %d samples without a label key for their series dropped", int((~keep).sum()))
            local, ts, vs = local[keep], ts[keep], vs[keep]
        uniq, si = np.unique(local, return_inverse=True)
        return SampleBatch(self.dictionary.labels_of(uniq), si, ts, vs, metadata=[m for x in parts for m in x.metadata],
                           tenant=parts[0].tenant, series_refs=SeriesRefColumn(self.dictionary.space, uniq))

    def _append(self, items: list[tuple[int, list]]) -> None:
        by_tenant: dict[str, list[LogPart]] = defaultdict(list)
        newest: dict[int, int] = {}
        for p, msgs in items:
            for m in msgs:
                part = columns_codec.decode_log_message(m.data)
                by_tenant[part.tenant].append(part)
                if len(part.timestamps):
                    newest[p] = max(newest.get(p, -(1 << 63)), int(part.timestamps.max()))
        for parts in by_tenant.values():
            batch = self._batch_of(parts)
            res = self.pipeline.append_sync(batch)
            if res.rejected_total:
                REFUSED.inc(res.rejected_total)
                log.debug("ingest log: %d samples refused by storage: %s", res.rejected_total, "; ".join(res.errors[:3]))
        for p, t in newest.items():
            self.applied_ts[p] = max(self.applied_ts.get(p, t), t)

    async def _append_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await self._queue.get()]
            n = len(items[0][1])
            while n < MAX_DRAIN and not self._queue.empty():
                items.append(self._queue.get_nowait())
                n += len(items[-1][1])
            while True:
                try:
                    await loop.run_in_executor(self.executor, self._append, items)
                    break
                except Exception:  # noqa: BLE001 - disk trouble, ...: nothing acknowledged, retry (the log keeps it all)
                    log.exception("append from the ingest log failed, retrying")
                    await asyncio.sleep(1.0)
            last: dict[int, Any] = {}
            for p, msgs in items:
                last[p] = msgs[-1]
                self._inflight[p] -= 1
            for p, m in last.items():
                try:
                    await m.ack()
                except Exception as e:  # noqa: BLE001 - redelivered later; duplicates are idempotent
                    log.warning("partition %d: ack failed: %r", p, e)
                    continue
                self.applied[p] = max(self.applied.get(p, 0), int(m.metadata.sequence.stream))
                self._check_caught_up(p)

    def status(self) -> dict:
        return {"node": self.node_id, "owned": sorted(self._loops), "caught_up": sorted(self.membership.caught_up),
                "held": sorted(self.held), "applied": {str(p): s for p, s in sorted(self.applied.items())},
                "targets": {str(p): s for p, s in sorted(self.targets.items())}}

    async def lag(self) -> dict[int, int]:
        """Per owned partition: messages on the log after the last one this node applied (0 = all of it)."""
        out = {}
        for p in sorted(self._loops):
            out[p] = max(0, await self.log.last_seq(p) - self.applied.get(p, 0))
        return out

    async def stop(self) -> None:
        for t in list(self._loops.values()) + ([self._appender] if self._appender else []):
            t.cancel()
        await asyncio.gather(*self._loops.values(), *([self._appender] if self._appender else []), return_exceptions=True)
        await self.log.close()
