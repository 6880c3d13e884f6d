"""Answer ``func(selector[range])`` at every step from an SDS plus raw edge samples.

For each step the window splits into raw left edge + whole covered panes + raw right edge
(``planner/window.py``). Raw edges are read from storage in a few reads chosen by a cost model
(``window.coalesce_reads``: gaps in sparse data are read through, dense stretches between edges are
not); exact algorithms merge the three parts with ``combine`` (so they equal the raw answer), KLL
merges the cached pane-range sketch with the edge samples.

Step cache (exact algorithms): a refreshed dashboard asks again for the same step times, shifted by a
step or two. The answers of steps whose whole window lies in sealed panes are kept per (function,
matchers, range) and reused, so a refresh only computes its new steps. A cached step is reused only
while it provably equals a recomputation: same store ``epoch`` (no write since into a pane the step
relied on -- late samples, lagging series, restores bump it), coverage not shrunk (backfill growing it
into the past keeps entries: their windows took that part from raw edges) and the same registered
series; otherwise the entry is dropped. Reuse is reported in the
query's infos (``rewrite.RewriteHook._report``) and in the plan's ``step_cache`` stats.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from planner.algorithms import exact as ex
from planner.grid_admission import GridAdmission
from planner.raw_segments import RawPrefix, RawSamples
from planner.served_functions import SERVED
from planner.sds import SDS
from planner.window import WindowPlan, coalesce_reads, plan_windows
from promql.eval_context import SeriesScope
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


def edge_density(sds: SDS) -> tuple[int, np.ndarray] | None:
    """(first pane, samples per pane over the SDS's series) for the read cost model (every pane store
    keeps these totals: ``PaneStore.pane_totals``)."""
    return sds.store.pane_totals()


def _read_raw(sds: SDS, source: RawSource, matchers: Sequence[Matcher], plan: WindowPlan,
              max_reads: int | None = None, scope: SeriesScope | None = None) -> tuple[np.ndarray, RawSamples]:
    """Read the raw edges (in the reads ``coalesce_reads`` picks, or <= max_reads), register their series.

    Returns (global ids of the selected series, raw samples keyed by position in that list). Each read
    comes back sorted per series; blocks are put in (series, time) order with a block-level sort and
    one gather -- no sort over samples.
    """
    blocks_sid, blocks_read, blocks_start, blocks_len = [], [], [], []
    ts_parts, val_parts = [], []
    base = 0
    iv = plan.raw_intervals()
    if max_reads is not None:
        from planner.window import merge_intervals

        reads = merge_intervals(iv, max_reads)
    else:
        reads = coalesce_reads(iv, sds.spec.pane_ms, edge_density(sds) if len(iv) > 1 else None)
    for r, (lo, hi) in enumerate(reads):
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
    sel = sds.registry.match(matchers, scope)  # includes series first seen in the reads
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
    in_order = len(bstart) > 0 and int(bstart[0]) == 0 and int(blen.sum()) == base and \
        bool((bstart[1:] == bstart[:-1] + blen[:-1]).all())
    if in_order:  # one read whose series come in local order: no gather needed
        ts = np.concatenate(ts_parts) if len(ts_parts) > 1 else ts_parts[0]
        vals = np.concatenate(val_parts) if len(val_parts) > 1 else val_parts[0]
    else:
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


class _Entry:
    __slots__ = ("ends", "vals", "present", "sel", "epoch", "cov_lo", "nreg", "uses")

    def __init__(self, ends: np.ndarray, vals: np.ndarray, present: np.ndarray, sel: np.ndarray, epoch: int,
                 cov_lo: int, nreg: int, uses: deque | None = None):
        self.ends, self.vals, self.present, self.sel = ends, vals, present, sel
        self.epoch, self.cov_lo, self.nreg = epoch, cov_lo, nreg
        self.uses = uses if uses is not None else deque(maxlen=64)  # (monotonic s, first step asked)


class StepCache:
    """Per-SDS answers of sealed steps, keyed (function, matchers, range, grid); LRU over keys. A key
    keeps the steps its recent uses ask for (from the earliest first step asked in the last
    ``USE_WINDOW_S``), at most ``max_steps``; a key of a grid off its step's multiples is kept from
    its second use on (``planner/grid_admission.py``; callers ask ``admits`` before ``put``)."""

    USE_WINDOW_S = 600.0

    def __init__(self, max_keys: int = 128, max_steps: int = 4096, max_bytes: int = 64 << 20):
        self.max_keys = max_keys
        self.max_steps = max_steps
        self.max_bytes = max_bytes  # least recently used keys go first beyond this
        self.nbytes = 0
        self.d: OrderedDict[tuple, _Entry] = OrderedDict()
        self.lock = threading.Lock()
        self.admission = GridAdmission()
        self.hits = 0  # steps answered from the cache
        self.computed = 0  # steps computed (summary + raw edges)
        self.invalidations = 0

    def get(self, key: tuple, epoch: int, cov_lo: int, nreg: int) -> _Entry | None:
        with self.lock:
            e = self.d.get(key)
            if e is None:
                return None
            if e.epoch != epoch or cov_lo > e.cov_lo or e.nreg != nreg:  # coverage may only grow into the past
                self.nbytes -= _size(self.d.pop(key))
                self.invalidations += 1
                return None
            self.d.move_to_end(key)
            return e

    def admits(self, key: tuple, entry: _Entry | None) -> bool:
        """Whether answers for ``key`` (whose entry the caller read: ``entry``) are worth keeping; asked
        once per query, before ``put``."""
        return entry is not None or self.admission.admit(key, aligned=key[-1] == ())

    def used(self, e: _Entry, first_end: int) -> None:
        """A query asked ``e``'s key for steps from ``first_end`` on (what ``put`` keeps)."""
        e.uses.append((time.monotonic(), int(first_end)))

    def put(self, key: tuple, old: _Entry | None, ends: np.ndarray, vals: np.ndarray, present: np.ndarray,
            sel: np.ndarray, epoch: int, cov_lo: int, nreg: int, first_end: int | None = None) -> None:
        """Add the answers of ``ends`` to ``old`` (the key's entry the caller read, or None) and keep
        the steps recent uses still ask for; ``first_end``: the first step this use asked for."""
        if len(ends) == 0:
            return
        uses = old.uses if old is not None else deque(maxlen=64)
        uses.append((time.monotonic(), int(ends[0] if first_end is None else first_end)))
        if old is not None:
            ends = np.concatenate([old.ends, ends])
            vals = np.concatenate([old.vals, vals], axis=1)
            present = np.concatenate([old.present, present], axis=1)
        recent = time.monotonic() - self.USE_WINDOW_S
        floor = min(f for w, f in list(uses) if w >= recent)  # a snapshot: other readers append
        order = np.argsort(ends, kind="stable")
        order = order[ends[order] >= floor][-self.max_steps:]
        e = _Entry(ends[order], vals[:, order], present[:, order], sel, epoch, cov_lo, nreg, uses)
        with self.lock:
            prev = self.d.pop(key, None)
            if prev is not None:
                self.nbytes -= _size(prev)
            self.d[key] = e
            self.nbytes += _size(e)
            while len(self.d) > 1 and (len(self.d) > self.max_keys or self.nbytes > self.max_bytes):
                self.nbytes -= _size(self.d.popitem(last=False)[1])

    def describe(self) -> dict[str, Any]:
        return {"keys": len(self.d), "steps_reused": self.hits, "steps_computed": self.computed,
                "invalidations": self.invalidations, "bytes": int(self.nbytes), "unkept": self.admission.refused}


