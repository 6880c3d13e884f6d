"""``op by (L) (func(sel[range]))`` at every step from a ``group`` SDS plus raw edge samples.

Windows split as for per-series summaries (``planner/window.py``): whole covered panes come from the
group panes (G groups instead of S series), the two raw edges are read per series and reduced into
their groups; then the SDS groups are coarsened to the query's ``by (L)`` (L within the grouping).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.algorithms import exact as ex
from planner.normalize import GROUP_PAIRS
from planner.pane_ranges import range_stats
from planner.raw_segments import RawPrefix
from planner.served_functions import SERVED as SERVED_FUNCTIONS
from planner.sds import SDS
from planner.summary_scan import RawSource, ScanResult, _read_raw
from planner.window import plan_windows
from storage.labels import make_labels
from storage.matchers import Matcher

SERVED = GROUP_PAIRS  # (aggregation, function) pairs whose value is a function of merged group panes


def _to_groups(arr: np.ndarray, gsel: np.ndarray, G: int, fn: np.ufunc, init: float) -> np.ndarray:
    out = np.full((G, arr.shape[1]), init, dtype=np.float64 if arr.dtype.kind == "f" else arr.dtype)
    if len(gsel):
        fn.at(out, gsel, arr)
    return out


def scan_group(sds: SDS, source: RawSource, matchers: Sequence[Matcher], op: str, func: str, by: Sequence[str],
               ends: np.ndarray, range_ms: int) -> ScanResult | None:
    """With an answer cache: steps whose whole window lies in sealed panes are kept per (query shape,
    step time) and reused while provably unchanged -- same store ``epoch`` (bumped by any write into a
    pane behind the newest one: backfill, late or lagging samples, restores), same coverage start and
    the same registered series -- so a dashboard refresh computes only its new steps."""
    store = sds.store
    cov = sds.coverage()
    ends = np.asarray(ends, np.int64)
    stamp = (store.epoch, cov[0], len(sds.registry.labels))
    base = (op, func, tuple(by), int(range_ms), tuple(sorted(str(m) for m in matchers)))
    sealed_ms = cov[1] * sds.spec.pane_ms
    cached: dict[int, dict] = {}
    with store.lock:
        for j, e in enumerate(ends.tolist()):
            hit = store.answers.get((base, e))
            if hit is not None and hit[0] == stamp:
                cached[j] = hit[1]
    need = np.array([j for j in range(len(ends)) if j not in cached], np.int64)
    fresh = _scan_group(sds, source, matchers, op, func, by, ends[need], range_ms, cov) if len(need) else None
    if len(need) and fresh is None:
        return None  # not within the exactness bound (``_scan_group``)
    rows: dict = {}
    if fresh is not None:
        for i, lbl in enumerate(fresh.labels):
            rows.setdefault(lbl, {})
            for jj in np.nonzero(fresh.present[i])[0].tolist():
                rows[lbl][int(need[jj])] = float(fresh.values[i, jj])
        with store.lock:
            for jj, j in enumerate(need.tolist()):
                e = int(ends[j])
                if e < sealed_ms:  # whole window in sealed panes (or older): reusable while the stamp holds
                    ans = {lbl: float(fresh.values[i, jj]) for i, lbl in enumerate(fresh.labels) if fresh.present[i, jj]}
                    store.answers[(base, e)] = (stamp, ans)
                    store.answers.move_to_end((base, e))
            while len(store.answers) > ANSWER_CACHE_ENTRIES:
                store.answers.popitem(last=False)
    for j, ans in cached.items():
        for lbl, v in ans.items():
            rows.setdefault(lbl, {})[j] = v
    T = len(ends)
    labels = list(rows)
    vals = np.zeros((len(labels), T))
    present = np.zeros((len(labels), T), bool)
    for i, lbl in enumerate(labels):
        for j, v in rows[lbl].items():
            vals[i, j] = v
            present[i, j] = True
    return ScanResult(labels, vals, present, raw_samples=fresh.raw_samples if fresh is not None else 0,
                      summary_panes=fresh.summary_panes if fresh is not None else 0,
                      info={"cached_steps": len(cached)})


ANSWER_CACHE_ENTRIES = 50_000


def _scan_group(sds: SDS, source: RawSource, matchers: Sequence[Matcher], op: str, func: str, by: Sequence[str],
                ends: np.ndarray, range_ms: int, cov: tuple[int, int]) -> ScanResult | None:
    store = sds.store
    P = sds.spec.pane_ms
    cov_lo, cov_hi = cov
    plan = plan_windows(ends, range_ms, P, cov_lo, cov_hi)
    sel, raw = _read_raw(sds, source, matchers, plan)
    T = len(ends)
    with store.lock:
        G = len(store.group_keys)
        gsel = store.gid_of[sel]
        gshift = np.nan_to_num(store.gshift[:G], nan=0.0)
        keys = list(store.group_keys)
    fields = SERVED_FUNCTIONS[func].needs
    pre = RawPrefix(raw, gshift[gsel] if len(sel) else np.zeros(0), fields)
    left, right = pre.stats(*plan.left), pre.stats(*plan.right)
    tot = ex.SegStats.empty((G, T))
    for f in ("count", "nnan", "npinf", "nninf"):
        if f in fields or f == "count":
            setattr(tot, f, _to_groups(getattr(left, f) + getattr(right, f), gsel, G, np.add, 0))
    if "s1" in fields:
        tot.s1 = _to_groups(left.s1 + right.s1, gsel, G, np.add, 0.0)
    for f, fn in (("vmin", np.fmin), ("vmax", np.fmax)):
        if f in fields:
            setattr(tot, f, _to_groups(fn(getattr(left, f), getattr(right, f)), gsel, G, fn, np.nan))
    has_mid = plan.khi > plan.klo
    if has_mid.any() and G:
        ka, kb = int(plan.klo[has_mid].min()), int(plan.khi[has_mid].max())
        panes = store.pane_arrays(np.arange(G), ka, kb)
        mid = range_stats(panes, np.where(has_mid, plan.klo - ka, 0), np.where(has_mid, plan.khi - ka, 0), fields)
        for f in ("count", "nnan", "npinf", "nninf", "s1"):
            if f in fields or f == "count":
                setattr(tot, f, getattr(tot, f) + getattr(mid, f))
        with np.errstate(invalid="ignore"):
            if "vmin" in fields:
                tot.vmin = np.fmin(tot.vmin, mid.vmin)
            if "vmax" in fields:
                tot.vmax = np.fmax(tot.vmax, mid.vmax)
    check = SERVED_FUNCTIONS[func].precise
    if check is not None and not check(tot, gshift[:, None]):
        return None  # group sums past the float range or cancelling: the raw path answers
    present_g = tot.count > 0
    if func == "sum_over_time":
        val_g = ex.sum_values(tot, gshift[:, None])
    elif func == "count_over_time":
        val_g = tot.count.astype(np.float64)
    elif func == "max_over_time":
        val_g = tot.vmax
    else:
        val_g = tot.vmin
    # coarsen the SDS groups to the query's by (L)
    pos = [sds.spec.grouping.index(lb) for lb in by]
    out_keys: dict[tuple[str, ...], int] = {}
    gout = np.array([out_keys.setdefault(tuple(k[p] for p in pos), len(out_keys)) for k in keys], np.int64)
    O = len(out_keys)
    vals = np.where(present_g, val_g, np.nan if op != "sum" else 0.0)
    if op == "sum":
        out_v = _to_groups(np.where(present_g, val_g, 0.0), gout, O, np.add, 0.0)
    elif op == "max":
        out_v = _to_groups(vals, gout, O, np.fmax, np.nan)
    else:
        out_v = _to_groups(vals, gout, O, np.fmin, np.nan)
    out_p = _to_groups(present_g.astype(np.int64), gout, O, np.add, 0) > 0
    labels = [make_labels(zip(by, k)) for k in out_keys]
    keep = out_p.any(axis=1)
    return ScanResult([l for l, kp in zip(labels, keep) if kp], out_v[keep], out_p[keep],
                      raw_samples=len(raw.ts), summary_panes=plan.summary_panes)
