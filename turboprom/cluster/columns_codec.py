"""One Arrow IPC encoding for every columnar batch that crosses a process boundary in the cluster:
a partition's message on the ingest log (distributor -> JetStream -> ingester) and a partition
read (ingester -> querier).

A message is one Arrow record batch of N samples: ``series`` (dictionary-encoded: the dictionary
holds the K canonical label sets as JSON, the indices say which one each sample belongs to), ``t``
(int64 ms) and ``v`` (float64, bit-exact, so the stale marker survives). The dictionary keeps label
sets that no sample references, so a read's series without samples in range survive too. The
tenant and the metric metadata travel in the schema metadata. pyarrow does the framing; the only
per-series work is the JSON of each label set, done once per series and message.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import orjson
import pyarrow as pa

from storage.batch import MetricMetadata, SampleBatch
from storage.labels import Labels
from storage.series_set import SeriesSet


def label_keys(series: Sequence[Labels]) -> list[bytes]:
    """The canonical JSON of each label set: what the partition hash and the messages use."""
    return [orjson.dumps(lbl) for lbl in series]


def encode(keys: Sequence[bytes], series_index: np.ndarray, timestamps: np.ndarray, values: np.ndarray,
           *, tenant: str = "default", metadata: Sequence[MetricMetadata] = ()) -> bytes:
    dictionary = pa.array(keys, pa.binary())
    series = pa.DictionaryArray.from_arrays(pa.array(np.asarray(series_index, np.int32), pa.int32()), dictionary)
    meta = {b"tenant": tenant.encode()}
    if metadata:
        meta[b"metadata"] = orjson.dumps([[m.metric_family, m.type, m.help, m.unit] for m in metadata])
    batch = pa.record_batch([series, pa.array(timestamps, pa.int64()), pa.array(values, pa.float64())],
                            schema=pa.schema([("series", series.type), ("t", pa.int64()), ("v", pa.float64())], metadata=meta))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _labels(keys: list[bytes], cache: dict[bytes, Labels] | None) -> list[Labels]:
    if cache is None:
        return [tuple(tuple(p) for p in orjson.loads(k)) for k in keys]
    out = []
    for k in keys:  # per series of a message: a dict lookup for series seen before
        lbl = cache.get(k)
        if lbl is None:
            if len(cache) >= LABEL_CACHE_MAX:
                cache.clear()
            lbl = cache[k] = tuple(tuple(p) for p in orjson.loads(k))
        out.append(lbl)
    return out


LABEL_CACHE_MAX = 2_000_000


def _read(data: bytes, cache: dict[bytes, Labels] | None = None) -> tuple[list[Labels], np.ndarray, np.ndarray, np.ndarray, dict]:
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    batches = list(reader)
    meta = reader.schema.metadata or {}
    if not batches:
        return [], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64), meta
    b = batches[0]
    col = b.column(0)
    labels = _labels(col.dictionary.to_pylist(), cache)
    idx = col.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    ts = b.column(1).to_numpy(zero_copy_only=False)
    vs = b.column(2).to_numpy(zero_copy_only=False)
    return labels, idx, ts, vs, meta


def decode_batch(data: bytes, cache: dict[bytes, Labels] | None = None) -> SampleBatch:
    """A log message as a SampleBatch; ``cache`` (label JSON -> labels) spares re-parsing known series."""
    labels, idx, ts, vs, meta = _read(data, cache)
    md = [MetricMetadata(*m) for m in orjson.loads(meta[b"metadata"])] if b"metadata" in meta else []
    return SampleBatch(labels, idx, ts, vs, metadata=md, tenant=meta.get(b"tenant", b"default").decode())


def encode_series_set(ss: SeriesSet) -> bytes:
    counts = np.diff(np.asarray(ss.offsets, np.int64))
    idx = np.repeat(np.arange(len(ss.labels), dtype=np.int32), counts)
    return encode(label_keys(ss.labels), idx, ss.timestamps, ss.values)


def decode_series_set(data: bytes) -> SeriesSet:
    labels, idx, ts, vs, _ = _read(data)
    offsets = np.zeros(len(labels) + 1, np.int64)
    np.cumsum(np.bincount(idx, minlength=len(labels)), out=offsets[1:])
    return SeriesSet(labels, offsets, np.asarray(ts, np.int64), np.asarray(vs, np.float64))


def merge_series_sets(parts: Sequence[SeriesSet]) -> SeriesSet:
    """Series sets of disjoint partitions as one, sorted by labels (storage's order)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return SeriesSet.empty()
    if len(parts) == 1:
        return parts[0]
    labels = [lbl for p in parts for lbl in p.labels]
    starts = np.concatenate([p.offsets[:-1] + base for p, base in
                             zip(parts, np.cumsum([0] + [p.num_samples for p in parts[:-1]]))])
    counts = np.concatenate([np.diff(p.offsets) for p in parts])
    ts_all = np.concatenate([p.timestamps[: p.num_samples] for p in parts])
    vs_all = np.concatenate([p.values[: p.num_samples] for p in parts])
    order = np.array(sorted(range(len(labels)), key=labels.__getitem__), dtype=np.int64)
    counts = counts[order]
    offsets = np.zeros(len(labels) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    # sample positions of the reordered series: each series' run, gathered without a Python loop
    run_starts = np.repeat(starts[order] - offsets[:-1], counts)
    take = np.arange(offsets[-1], dtype=np.int64) + run_starts
    return SeriesSet([labels[i] for i in order], offsets, ts_all[take], vs_all[take])