def _size(e: _Entry) -> int:
    return int(e.vals.nbytes + e.present.nbytes + e.ends.nbytes + e.sel.nbytes)


_CACHE_LOCK = threading.Lock()


def step_cache(store: Any) -> StepCache:
    """The exact store's step cache (created on first use), whose entries hold while its ``epoch``
    stays (the exact scans are its only users)."""
    c = store.step_cache
    if c is None:
        with _CACHE_LOCK:
            c = store.step_cache
            if c is None:
                c = store.step_cache = StepCache()
    return c


def arm(sds: SDS) -> tuple[int, int, int, int]:
    """Before computing anything that may be cached: declare the panes it relies on (so any later write
    into them bumps the epoch) and read (cov_lo, cov_hi, epoch, registered series) after that."""
    cov_lo, cov_hi = sds.coverage()
    store = sds.store
    with store.lock:
        store.seal_mark = max(store.seal_mark, cov_hi)
        store.cache_floor = min(store.cache_floor, cov_lo)
        return cov_lo, cov_hi, store.epoch, len(sds.registry.labels)


def _key(func: str, matchers: Sequence[Matcher], range_ms: int, scope: SeriesScope | None, ends: np.ndarray) -> tuple:
    """A step cache entry's key: its rows are the series of this selection; steps on multiples of the
    step (as Grafana aligns them) share one entry whatever the step, so a 1 h panel at 15 s and a 24 h
    one at 60 s meet each other's steps; every other grid has its own (its steps meet no other grid's),
    named by its last element (``()`` for the shared one)."""
    return (func, tuple(matchers), int(range_ms), None if scope is None else scope.key, grid_phase(ends))


