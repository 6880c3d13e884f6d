"""Answer ``func(selector[range])`` at every step from an SDS plus raw edge samples.

For each step the window splits into raw left edge + whole covered panes + raw right edge
(``planner/window.py``). Raw edges are read from storage in a few coalesced reads; exact algorithms
merge the three parts with ``combine`` (so they equal the raw answer), KLL merges the cached pane-range
sketch with the edge samples.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
from datasketches import kll_doubles_sketch

from planner.algorithms import exact as ex
from planner.pane_ranges import range_stats
from planner.raw_segments import NEEDS, RawPrefix, RawSamples
from planner.sds import SDS
from planner.window import WindowPlan, merge_intervals, plan_windows
from storage.labels import Labels
from storage.matchers import Matcher
from storage.stale import is_stale


class RawSource(Protocol):
    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> Any: ...


@dataclass
class ScanResult:
    labels: list[Labels]
    values: np.ndarray  # (S, T)
    present: np.ndarray  # (S, T)
    raw_samples: int = 0
    summary_panes: int = 0
    info: dict[str, Any] = field(default_factory=dict)


def _read_raw(sds: SDS, source: RawSource, matchers: Sequence[Matcher], plan: WindowPlan,
              max_reads: int = 2) -> tuple[np.ndarray, RawSamples]:
    """Read the raw edges (coalesced into <= max_reads reads), register their series.

    Returns (global ids of the selected series, raw samples keyed by position in that list). Each read
    comes back sorted per series; blocks are put in (series, time) order with a block-level sort and
    one gather -- no sort over samples.
    """
    blocks_sid, blocks_read, blocks_start, blocks_len = [], [], [], []
    ts_parts, val_parts = [], []
    base = 0
    for r, (lo, hi) in enumerate(merge_intervals(plan.raw_intervals(), max_reads)):
        ss = source.select(matchers, lo, hi)
        if len(ss) == 0:
            continue
        ids = sds.register(ss.labels)
        blocks_sid.append(ids)
        blocks_read.append(np.full(len(ids), r, np.int64))
        blocks_start.append(ss.offsets[:-1] + base)
        blocks_len.append(np.diff(ss.offsets))
        ts_parts.append(ss.timestamps)
        val_parts.append(ss.values)
        base += len(ss.timestamps)
    sel = sds.registry.match(matchers)  # includes series first seen in the reads
    if not ts_parts:
        return sel, RawSamples(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), len(sel))
    local = np.full(len(sds.registry.labels), -1, np.int64)
    local[sel] = np.arange(len(sel))
    bsid = local[np.concatenate(blocks_sid)]
    bread = np.concatenate(blocks_read)
    bstart = np.concatenate(blocks_start)
    blen = np.concatenate(blocks_len)
    keep = (bsid >= 0) & (blen > 0)
    order = np.lexsort((bread[keep], bsid[keep]))
    bsid, bstart, blen = bsid[keep][order], bstart[keep][order], blen[keep][order]
    idx = _ranges(bstart, blen)
    ts = np.concatenate(ts_parts)[idx] if len(ts_parts) > 1 else ts_parts[0][idx]
    vals = np.concatenate(val_parts)[idx] if len(val_parts) > 1 else val_parts[0][idx]
    sid = np.repeat(bsid, blen)
    fresh = ~is_stale(vals)
    if not fresh.all():
        sid, ts, vals = sid[fresh], ts[fresh], vals[fresh]
    return sel, RawSamples(sid, ts, vals, len(sel))


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated aranges [starts[i], starts[i] + lens[i])."""
    total = int(lens.sum())
    if total == 0:
        return np.empty(0, np.int64)
    out = np.ones(total, np.int64)
    pos = np.zeros(len(lens), np.int64)
    np.cumsum(lens[:-1], out=pos[1:])
    out[0] = starts[0]
    nz = lens > 0
    p, st = pos[nz], starts[nz]
    prev_end = np.concatenate([[0], (starts[nz] + lens[nz])[:-1]])
    out[p[1:]] = st[1:] - prev_end[1:] + 1
    return np.cumsum(out)


