"""The sketch scans of fixed-scope SDSs: distinct counts from CPC panes (``scan_distinct``) and top-k by
sample count from frequent-items panes (``scan_topk``). ``planner/rewrite_rules.py`` decides when they
answer; ``planner/group_scan.py`` holds the exact group-pane scan beside them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.distinct_store import cpc_sketch, cpc_union
from planner.raw_segments import RawPrefix
from planner.sds import SDS
from planner.summary_scan import RawSource, ScanResult, _read_raw
from planner.topk_store import frequent_strings_sketch, provable_topk
from planner.window import plan_windows
from storage.matchers import Matcher


def scan_distinct(sds: SDS, source: RawSource, matchers: Sequence[Matcher], ends: np.ndarray, range_ms: int) -> ScanResult:
    """Distinct items (label tuples / series) with a sample in each window: union of the cached dyadic
    pane sketches and the items of the series in the raw edges (per step x item Python: bounded by
    the number of distinct items in the edges, never per sample)."""
    store = sds.store
    cov_lo, cov_hi = sds.coverage()
    ends = np.asarray(ends, np.int64)
    T = len(ends)
    # sealed steps are reused across refreshes while the store epoch, coverage start and series hold
    stamp = (store.epoch, cov_lo, len(sds.registry.labels))
    base = (int(range_ms), tuple(sorted(str(m) for m in matchers)))
    vals = np.zeros((1, T))
    present = np.zeros((1, T), bool)
    need = []
    with store.lock:
        for j, e in enumerate(ends.tolist()):
            hit = store.answers.get((base, e))
            if hit is not None and hit[0] == stamp:
                if hit[1] is not None:
                    vals[0, j], present[0, j] = hit[1], True
            else:
                need.append(j)
    need_a = np.asarray(need, np.int64)
    plan = plan_windows(ends[need_a], range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    if not len(need_a):
        return ScanResult([()], vals, present, info={"cached_steps": T})
    sel, raw = _read_raw(sds, source, matchers, plan)
    S = len(sel)
    pre = RawPrefix(raw, np.zeros(S), frozenset({"count"}))
    llo, lhi = pre.bounds(*plan.left)
    rlo, rhi = pre.bounds(*plan.right)
    edge = (lhi > llo) | (rhi > rlo)  # (S, len(need)) series with a raw edge sample in the window
    with store.lock:
        item_of = store.item_of[sel] if S else np.zeros(0, np.int64)
        hashes = np.asarray(store.items, dtype=np.int64)
    klo, khi = plan.klo.tolist(), plan.khi.tolist()
    sealed_ms = cov_hi * sds.spec.pane_ms
    done = []
    for jj, j in enumerate(need):
        parts = store.range_parts(klo[jj], khi[jj]) if khi[jj] > klo[jj] else []
        its = np.unique(item_of[edge[:, jj]]) if S else np.zeros(0, np.int64)
        its = its[its >= 0]
        est = None
        if parts or len(its):
            u = cpc_union(store.lg_k)
            for p in parts:
                u.update(p)
            if len(its):
                e = cpc_sketch(store.lg_k)
                for h in hashes[its].tolist():
                    e.update(h)
                u.update(e)
            res = u.get_result()
            if not res.is_empty():
                est = float(round(res.get_estimate()))  # a count: the estimate rounded to an integer
                present[0, j], vals[0, j] = True, est
        if int(ends[j]) < sealed_ms:
            done.append((int(ends[j]), est))
    with store.lock:
        for e, est in done:
            store.answers[(base, e)] = (stamp, est)
            store.answers.move_to_end((base, e))
        while len(store.answers) > 50_000:
            store.answers.popitem(last=False)
    return ScanResult([()], vals, present, raw_samples=len(raw.ts), summary_panes=plan.summary_panes,
                      info={"cached_steps": T - len(need)})


def scan_topk(sds: SDS, source: RawSource, matchers: Sequence[Matcher], k: int, ends: np.ndarray,
              range_ms: int) -> ScanResult | None:
    """Top-k items by samples in each window (merged pane sketches + raw edge counts per item); None
    when some step's top-k set is not provable from the sketch's bounds (the caller goes raw)."""
    store = sds.store
    cov_lo, cov_hi = sds.coverage()
    plan = plan_windows(ends, range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    sel, raw = _read_raw(sds, source, matchers, plan)
    S, T = len(sel), len(ends)
    pre = RawPrefix(raw, np.zeros(S), frozenset({"count"}))
    llo, lhi = pre.bounds(*plan.left)
    rlo, rhi = pre.bounds(*plan.right)
    edge = (lhi - llo) + (rhi - rlo)  # (S, T) raw edge samples per series and step
    with store.lock:
        item_of = store.item_of[sel] if S else np.zeros(0, np.int64)
        texts = list(store.items)
    rows: dict[str, int] = {}
    vals: list[np.ndarray] = []
    present: list[np.ndarray] = []
    klo, khi = plan.klo.tolist(), plan.khi.tolist()
    for j in range(T):
        sk = frequent_strings_sketch(store.lg_max)
        for p in (store.range_parts(klo[j], khi[j]) if khi[j] > klo[j] else []):
            sk.merge(p)
        m = (edge[:, j] > 0) & (item_of >= 0) if S else np.zeros(0, bool)
        if m.any():
            per_item = np.bincount(item_of[m], weights=edge[m, j])
            for it in np.nonzero(per_item)[0].tolist():  # per distinct item in the edges
                sk.update(texts[it], int(per_item[it]))
        if sk.is_empty():
            continue
        top = provable_topk(sk, k)
        if top is None:
            return None
        for text, est in top:
            r = rows.get(text)
            if r is None:
                r = rows[text] = len(vals)
                vals.append(np.zeros(T))
                present.append(np.zeros(T, bool))
            vals[r][j] = est
            present[r][j] = True
    labels = [store.item_labels(t) for t in rows]
    return ScanResult(labels, np.array(vals).reshape(len(labels), T), np.array(present, bool).reshape(len(labels), T),
                      raw_samples=len(raw.ts), summary_panes=plan.summary_panes)
