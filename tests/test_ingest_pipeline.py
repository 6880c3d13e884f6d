"""IngestPipeline over the real TSDB: appends off the event loop, sinks get what storage took,
bounded in-flight queue raises Overloaded, metadata reaches the registry."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ingest.errors import Overloaded
from ingest.metadata_store import MetadataStore
from ingest.pipeline import IngestPipeline
from storage.batch import MetricMetadata, SampleBatch
from storage.labels import make_labels
from storage.tsdb import TSDB
from tests.test_ingest_support import now_ms


class Recorder:
    def __init__(self):
        self.batches: list[SampleBatch] = []
        self.threads: set[str] = set()

    def consume(self, batch: SampleBatch) -> None:
        self.batches.append(batch)
        self.threads.add(threading.current_thread().name)


def _batch(t: int, v: float) -> SampleBatch:
    b = SampleBatch.from_series([(make_labels({"__name__": "pl", "i": str(i)}), [t, t + 1000], [v, v + 1]) for i in range(3)])
    b.metadata = [MetricMetadata("pl", "gauge", "pipeline test", "")]
    return b


async def test_pipeline_sinks_metadata_and_threads(tmp_path):
    db = TSDB(str(tmp_path / "db"), background=False)
    ex = ThreadPoolExecutor(2, thread_name_prefix="ingest-test")
    meta = MetadataStore()
    p = IngestPipeline(db, executor=ex, metadata=meta)
    rec = Recorder()
    p.add_sink(rec)
    t = now_ms() - 10_000
    try:
        r = await p.submit(_batch(t, 1.0))
        assert r.accepted == 6 and len(rec.batches) == 1 and len(rec.batches[0]) == 6
        assert all(name.startswith("ingest-test") for name in rec.threads)  # not the event loop thread
        assert meta.get("pl") == {"pl": [{"type": "gauge", "help": "pipeline test", "unit": ""}]}
        # the same batch again: duplicates -> storage takes nothing new, sinks must not double count
        r = await p.submit(_batch(t, 1.0))
        assert r.accepted == 0 and len(rec.batches) == 1
        # concurrent submits all land
        await asyncio.gather(*(p.submit(_batch(t + 10_000 * k, 5.0)) for k in range(1, 5)))
        assert sum(len(b) for b in rec.batches) == 6 + 4 * 6
        assert p.in_flight == 0
    finally:
        db.close()
        ex.shutdown()


async def test_pipeline_overloaded(tmp_path):
    db = TSDB(str(tmp_path / "db"), background=False)
    try:
        p = IngestPipeline(db, max_queue=1)
        with p.slot():
            with pytest.raises(Overloaded):
                await p.submit(_batch(now_ms(), 1.0))
            with pytest.raises(Overloaded):
                p.submit_sync(_batch(now_ms(), 1.0))
        assert p.in_flight == 0
        assert (await p.submit(_batch(now_ms(), 1.0))).accepted == 6
    finally:
        db.close()