def grid_phase(ends: np.ndarray) -> tuple[int, ...]:
    """``()`` for an instant or for a grid on multiples of its step, else ``(step, phase)``."""
    if len(ends) < 2:
        return ()
    step = int(ends[1] - ends[0])
    phase = int(ends[0]) % step if step > 0 else 0
    return (step, phase) if phase else ()


def cached_mask(sds: SDS, matchers: Sequence[Matcher], func: str, ends: np.ndarray, range_ms: int,
                scope: SeriesScope | None = None, cov_lo: int | None = None) -> np.ndarray:
    """Which of ``ends`` the step cache would answer now (for the rewrite's cost check; ``cov_lo``:
    the coverage start the caller just read)."""
    ends = np.asarray(ends, np.int64)
    cache = step_cache(sds.store)
    if cov_lo is None:
        cov_lo, _ = sds.coverage()
    e = cache.get(_key(func, matchers, range_ms, scope, ends), sds.store.epoch, cov_lo, len(sds.registry.labels))
    if e is None or not len(e.ends):
        return np.zeros(len(ends), bool)
    pos = np.minimum(np.searchsorted(e.ends, ends), len(e.ends) - 1)
    return e.ends[pos] == ends


def fill_from_raw(sds: SDS, matchers: Sequence[Matcher], func: str, ends: np.ndarray, range_ms: int, val: Any,
                  armed: tuple[int, int, int, int], scope: SeriesScope | None = None) -> int:
    """Keep the sealed steps of a raw-path answer ``val`` (VectorSteps of ``func(sel[range])`` at
    ``ends``) in the step cache; returns the steps kept. ``armed`` = ``arm(sds)`` taken before the raw
    evaluation started. Skipped unless every answered series is one of the SDS's registered series in
    its ``matchers`` selection (the cache holds rows per series)."""
    store = sds.store
    cache = step_cache(store)
    if getattr(val, "hist", None) is not None:
        return 0
    ends = np.asarray(ends, np.int64)
    cov_lo, cov_hi, epoch, nreg = armed
    sealed = ends < cov_hi * sds.spec.pane_ms
    key = _key(func, matchers, range_ms, scope, ends)
    if not sealed.any() or len(ends) < 2:  # instant queries (rules) move on every evaluation
        return 0
    entry = cache.get(key, epoch, cov_lo, nreg)
    if not cache.admits(key, entry):
        return 0
    sel = sds.registry.match(matchers, scope)
    row = {int(g): i for i, g in enumerate(sel.tolist())}
    index = sds.registry.index
    rows = []
    for lbl in val.labels:  # per answered series
        g = index.get(lbl)
        r = row.get(g) if g is not None else None
        if r is None:
            return 0
        rows.append(r)
    S = len(sel)
    vals = np.zeros((S, int(sealed.sum())))
    present = np.zeros((S, int(sealed.sum())), bool)
    if rows:
        ri = np.asarray(rows, np.int64)
        vals[ri] = val.values[:, sealed]
        present[ri] = val.present[:, sealed]
    if store.epoch != epoch or len(sds.registry.labels) != nreg:
        return 0
    e_ends = ends[sealed]
    if entry is not None and len(entry.ends):  # keep only steps the entry does not hold yet
        pos = np.minimum(np.searchsorted(entry.ends, e_ends), len(entry.ends) - 1)
        new = entry.ends[pos] != e_ends
        e_ends, vals, present = e_ends[new], vals[:, new], present[:, new]
    cache.put(key, entry, e_ends, vals, present, sel, epoch, cov_lo, nreg, first_end=int(ends[0]))
    return len(e_ends)


