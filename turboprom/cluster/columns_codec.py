"""One Arrow IPC encoding for every columnar batch that crosses a process boundary in the cluster:
a partition's message on the ingest log (distributor -> JetStream -> ingester) and a partition
read (ingester -> querier).

A log message (``encode_log_message``) is ``b"TPL2"``, two uint32 lengths (little-endian), a
small JSON header (tenant, metric metadata) and one Arrow IPC record-batch message of a fixed
schema (no schema message travels: both ends know it) holding N samples: ``h1``, ``h2`` (the two
uint64 halves of the sample's series' log reference, series_dictionary.py), ``key`` (the series'
canonical label set as JSON at a sample where this message defines the series, null elsewhere),
``t`` (int64 ms) and ``v`` (float64, bit-exact, so the stale marker survives). References per
sample rather than per series keep a message to one record batch (one pyarrow call each way, the
cost that dominates small messages); a scrape-shaped write has one sample per series anyway.
Messages without the prefix are the earlier format that carried every label key in every message
(one Arrow IPC stream like a partition read's): a log written before keeps replaying.

A partition read (``encode_series_set``) is one record batch of N samples: ``series``
(dictionary-encoded: the dictionary holds the K canonical label sets as JSON, the indices say which
one each sample belongs to), ``t`` and ``v``. The dictionary keeps label sets that no sample
references, so a read's series without samples in range survive too. pyarrow does the framing.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import orjson
import pyarrow as pa

from storage.batch import MetricMetadata
from storage.labels import Labels
from storage.series_set import SeriesSet
from turboprom.cluster.series_dictionary import log_refs


LOG_MAGIC = b"TPL2"
_LOG_HEAD = struct.Struct("<II")
_LOG_SCHEMA = pa.schema([("h1", pa.uint64()), ("h2", pa.uint64()), ("key", pa.binary()), ("t", pa.int64()), ("v", pa.float64())])


@dataclass
class LogPart:
    """One decoded log message: N samples with their series' log references (``h1``, ``h2``) and,
    where the message defines the series, its label key (None elsewhere)."""

    h1: np.ndarray
    h2: np.ndarray
    keys: list
    timestamps: np.ndarray
    values: np.ndarray
    tenant: str
    metadata: list[MetricMetadata]


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _column(a: np.ndarray, dtype: type, typ: pa.DataType) -> pa.Array:
    a = np.ascontiguousarray(a, dtype)
    return pa.Array.from_buffers(typ, len(a), [None, pa.py_buffer(a)])


def encode_log_message(h1: np.ndarray, h2: np.ndarray, keys: Sequence[bytes | None], timestamps: np.ndarray,
                       values: np.ndarray, *, tenant: str = "default", metadata: Sequence[MetricMetadata] = ()) -> bytes:
    """The message of N samples (module docstring); ``keys``: None where the sample's series is not
    defined by this message."""
    meta: dict = {"tenant": tenant}
    if metadata:
        meta["metadata"] = [[m.metric_family, m.type, m.help, m.unit] for m in metadata]
    key_col = pa.nulls(len(h1), pa.binary()) if all(x is None for x in keys) else pa.array(keys, pa.binary())
    body = pa.RecordBatch.from_arrays([_column(h1, np.uint64, pa.uint64()), _column(h2, np.uint64, pa.uint64()), key_col,
                                       _column(timestamps, np.int64, pa.int64()), _column(values, np.float64, pa.float64())],
                                      schema=_LOG_SCHEMA).serialize()
    head = orjson.dumps(meta)
    head += b" " * (-(len(LOG_MAGIC) + _LOG_HEAD.size + len(head)) % 8)  # the record batch 8-byte aligned
    return b"".join((LOG_MAGIC, _LOG_HEAD.pack(len(head), body.size), head, body))


def is_log_message(data: bytes) -> bool:
    return data[:4] == LOG_MAGIC


def decode_log_message(data: bytes) -> LogPart:
    """A log message's columns; a message of the earlier format (one Arrow IPC stream with every
    label key in every message) comes out the same way, its first sample of each series defining it."""
    if not is_log_message(data):
        keys, idx, ts, vs, meta = _read(data)
        h1, h2 = log_refs(keys)
        return LogPart(h1[idx], h2[idx], [keys[i] for i in idx.tolist()], ts, vs,
                       meta.get(b"tenant", b"default").decode(), _metadata(meta))
    nh, nb = _LOG_HEAD.unpack_from(data, 4)
    o = len(LOG_MAGIC) + _LOG_HEAD.size
    meta = orjson.loads(data[o:o + nh])
    b = pa.ipc.read_record_batch(pa.py_buffer(data).slice(o + nh, nb), _LOG_SCHEMA)
    key_col = b.column(2)
    keys = [None] * len(key_col) if key_col.null_count == len(key_col) else key_col.to_pylist()
    return LogPart(b.column(0).to_numpy(), b.column(1).to_numpy(), keys, b.column(3).to_numpy(), b.column(4).to_numpy(),
                   meta.get("tenant", "default"), [MetricMetadata(*m) for m in meta.get("metadata", ())])


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
    return _ipc(batch)


def _read(data: bytes) -> tuple[list[bytes], np.ndarray, np.ndarray, np.ndarray, dict]:
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    batches = list(reader)
    meta = reader.schema.metadata or {}
    if not batches:
        return [], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64), meta
    b = batches[0]
    col = b.column(0)
    idx = col.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return col.dictionary.to_pylist(), idx, b.column(1).to_numpy(zero_copy_only=False), b.column(2).to_numpy(zero_copy_only=False), meta


def _labels(keys: list[bytes]) -> list[Labels]:
    return [tuple(tuple(p) for p in orjson.loads(k)) for k in keys]


def _metadata(meta: dict) -> list[MetricMetadata]:
    return [MetricMetadata(*m) for m in orjson.loads(meta[b"metadata"])] if b"metadata" in meta else []


def encode_series_set(ss: SeriesSet) -> bytes:
    counts = np.diff(np.asarray(ss.offsets, np.int64))
    idx = np.repeat(np.arange(len(ss.labels), dtype=np.int32), counts)
    return encode(label_keys(ss.labels), idx, ss.timestamps, ss.values)


def decode_series_set(data: bytes) -> SeriesSet:
    keys, idx, ts, vs, _ = _read(data)
    labels = _labels(keys)
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


# ------------------------------------------------------------------ pushed-down aggregations
# An ingester's partial aggregation state (promql/partial_aggregate.py) for a querier: one record
# batch of G rows (groups, or topk/bottomk candidate series): ``labels`` and ``first`` (label sets
# as JSON), ``present`` and each (G, T) state array as fixed-size lists of T, the delayed
# ``__name__`` removal marks as ``dp`` (G x T) or ``drop`` (G); the schema's metadata holds the
# operator, T, a JSON header (annotations, stats) and for topk/bottomk every group with its first
# series.

def _fixed(a: np.ndarray, t: int, dtype: type, typ: pa.DataType) -> pa.Array:
    flat = _column(np.asarray(a, dtype).reshape(-1), dtype, typ)
    return pa.FixedSizeListArray.from_arrays(flat, t)


def _matrix(col: pa.Array, t: int, dtype: type) -> np.ndarray:
    flat = col.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype).reshape(-1, t)


def encode_partial(p: Any, header: dict) -> bytes:
    t = p.num_steps
    cols = {"labels": pa.array(label_keys(p.labels), pa.binary()),
            "present": _fixed(p.present, t, np.uint8, pa.uint8())}
    if p.first and not p.groups:
        cols["first"] = pa.array(label_keys(p.first), pa.binary())
    for name, a in p.arrays.items():
        cols["a_" + name] = _fixed(a, t, np.float64, pa.float64())
    if p.dp is not None:
        cols["dp"] = _fixed(p.dp, t, np.uint8, pa.uint8())
    if p.drop is not None:
        cols["drop"] = _column(p.drop, np.uint8, pa.uint8())
    meta = {b"op": p.op.encode(), b"t": str(t).encode(), b"header": orjson.dumps(header)}
    if p.groups:  # topk/bottomk: the groups and their first series (not one per candidate row)
        meta[b"groups"] = orjson.dumps([p.groups, p.first, p.sizes.tolist() if p.sizes is not None else []])
    if p.complete:
        meta[b"complete"] = b"1"
    batch = pa.record_batch(list(cols.values()), schema=pa.schema([(k, v.type) for k, v in cols.items()], metadata=meta))
    return _ipc(batch)


def decode_partial(data: bytes) -> tuple[Any, dict]:
    from promql.partial_aggregate import Partial

    reader = pa.ipc.open_stream(pa.py_buffer(data))
    meta = reader.schema.metadata or {}
    b = reader.read_next_batch()
    t = int(meta[b"t"])
    names = b.schema.names

    def col(name: str) -> pa.Array:
        return b.column(names.index(name))

    p = Partial(meta[b"op"].decode(), _labels(col("labels").to_pylist()), _matrix(col("present"), t, np.uint8).astype(bool),
                {n[2:]: _matrix(col(n), t, np.float64) for n in names if n.startswith("a_")},
                _labels(col("first").to_pylist()) if "first" in names else [],
                _matrix(col("dp"), t, np.uint8).astype(bool) if "dp" in names else None,
                col("drop").to_numpy(zero_copy_only=False).astype(bool) if "drop" in names else None)
    if b"groups" in meta:
        groups, first, sizes = orjson.loads(meta[b"groups"])
        p.groups, p.first, p.sizes = _labels_of(groups), _labels_of(first), np.asarray(sizes, np.int64)
    p.complete = meta.get(b"complete") == b"1"
    return p, orjson.loads(meta[b"header"])


def _labels_of(items: list) -> list[Labels]:
    return [tuple(tuple(x) for x in lbl) for lbl in items]
