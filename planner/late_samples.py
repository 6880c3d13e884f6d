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
  read, chained to the last sample of the series' previous non-empty pane. The rebuild reproduces
  exactly what raw evaluation sees, so a late sample never makes an ``exact`` answer wrong.

The rebuild never reaches below ``floor_ms`` (the part of history the backfill has already folded, or
the live start while the first backfill chunk is still pending), so backfill and rebuild never fold
the same sample twice.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from planner.exact_store import ALL_FIELDS, _blank  # noqa: PLC2701 - the store's own blank values
from storage.stale import is_stale

INT64_MIN = np.iinfo(np.int64).min
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
    ss = storage.select(sds.spec.scope_matchers(), int(start_ms.min()), READ_MAX)
    ids = sds.register(ss.labels) if len(ss) else np.empty(0, np.int64)
    rsid = np.repeat(ids, np.diff(ss.offsets)) if len(ss) else np.empty(0, np.int64)
    rts = ss.timestamps if len(ss) else np.empty(0, np.int64)
    rvals = ss.values if len(ss) else np.empty(0)
    from_ms = np.full(len(sds.registry.labels) + 1, READ_MAX, np.int64)
    from_ms[aff] = start_ms
    keep = (rts >= from_ms[rsid]) & ~is_stale(rvals) if len(rts) else np.zeros(0, bool)
    rsid, rts, rvals = rsid[keep], rts[keep], rvals[keep]
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