def scan_exact(sds: SDS, source: RawSource, matchers: Sequence[Matcher], func: str, ends: np.ndarray,
               range_ms: int, scope: SeriesScope | None = None) -> ScanResult | None:
    """``func(sel[range])`` at ``ends`` from the exact SDS, over the series ``matchers`` select and
    ``scope`` keeps (``source`` must read only those). None where the merged statistics cannot give
    an answer within the exactness bound (``SERVED[func].precise``): the raw path answers those."""
    store = sds.store
    ends = np.asarray(ends, np.int64)
    cache = step_cache(store)
    key = _key(func, matchers, range_ms, scope, ends)
    cov_lo, cov_hi, epoch, nreg = arm(sds)
    entry = cache.get(key, epoch, cov_lo, nreg)
    T = len(ends)
    hit = np.zeros(T, bool)
    pos = np.zeros(T, np.int64)
    if entry is not None and len(entry.ends):
        pos = np.minimum(np.searchsorted(entry.ends, ends), len(entry.ends) - 1)
        hit = entry.ends[pos] == ends
    n_hit = int(hit.sum())
    if n_hit == T:
        cache.used(entry, int(ends[0]))
        res = ScanResult([sds.registry.labels[i] for i in entry.sel], entry.vals[:, pos], entry.present[:, pos])
    else:
        miss = ~hit
        part = _scan_exact(sds, source, matchers, func, ends[miss], range_ms, cov_lo, cov_hi, scope)
        if part is None:
            return None
        if len(sds.registry.labels) != nreg or store.epoch != epoch:
            # series registered by the edge reads, or a write meanwhile: no reuse in this query
            if n_hit:
                part = _scan_exact(sds, source, matchers, func, ends, range_ms, *sds.coverage(), scope)
                if part is None:
                    return None
            part.info.pop("sel", None)
            part.info.update(cached_steps=0, steps=T)
            return part
        sel = part.info.pop("sel")
        if n_hit:
            S = len(sel)
            vals = np.empty((S, T))
            present = np.empty((S, T), bool)
            vals[:, hit], present[:, hit] = entry.vals[:, pos[hit]], entry.present[:, pos[hit]]
            vals[:, miss], present[:, miss] = part.values, part.present
            res = ScanResult(part.labels, vals, present, raw_samples=part.raw_samples, summary_panes=part.summary_panes)
        else:
            res = part
        sealed = ends[miss] < cov_hi * sds.spec.pane_ms
        if sealed.any() and T > 1:  # instant queries (rules) move on every evaluation: nothing to reuse
            if store.epoch == epoch and cache.admits(key, entry):  # nothing it relied on changed meanwhile
                cache.put(key, entry, ends[miss][sealed], part.values[:, sealed], part.present[:, sealed], sel,
                          epoch, cov_lo, nreg, first_end=int(ends[0]))
    cache.hits += n_hit
    cache.computed += T - n_hit
    res.info["cached_steps"] = n_hit
    res.info["steps"] = T
    return res