def scan_exact(sds: SDS, source: RawSource, matchers: Sequence[Matcher], func: str, ends: np.ndarray,
               range_ms: int) -> ScanResult:
    cov_lo, cov_hi = sds.coverage()
    plan = plan_windows(ends, range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    sel, raw = _read_raw(sds, source, matchers, plan)
    S, T = len(sel), len(ends)
    store = sds.store
    shift = np.nan_to_num(store.shift[sel], nan=0.0) if S else np.zeros(0)
    fields = NEEDS[func]
    pre = RawPrefix(raw, shift, fields)
    left = pre.stats(*plan.left)
    right = pre.stats(*plan.right)
    has_mid = plan.khi > plan.klo
    if has_mid.any():
        ka = int(plan.klo[has_mid].min())
        kb = int(plan.khi[has_mid].max())
        panes = store.pane_arrays(sel, ka, kb, fields)
        mid = range_stats(panes, np.where(has_mid, plan.klo - ka, 0), np.where(has_mid, plan.khi - ka, 0), fields)
        total = ex.combine(ex.combine(left, mid), right)
    else:
        total = ex.combine(left, right)
    vals, present = finish_exact(func, total, shift[:, None], plan)
    return ScanResult([sds.registry.labels[i] for i in sel], vals, present,
                      raw_samples=len(raw.ts), summary_panes=plan.summary_panes)


def finish_exact(func: str, st: ex.SegStats, shift: np.ndarray, plan: WindowPlan) -> tuple[np.ndarray, np.ndarray]:
    present = st.count > 0
    n = st.count.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if func == "count_over_time":
            return n, present
        if func == "sum_over_time":
            return ex.sum_values(st, shift), present
        if func == "avg_over_time":
            return ex.sum_values(st, shift) / n, present
        if func == "min_over_time":
            return st.vmin, present
        if func == "max_over_time":
            return st.vmax, present
        if func == "stdvar_over_time":
            return ex.variance(st), present
        if func == "stddev_over_time":
            return np.sqrt(ex.variance(st)), present
        if func == "last_over_time":
            return st.last_v, present
        if func == "first_over_time":
            return st.first_v, present
        if func == "present_over_time":
            return np.ones_like(n), present
        if func == "resets":
            return st.resets.astype(np.float64), present
        if func == "changes":
            return st.changes.astype(np.float64), present
        if func in ("rate", "increase", "delta"):
            range_s = float((plan.end - plan.start)[0]) / 1000.0 if len(plan.end) else 1.0
            return ex.extrapolated_rate(st, plan.start[None, :].astype(np.float64), plan.end[None, :].astype(np.float64),
                                        range_s, is_counter=func != "delta", is_rate=func == "rate")
    raise ValueError(f"function {func} is not served by the exact algorithm")


def scan_kll(sds: SDS, source: RawSource, matchers: Sequence[Matcher], phi: float, ends: np.ndarray,
             range_ms: int) -> ScanResult:
    """quantile_over_time(phi, sel[range]) per series and step: cached pane-range sketch + raw edges.

    Per (series, step) Python (sketch objects) -- bounded by S x T, never per sample.
    """
    cov_lo, cov_hi = sds.coverage()
    plan = plan_windows(ends, range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    sel, raw = _read_raw(sds, source, matchers, plan)
    S, T = len(sel), len(ends)
    pre = RawPrefix(raw, np.zeros(S), frozenset({"count"}))
    llo, lhi = pre.bounds(*plan.left)
    rlo, rhi = pre.bounds(*plan.right)
    vals = np.full((S, T), np.nan)
    present = np.zeros((S, T), bool)
    store = sds.store
    rv = raw.vals
    klo = plan.klo.tolist()
    khi = plan.khi.tolist()
    ends_l = plan.end.tolist()
    sealed_ms = cov_hi * sds.spec.pane_ms
    cache = store.results  # whole-window answers reused across dashboard refreshes (sealed windows only)
    for si in range(S):
        gs = int(sel[si])
        for j in range(T):
            key = (gs, ends_l[j], range_ms, phi)
            hit = cache.get(key)
            if hit is not None:
                present[si, j], vals[si, j] = True, hit
                continue
            mid = store.range_sketch(gs, klo[j], khi[j]) if khi[j] > klo[j] else None
            a, b, c, d = llo[si, j], lhi[si, j], rlo[si, j], rhi[si, j]
            if b == a and d == c:
                if mid is None:
                    continue
                sk = mid
            else:
                sk = kll_doubles_sketch(store.k)
                if mid is not None:
                    sk.merge(mid)
                if b > a:
                    sk.update(rv[a:b])
                if d > c:
                    sk.update(rv[c:d])
            if sk.is_empty():
                continue
            present[si, j] = True
            if phi < 0:
                vals[si, j] = -np.inf
            elif phi > 1:
                vals[si, j] = np.inf
            elif np.isnan(phi):
                vals[si, j] = np.nan
            else:
                vals[si, j] = sk.get_quantile(phi)
            if ends_l[j] < sealed_ms:
                cache.put(key, float(vals[si, j]))
    return ScanResult([sds.registry.labels[i] for i in sel], vals, present,
                      raw_samples=len(raw.ts), summary_panes=plan.summary_panes)
