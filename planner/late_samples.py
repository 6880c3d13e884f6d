"""Late samples: live samples that are not newer than their series' last folded sample.

They reach the summarizer when storage accepts them (an out-of-order window is configured) or when two
batches of one series are appended concurrently and reach the sinks in the other order; the ingest
pipeline only hands *accepted* samples to sinks, so a late sample is always in raw storage already.

* Sketch payloads (KLL, REQ) are order-independent: the sample is added to its pane's sketch
  (``fold_late_sketch``), and cached merges of that pane are invalidated by the store.
* Exact payloads are order-independent in their moments but not in first/last and the counter state
  (a sample inserted between two others changes which pair is a reset or a change, and the entry pair
  of the next pane). So the affected panes are rebuilt from raw storage (``rebuild_exact``): for each
  affected series every pane from the late sample's pane on is cleared and refolded from a storage
  read (one per series when few are affected, else one scope read), chained to the last sample of the series' previous non-empty pane. The rebuild reproduces
  exactly what raw evaluation sees, so a late sample never makes an ``exact`` answer wrong.

The rebuild never reaches below ``floor_ms`` (the part of history the backfill has already folded, or
the live start while the first backfill chunk is still pending), so backfill and rebuild never fold
the same sample twice.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from planner.exact_store import ALL_FIELDS, _blank  # noqa: PLC2701 - the store's own blank values
from storage.matchers import Matcher
from storage.stale import is_stale

INT64_MIN = np.iinfo(np.int64).min
PER_SERIES_READS = 16  # up to this many affected series: one storage read each, else one scope read
READ_MAX = np.iinfo(np.int64).max // 2


def fold_late_sketch(store: Any, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
    """Order-independent sketch panes: the late samples are simply added to their panes."""
    store.ingest_sorted(sid, ts, vals, live=True)


def rebuild_exact(sds: Any, storage: Any, sid: np.ndarray, ts: np.ndarray, floor_ms: int) -> int:
    """Rebuild the exact panes of the series in ``sid`` from the pane of their oldest late sample on.

    ``sid``/``ts``: the late samples (sorted by series, then time). Returns the raw samples refolded.
    """
    store = sds.store
    P = sds.spec.pane_ms
    first = np.ones(len(sid), bool)
    first[1:] = sid[1:] != sid[:-1]
    aff = sid[first]
    start_ms = np.maximum(ts[first] // P * P, floor_ms)  # per affected series: rebuild from here
    if len(aff) <= PER_SERIES_READS:
        # few affected series: one read per series, from its own rebuild start (label-equality matchers
        # may also match series with more labels: keep only the series itself)
        parts = []
        for s, start in zip(aff.tolist(), start_ms.tolist()):
            ms = [Matcher(n, "=", v) for n, v in sds.registry.labels[s]]
            parts.append((storage.select(ms, int(start), READ_MAX), s))
    else:  # many: one read of the whole scope from the oldest start, filtered below
        parts = [(storage.select(sds.spec.scope_matchers(), int(start_ms.min()), READ_MAX), None)]
    from_ms = np.full(len(sds.registry.labels) + 1, READ_MAX, np.int64)
    from_ms[aff] = start_ms
    sid_p, ts_p, val_p = [], [], []
    for ss, only in parts:
        if not len(ss):
            continue
        if only is not None:  # the series itself only (never register the others a read returned)
            ids = np.array([only if lbl == sds.registry.labels[only] else len(from_ms) - 1 for lbl in ss.labels], np.int64)
        else:
            ids = sds.register(ss.labels)
        if len(from_ms) <= int(ids.max()):
            from_ms = np.concatenate([from_ms, np.full(int(ids.max()) + 1 - len(from_ms), READ_MAX, np.int64)])
        rs = np.repeat(ids, np.diff(ss.offsets))
        keep = (ss.timestamps >= from_ms[rs]) & ~is_stale(ss.values)  # from_ms[-1] = READ_MAX: dropped
        sid_p.append(rs[keep])
        ts_p.append(ss.timestamps[keep])
        val_p.append(ss.values[keep])
    rsid = np.concatenate(sid_p) if sid_p else np.empty(0, np.int64)
    rts = np.concatenate(ts_p) if ts_p else np.empty(0, np.int64)
    rvals = np.concatenate(val_p) if val_p else np.empty(0)
    order = np.lexsort((rts, rsid))
    rsid, rts, rvals = rsid[order], rts[order], rvals[order]
    with store.lock:
        # per affected series (not per sample): clear its panes from the rebuild start on and restore
        # its chain to the last sample before that start (the last non-empty earlier pane)
        for s, start in zip(aff.tolist(), start_ms.tolist()):
            c0 = max(start // P - store.k0, 0)
            if c0 < store.nk:
                for f in ALL_FIELDS:
                    store.cols[f][s, c0:store.nk] = _blank(f, (1, store.nk - c0))[0]
            prev = np.nonzero(store.cols["count"][s, :min(c0, store.nk)] > 0)[0]
            if len(prev):
                store.last_t[s] = store.cols["last_t"][s, prev[-1]]
                store.last_v[s] = store.cols["last_v"][s, prev[-1]]
            else:
                store.last_t[s] = INT64_MIN
                store.last_v[s] = np.nan
        store.ingest_sorted(rsid, rts, rvals, live=True)
        if hasattr(store, "epoch"):  # readers caching results over sealed panes must see the rewrite
            store.epoch += 1
            store.version += 1
    return len(rts)