def window_plan(sds: SDS, matchers: Sequence[Matcher], ends: np.ndarray, range_ms: int, cov_lo: int,
                cov_hi: int, scope: SeriesScope | None = None) -> WindowPlan:
    """Which panes and raw edges answer each window: what the scan reads and the cost check weighs.

    The rewrite's cost check and the scan that follows ask for the same plans (the query's windows,
    and a refresh's windows the step cache does not hold): the recent ones are kept, keyed by
    everything they depend on (the windows, the coverage, the selected series and the store's epoch
    of sealed-pane writes)."""
    exact = sds.algorithm.exact  # per-series exact panes: aligned window bounds may take whole panes
    ends = np.asarray(ends, np.int64)
    key = (sds.id, id(sds.store), tuple(matchers), int(range_ms), int(cov_lo), int(cov_hi), len(sds.registry.labels),
           sds.store.epoch if exact else 0, None if scope is None else scope.key,
           ends.tobytes())  # the store's identity: a re-adopted plan has the same id
    with _plans_lock:
        plan = _recent_plans.get(key)
        if plan is not None:
            _recent_plans.move_to_end(key)
            return plan
    plan = plan_windows(ends, range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    if exact:
        plan = snap_aligned_edges(plan, sds.store, sds.registry.match(matchers, scope), sds.spec.pane_ms, cov_lo, cov_hi)
    with _plans_lock:
        _recent_plans[key] = plan
        while len(_recent_plans) > _RECENT_PLANS:
            _recent_plans.popitem(last=False)
    return plan


_RECENT_PLANS = 64
_recent_plans: OrderedDict[tuple, WindowPlan] = OrderedDict()
_plans_lock = threading.Lock()


def snap_aligned_edges(plan: WindowPlan, store: Any, sel: np.ndarray, pane_ms: int, cov_lo: int,
                       cov_hi: int) -> WindowPlan:
    """Windows whose bounds fall on pane boundaries (Grafana aligns steps; a pane that divides the step
    and the range makes every window such) need no raw edges. A window ``(start, end]`` with
    ``start = k*P`` holds all of pane k but a sample at exactly ``start``; one with ``end = m*P`` holds
    of pane m only a sample at exactly ``end``. Each pane's first sample time says whether such a sample
    exists: where no selected series has one, pane k joins the summary part and the edge read goes;
    where one does, that step keeps its raw edge (so answers stay exact)."""
    P = int(pane_ms)
    has = plan.khi > plan.klo
    k0 = plan.start // P
    m = plan.end // P
    left = has & (plan.start % P == 0) & (plan.klo == k0 + 1) & (k0 >= cov_lo)
    right = has & (plan.end % P == 0) & (plan.khi == m) & (m < cov_hi)
    if not (left.any() or right.any()):
        return plan
    nl = int(left.sum())
    on_edge = store.sample_at(sel, np.concatenate([k0[left], m[right]]),
                              np.concatenate([plan.start[left], plan.end[right]]))
    klo = plan.klo.copy()
    (lx, ly), (rx, ry) = (plan.left[0].copy(), plan.left[1].copy()), (plan.right[0].copy(), plan.right[1])
    if nl:
        idx = np.flatnonzero(left)[~on_edge[:nl]]
        klo[idx] = k0[idx]
        lx[idx], ly[idx] = plan.start[idx] + 1, plan.start[idx]  # empty
    if right.any():
        idx = np.flatnonzero(right)[~on_edge[nl:]]
        rx[idx] = plan.end[idx] + 1  # empty
    return WindowPlan(plan.start, plan.end, klo, plan.khi, (lx, ly), (rx, ry))


# Cells (series x windows) per block of the pane read and the finish: each of their ~40 elementwise
# passes then runs over cache-resident arrays instead of streaming (series x windows)-sized ones
# through memory (a whole 1 h panel of 1,449 series: 1.7-2x faster on the 2-vCPU box).
_BLOCK_CELLS = 1 << 14


def _scan_exact(sds: SDS, source: RawSource, matchers: Sequence[Matcher], func: str, ends: np.ndarray,
                range_ms: int, cov_lo: int, cov_hi: int, scope: SeriesScope | None = None) -> ScanResult | None:
    plan = window_plan(sds, matchers, ends, range_ms, cov_lo, cov_hi, scope)
    sel, raw = _read_raw(sds, source, matchers, plan, scope=scope)
    S, T = len(sel), len(ends)
    store = sds.store
    shift = np.nan_to_num(store.shift[sel], nan=0.0) if S else np.zeros(0)
    fields = SERVED[func].needs
    pre = RawPrefix(raw, shift, fields)
    has_mid = plan.khi > plan.klo
    klo, khi = np.where(has_mid, plan.klo, 0), np.where(has_mid, plan.khi, 0)
    left, right = _edge_stats(pre, *plan.left), _edge_stats(pre, *plan.right)
    check = SERVED[func].precise
    rows_per = max(16, _BLOCK_CELLS // max(T, 1))
    vals, present = np.empty((S, T)), np.empty((S, T), bool)
    for a in range(0, max(S, 1), rows_per):
        b = min(a + rows_per, S)
        if has_mid.any():
            total = store.window_stats(sel[a:b], klo, khi, fields)
        else:
            total = ex.SegStats.empty((b - a, T))
        total = _merge_edge(total, left, a, b, before=True)
        total = _merge_edge(total, right, a, b, before=False)
        if check is not None and not check(total, shift[a:b, None]):
            return None
        vals[a:b], present[a:b] = finish_exact(func, total, shift[a:b, None], plan)
    return ScanResult([sds.registry.labels[i] for i in sel], vals, present,
                      raw_samples=len(raw.ts), summary_panes=plan.summary_panes, info={"sel": sel})


def _edge_stats(pre: RawPrefix, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ex.SegStats] | None:
    """The raw edge runs [x_j, y_j] of the windows that have one (their columns, and every series'
    stats over them); None when none has: Grafana-aligned windows mostly have none
    (``snap_aligned_edges``), and a whole panel's windows then skip the per-window merge."""
    cols = np.flatnonzero(x <= y)
    if not len(cols):
        return None
    return cols, pre.stats(x[cols], y[cols])


def _merge_edge(total: ex.SegStats, edge: tuple[np.ndarray, ex.SegStats] | None, a: int, b: int,
                before: bool) -> ex.SegStats:
    """``total`` (series a..b) with each window's raw edge stats merged in, before or after its panes."""
    if edge is None:
        return total
    cols, e = edge
    e = e.take((slice(a, b), slice(None)))
    if len(cols) == total.count.shape[1]:
        return ex.combine(e, total) if before else ex.combine(total, e)
    sub = total.take((slice(None), cols))
    merged = ex.combine(e, sub) if before else ex.combine(sub, e)
    for f in ex.FIELDS:
        getattr(total, f)[:, cols] = getattr(merged, f)
    return total


def finish_exact(func: str, st: ex.SegStats, shift: np.ndarray, plan: WindowPlan) -> tuple[np.ndarray, np.ndarray]:
    f = SERVED.get(func)
    if f is None or f.finish is None:
        raise ValueError(f"function {func} is not served by the exact algorithm")
    with np.errstate(invalid="ignore", divide="ignore"):
        return f.finish(st, shift, plan)


def scan_kll(sds: SDS, source: RawSource, matchers: Sequence[Matcher], phi: float, ends: np.ndarray,
             range_ms: int, scope: SeriesScope | None = None) -> ScanResult:
    """quantile_over_time(phi, sel[range]) per series and step from a quantile-sketch SDS of either kind
    (KLL, or REQ for tail quantiles): cached pane-range sketch + raw edges, in the store's encoding.

    The store's answer cache is consulted first: raw edges are read and sketches merged only for the
    steps with a missing answer (a dashboard refresh: its new steps). Per (series, step) Python
    (sketch objects) -- bounded by S x T, never per sample.

    Each answer carries the interval of values consistent with the sketch's stated rank error ``eps``
    (``info["lo"]`` / ``info["hi"]``, S x T): the window's quantiles at ranks ``phi -/+ (eps + 1/n)``
    (the extra item covers Prometheus's interpolation between neighbouring samples), widened by the
    float32 rounding of REQ payloads. Where the rank guarantee holds, Prometheus's exact answer lies
    in it; the canary checks that it does.
    """
    cov_lo, cov_hi = sds.coverage()
    ends = np.asarray(ends, np.int64)
    T = len(ends)
    store = sds.store
    cache = store.results  # whole-window answers reused across dashboard refreshes (sealed windows only)
    ends_all = ends.tolist()
    sel0 = sds.registry.match(matchers, scope)
    got: dict[tuple[int, int], tuple[float, float, float]] = {}
    need = np.ones(T, bool)
    if len(sel0):
        need[:] = False
        for gs in sel0.tolist():
            for j, e in enumerate(ends_all):
                v = cache.get((gs, e, range_ms, phi))
                if v is None:
                    need[j] = True
                else:
                    got[(gs, j)] = v
    idx = np.nonzero(need)[0]
    sub = ends[idx]
    plan = plan_windows(sub, range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    if len(sub):
        sel, raw = _read_raw(sds, source, matchers, plan, scope=scope)
    else:
        sel, raw = sel0, RawSamples(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), len(sel0))
    S = len(sel)
    vals = np.full((S, T), np.nan)
    lo_v = np.full((S, T), np.nan)
    hi_v = np.full((S, T), np.nan)
    present = np.zeros((S, T), bool)
    if got:
        row = {g: i for i, g in enumerate(sel.tolist())}
        for (gs, j), (v, a, b) in got.items():
            i = row.get(gs)
            if i is not None:
                present[i, j], vals[i, j], lo_v[i, j], hi_v[i, j] = True, v, a, b
    eps = sds.rank_bound(phi) if 0.0 <= phi <= 1.0 else 0.0
    rounding = sds.algorithm.payload_rounding  # REQ's float32 payload: each item stands for any value within it
    pre = RawPrefix(raw, np.zeros(S), frozenset({"count"}))
    llo, lhi = pre.bounds(*plan.left)
    rlo, rhi = pre.bounds(*plan.right)
    gsid = sel[raw.sid] if len(raw.sid) else np.zeros(0, np.int64)
    with store.lock:  # edge samples in the store's encoding (REQ: float32 of v - c of their series)
        store.ensure_series(len(sds.registry.labels))
        store.choose_shift(gsid, raw.vals)  # a series first seen at the edges
        rv = store.encode(gsid, raw.vals)
    klo = plan.klo.tolist()
    khi = plan.khi.tolist()
    ends_l = plan.end.tolist()
    cols = idx.tolist()
    sealed_ms = cov_hi * sds.spec.pane_ms
    for si in range(S):
        gs = int(sel[si])
        for jj, j in enumerate(cols):
            if present[si, j]:
                continue
            mid = store.range_sketch(gs, klo[jj], khi[jj]) if khi[jj] > klo[jj] else None
            a, b, c, d = llo[si, jj], lhi[si, jj], rlo[si, jj], rhi[si, jj]
            if b == a and d == c:
                if mid is None:
                    continue
                sk = mid
            else:
                sk = store.new_sketch()
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
                vals[si, j] = lo_v[si, j] = hi_v[si, j] = -np.inf
            elif phi > 1:
                vals[si, j] = lo_v[si, j] = hi_v[si, j] = np.inf
            elif np.isnan(phi):
                vals[si, j] = lo_v[si, j] = hi_v[si, j] = np.nan
            else:
                vals[si, j] = store.decode(gs, sk.get_quantile(phi))
                w = eps + 1.0 / max(sk.n, 1)
                a_q, b_q = sk.get_quantile(max(0.0, phi - w)), sk.get_quantile(min(1.0, phi + w))
                if rounding:
                    a_q, b_q = float(a_q) - abs(float(a_q)) * rounding, float(b_q) + abs(float(b_q)) * rounding
                lo_v[si, j], hi_v[si, j] = store.decode(gs, a_q), store.decode(gs, b_q)
            if ends_l[jj] < sealed_ms:
                cache.put((gs, ends_l[jj], range_ms, phi), (float(vals[si, j]), float(lo_v[si, j]), float(hi_v[si, j])))
    return ScanResult([sds.registry.labels[i] for i in sel], vals, present,
                      raw_samples=len(raw.ts), summary_panes=plan.summary_panes,
                      info={"cached_steps": int(T - len(idx)), "steps": T, "lo": lo_v, "hi": hi_v})
