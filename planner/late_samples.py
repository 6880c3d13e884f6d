"""Late samples: live samples that are not newer than their series' last folded sample.

They reach the summarizer when storage accepts them (an out-of-order window is configured) or when two
batches of one series are appended concurrently and reach the sinks in the other order; the ingest
pipeline only hands *accepted* samples to sinks, so a late sample is always in raw storage already.

* Sketch payloads (KLL, REQ) are order-independent: the sample is added to its pane's sketch
  (``fold_late_sketch``), and cached merges of that pane are invalidated by the store.
* Exact payloads are order-independent in their moments but not in first/last and the counter state
  (a sample inserted between two others changes which pair is a reset or a change, and the entry pair
  of the next pane). So the affected panes are rebuilt from raw storage (``rebuild_exact``): for each
  affected series the panes from its oldest to its newest late sample are cleared and refolded from a
  storage read (one per series when few are affected, else one scope read), chained to the last sample
  of the previous non-empty pane, and the entry pair of the next non-empty pane is recomputed. The
  rebuild reproduces exactly what raw evaluation sees, so a late sample never makes an ``exact`` answer
  wrong.

The rebuild never reaches below ``floor_ms`` (the part of history the backfill has already folded, or
the live start while the first backfill chunk is still pending), so backfill and rebuild never fold
the same sample twice.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from planner.exact_store import _blank  # noqa: PLC2701 - the store's own blank values
from storage.matchers import Matcher
from storage.stale import is_stale

INT64_MIN = np.iinfo(np.int64).min
PER_SERIES_READS = 16  # up to this many affected series: one storage read each, else one scope read
READ_MAX = np.iinfo(np.int64).max // 2


def fold_late_sketch(store: Any, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
    """Order-independent sketch panes: the late samples are simply added to their panes."""
    store.ingest_sorted(sid, ts, vals, live=True)


def rebuild_exact(sds: Any, storage: Any, sid: np.ndarray, ts: np.ndarray, floor_ms: int) -> int:
    """Rebuild the exact panes that hold the late samples ``sid``/``ts`` (sorted by series, then time).

    Per affected series the span of panes from its oldest to its newest late sample is cleared and
    refolded from raw storage (samples up to the series' last folded one: anything newer has not reached
    the summarizer yet and will be folded when it does), chained to the last sample of the previous
    non-empty pane; then the entry pair of the first non-empty pane after the span is recomputed from
    the span's new last sample, and the live chain is left as it was (its last sample is unchanged).
    Returns the raw samples refolded.
    """
    store = sds.store
    P = sds.spec.pane_ms
    first = np.ones(len(sid), bool)
    first[1:] = sid[1:] != sid[:-1]
    last = np.append(first[1:], True)
    aff = sid[first]
    start_ms = np.maximum(ts[first] // P * P, floor_ms)  # per affected series: the span it rebuilds
    span_hi = ts[last] // P  # last pane of the span
    with store.lock:
        chain_t = store.last_t[aff].copy()
        chain_v = store.last_v[aff].copy()
    # a series never folded before (its first samples arrive late) has no chain: rebuild its whole span.
    # Otherwise up to its last folded sample -- or up to its newest late sample where that is newer (a
    # sample older than the live start but newer than the chain the backfill left): storage holds it.
    never = chain_t == INT64_MIN
    newest_late = ts[last]
    end_ms = np.where(never, (span_hi + 1) * P - 1,
                      np.minimum((span_hi + 1) * P - 1, np.maximum(chain_t, newest_late)))
    if len(aff) <= PER_SERIES_READS:
        # few affected series: one read per series over its span (label-equality matchers may also
        # match series with more labels: only the series itself is kept, nothing else is registered)
        parts = []
        for s, a0, b0 in zip(aff.tolist(), start_ms.tolist(), end_ms.tolist()):
            ms = [Matcher(n, "=", v) for n, v in sds.registry.labels[s]]
            parts.append((storage.select(ms, int(a0), int(b0)), s))
    else:  # many: one read of the whole scope over the union of the spans, filtered below
        parts = [(storage.select(sds.spec.scope_matchers(), int(start_ms.min()), int(end_ms.max())), None)]
    n_reg = len(sds.registry.labels) + 1
    lo_of = np.full(n_reg, READ_MAX, np.int64)
    hi_of = np.full(n_reg, INT64_MIN, np.int64)
    lo_of[aff] = start_ms
    hi_of[aff] = end_ms
    sid_p, ts_p, val_p = [], [], []
    for ss, only in parts:
        if not len(ss):
            continue
        if only is not None:
            ids = np.array([only if lbl == sds.registry.labels[only] else n_reg - 1 for lbl in ss.labels], np.int64)
        else:
            ids = np.array([sds.registry.index.get(lbl, n_reg - 1) for lbl in ss.labels], np.int64)
            ids = np.minimum(ids, n_reg - 1)
        rs = np.repeat(ids, np.diff(ss.offsets))
        keep = (ss.timestamps >= lo_of[rs]) & (ss.timestamps <= hi_of[rs]) & ~is_stale(ss.values)
        sid_p.append(rs[keep])
        ts_p.append(ss.timestamps[keep])
        val_p.append(ss.values[keep])
    rsid = np.concatenate(sid_p) if sid_p else np.empty(0, np.int64)
    rts = np.concatenate(ts_p) if ts_p else np.empty(0, np.int64)
    rvals = np.concatenate(val_p) if val_p else np.empty(0)
    order = np.lexsort((rts, rsid))
    rsid, rts, rvals = rsid[order], rts[order], rvals[order]
    with store.lock:
        # per affected series (not per sample): clear its span, chain it to the sample before the span
        for s, a0, k1 in zip(aff.tolist(), start_ms.tolist(), span_hi.tolist()):
            c0 = max(a0 // P - store.k0, 0)
            c1 = min(k1 - store.k0 + 1, store.nk)
            if c0 < c1:
                store.note_written(c0 + store.k0)
                for f in store.fields:
                    store.cols[f][s, c0:c1] = _blank(f, (1, c1 - c0))[0]
            prev = np.nonzero(store.cols["count"][s, :min(c0, store.nk)] > 0)[0]
            if len(prev):
                store.last_t[s] = store.cols["last_t"][s, prev[-1]]
                store.last_v[s] = store.cols["last_v"][s, prev[-1]]
            else:
                store.last_t[s] = INT64_MIN
                store.last_v[s] = np.nan
        store.ingest_sorted(rsid, rts, rvals, live=True)
        # the pane after each span: its entry pair now starts from the span's last sample
        if len(rsid):
            lastr = np.append(rsid[1:] != rsid[:-1], True)
            got_s, got_v = rsid[lastr], rvals[lastr]
            nxt = dict(zip(aff.tolist(), (span_hi + 1).tolist()))
            for k_next in sorted(set(nxt[s] for s in got_s.tolist())):
                m = np.array([nxt[s] == k_next for s in got_s.tolist()])
                store.fix_entries(got_s[m], got_v[m], int(k_next))
        # the chain goes on from the newest folded sample: the old chain end unless a late sample was
        # newer (then the rebuild folded it last); a new series' chain starts at its newest rebuilt sample
        keep_old = ~never & (chain_t >= store.last_t[aff])
        store.last_t[aff[keep_old]] = chain_t[keep_old]
        store.last_v[aff[keep_old]] = chain_v[keep_old]
        store.epoch += 1  # readers caching results over sealed panes must see the rewrite
        store.version += 1
    return len(rts)
