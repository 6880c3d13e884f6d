"""Native-histogram awareness of the evaluator: what each consumer does with the histogram plane.

Histogram samples only exist when the source implements ``select_histograms`` (the in-memory
source of the conformance runner); the real storage is float-only, so every function here is
behind an ``is None`` check and the float path pays nothing. Reading the samples and the plane
helpers are in promql/histogram_planes.py. A histogram cell is never ``present`` in the float
plane, so code that does not know histograms ignores them -- which is Prometheus's behaviour for
float-only functions (``abs``, ``clamp``, ``sort``, ``scalar``, date functions...). Consumers where
ignoring is not what Prometheus does are handled here: ``count``/``group``/``absent``/``timestamp``/
set operators see histogram samples; ``min``/``max``/``topk``/... ignore them with an info
annotation; ``sum``/``avg`` over a mix warn; binary operators on histograms follow Prometheus's
type table. What a histogram result would need and is not implemented is refused with an error,
never answered with a wrong value. Per-cell Python appears only on histogram cells.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from promql import parser as pp
from promql.ast_walk import children
from promql.errors import ExecutionError, PromQLError
from promql.eval_histogram_buckets import native_histogram_function, native_histogram_quantiles, trim_histogram
from promql.eval_histogram_rate import detect_reset, interpolate_histograms, rate_with_histograms, resets_with_histograms
from promql.eval_labels import apply_name_drop, drop_metric_name
from promql.functions import FunctionSpec, Histograms
from promql.histogram_planes import (
    align,
    empty_plane,
    has_hist,
    incompatible_binop,
    mixed_aggregation,
    mixed_exponential_custom,
    mixed_floats_histograms,
    mixed_range_ignored,
    reconciled_info,
    strip,
    union_presence,
    unsupported,
    window_counts,
    window_sequence,
    with_hint,
    with_plane,
)
from promql.sample_windows import drop_stale, window_index
from promql.types import FloatHistogram, HistogramError, HistogramSet, RangeWindows, Value, VectorSteps, intersect_bounds
from storage.labels import Labels, metric_name
from storage.series_set import SeriesSet
from storage.stale import is_stale_value

# --- what Prometheus's HistogramStatsIterator changes -----------------------------------------
#
# When the only consumers of a selector's histograms are histogram_count/sum/avg, Prometheus
# reads them through its HistogramStatsIterator, which drops the buckets and replaces an
# ``unknown`` counter-reset hint by ``reset`` / ``not_reset`` found against the previous
# histogram the iterator read. A sum of such samples can then see ``reset`` beside ``not_reset``
# and warns about conflicting counter resets where the full histograms would not. The iterator
# reads a series from the first sample at or after the window start (instant selection: the
# evaluation time minus the lookback delta); the first sample read keeps its stored hint. For
# range queries Prometheus keeps reading across steps, which is taken here as the same rule
# applied at every step.

STATS_FUNCTIONS = frozenset({"histogram_count", "histogram_sum", "histogram_avg"})
_NEEDS_BUCKETS = frozenset({"histogram_quantile", "histogram_quantiles", "histogram_fraction"})


def stats_selectors(root: Any) -> set[int]:
    """ids of the vector selectors (bare or in a range selector) Prometheus reads through its
    HistogramStatsIterator (detectHistogramStatsDecoding): a histogram_count/sum/avg above them
    with no subquery, bucket-reading function or trim operator in between."""
    parent: dict[int, Any] = {}
    stack = [root]
    out: set[int] = set()
    while stack:
        n = stack.pop()
        kids = children(n)
        for k in kids:
            parent[id(k)] = n
        stack.extend(kids)
        if not isinstance(n, pp.VectorSelector):
            continue
        stats = False
        p = parent.get(id(n))
        while p is not None:
            if isinstance(p, pp.SubqueryExpr):
                stats = False
                break
            if isinstance(p, pp.Call) and p.func.name in STATS_FUNCTIONS:
                stats = True
            elif isinstance(p, pp.Call) and p.func.name in _NEEDS_BUCKETS:
                stats = False
                break
            elif isinstance(p, pp.BinaryExpr) and str(p.op) in TRIM_OPS:
                stats = False
                break
            p = parent.get(id(p))
        if stats:
            out.add(id(n))
    return out


def with_stats_hints(hs: HistogramSet) -> HistogramSet:
    """``hs`` with each ``unknown`` hint replaced by ``reset`` / ``not_reset`` against the
    series' previous histogram (HistogramStatsIterator), the stored samples kept in ``plain``.
    Per-histogram Python."""
    objs = hs.hists.copy()
    starts = set(hs.offsets[:-1].tolist())
    for i in range(len(objs)):  # per histogram sample
        h = hs.hists[i]
        if h.counter_reset_hint != "unknown" or i in starts or is_stale_value(h.sum):
            continue
        prev = hs.hists[i - 1]
        try:
            hint = "reset" if detect_reset(h, prev) else "not_reset"
        except PromQLError:
            continue
        objs[i] = with_hint(h, hint)
    return HistogramSet(hs.labels, hs.offsets, hs.timestamps, objs, hs.hists)


def smoothed_selection(ss: SeriesSet, hs: HistogramSet, floats: VectorSteps, e: np.ndarray, lookback: int, pos: str,
                       ann: Any) -> VectorSteps:
    """A ``smoothed`` instant-vector selector over series holding histograms (Prometheus's
    smoothSeries): ``floats`` is the float-only answer (promql/eval_selectors.py); where the
    lookback delta on either side of a step holds histograms, the step's sample is the histogram
    at the step, else the one on the straight line between the histograms around it (a counter
    that resets between them restarts from zero), else the last one before it (its reset hint
    forgotten); a window holding floats too gives a warning and no sample. Per-cell Python on
    histogram cells only."""
    ss, hs = align(ss, hs)
    ts, _, off = drop_stale(ss)
    nf = window_index(off, ts, e + lookback) - window_index(off, ts, e - lookback)
    h_lo = window_index(hs.offsets, hs.timestamps, e - lookback)
    h_hi = window_index(hs.offsets, hs.timestamps, e + lookback)
    h_at = window_index(hs.offsets, hs.timestamps, e - 1)  # first histogram at or after e
    has_h = h_hi > h_lo
    labels = list(ss.labels)
    s, t = len(labels), len(e)
    rows = {l: i for i, l in enumerate(floats.labels)}
    values = np.zeros((s, t))
    present = np.zeros((s, t), dtype=bool)
    for i, l in enumerate(labels):
        r = rows.get(l)
        if r is not None:
            values[i], present[i] = floats.values[r], floats.present[r]
    plane = empty_plane((s, t))
    for r, c in zip(*np.nonzero(has_h)):  # (series, step) cells with histograms around them only
        r, c = int(r), int(c)
        name = metric_name(labels[r])
        if nf[r, c] > 0:
            ann.warn(mixed_floats_histograms(name, pos))
            present[r, c] = False
            continue
        i, lo, hi, at = int(h_at[r, c]), int(h_lo[r, c]), int(h_hi[r, c]), int(e[c])
        i = min(max(i, lo), hi)
        if i < hi and int(hs.timestamps[i]) == at:
            plane[r, c] = hs.hists[i]
        elif lo < i < hi:
            prev, nxt = hs.hists[i - 1], hs.hists[i]
            if prev.uses_custom_buckets != nxt.uses_custom_buckets:
                ann.warn(mixed_exponential_custom(name, pos))
                continue
            is_counter = prev.counter_reset_hint != "gauge" or nxt.counter_reset_hint != "gauge"
            try:
                plane[r, c] = interpolate_histograms((int(hs.timestamps[i - 1]), prev), (int(hs.timestamps[i]), nxt), at,
                                                     is_counter, pos, ann)
            except HistogramError:
                ann.warn(mixed_exponential_custom(name, pos))
        elif i > lo:
            plane[r, c] = with_hint(hs.hists[i - 1], "unknown")
    hm = np.not_equal(plane, None)
    keep = np.flatnonzero((present | hm).any(axis=1))
    sts = np.broadcast_to(e[None, :], (len(keep), t)).astype(np.int64)
    return VectorSteps([labels[k] for k in keep.tolist()], values[keep], present[keep], None, sts, plane[keep])


# --- aggregation ------------------------------------------------------------------------------


class _Kahan:
    """Neumaier-compensated running sum of one float (Prometheus's kahansum.Inc)."""

    __slots__ = ("s", "c")

    def __init__(self) -> None:
        self.s = 0.0
        self.c = 0.0

    def add(self, x: float) -> None:
        t = self.s + x
        if math.isinf(t):
            self.c = 0.0
        elif abs(self.s) >= abs(x):
            self.c += (self.s - t) + x
        else:
            self.c += (x - t) + self.s
        self.s = t

    def value(self) -> float:
        return self.s + self.c


def sum_histograms(hs: Sequence[FloatHistogram], mean: bool = False) -> tuple[FloatHistogram, bool, bool]:
    """Compensated bucket-wise sum (or mean) of histograms, reconciled to the coarsest schema
    (custom buckets: to the bounds all share, see FloatHistogram.combine), whether their
    counter-reset hints collide (reset vs not_reset) and whether custom bounds were reconciled.
    The mean is the direct one unless the sum overflows, then the sum of h/n (Prometheus
    switches to an incremental mean there). Raises HistogramError for exponential mixed with
    custom buckets."""
    first = hs[0]
    bounds = first.custom_values
    for h in hs[1:]:
        if h.uses_custom_buckets != first.uses_custom_buckets:
            raise HistogramError("cannot combine exponential and custom-bucket histograms")
        if h.uses_custom_buckets and h.custom_values != bounds:
            bounds = intersect_bounds(bounds, h.custom_values)
    reconciled = bounds != first.custom_values or any(h.custom_values != bounds for h in hs)
    schema = min(h.schema for h in hs)
    hint = first.counter_reset_hint
    hints = {h.counter_reset_hint for h in hs}
    collision = "reset" in hints and "not_reset" in hints
    for h in hs[1:]:
        hint = FloatHistogram(counter_reset_hint=hint).merged_hint(h)[0]
    n = float(len(hs))

    def total(div: float) -> tuple[FloatHistogram, bool]:
        cnt, sm, zc = _Kahan(), _Kahan(), _Kahan()
        pos: dict[int, _Kahan] = {}
        neg: dict[int, _Kahan] = {}
        for h in hs:
            cnt.add(h.count / div)
            sm.add(h.sum / div)
            zc.add(h.zero_count / div)
            p, q = (h.custom_buckets_on(bounds), {}) if reconciled else h._buckets_at(schema)
            for i, c in p.items():
                pos.setdefault(i, _Kahan()).add(c / div)
            for i, c in q.items():
                neg.setdefault(i, _Kahan()).add(c / div)
        out = FloatHistogram(schema, cnt.value(), sm.value(), max(h.zero_threshold for h in hs), zc.value(),
                             tuple(sorted((i, k.value()) for i, k in pos.items())),
                             tuple(sorted((i, k.value()) for i, k in neg.items())), bounds, hint)
        overflow = any(math.isinf(x) for x in (out.count, out.sum, out.zero_count)) or any(
            math.isinf(c) for _, c in out.positive + out.negative)
        return out, overflow

    if not mean:
        return total(1.0)[0], collision, reconciled
    direct, overflow = total(1.0)
    if overflow:
        return total(n)[0], collision, reconciled
    return direct.divide(n), collision, reconciled


def collision_warning(op: str, pos: str) -> str:
    return f"PromQL warning: conflicting counter resets during histogram {op}{pos}"


def aggregate_histograms(op: str, vec: VectorSteps, gid: np.ndarray, n_groups: int, float_present: np.ndarray,
                         ann: Any, expr_pos: str) -> tuple[np.ndarray, np.ndarray]:
    """sum/avg of the histogram plane per (group, step).

    Returns (histogram plane (G, T), bool (G, T) cells to drop from the float result: groups that
    mix floats and histograms, which Prometheus answers with a warning and no sample)."""
    hm = vec.hist_mask()
    t = vec.num_steps
    plane = empty_plane((n_groups, t))
    drop = np.zeros((n_groups, t), dtype=bool)
    if hm is None:
        return plane, drop
    rows, cols = np.nonzero(hm)
    cells: dict[tuple[int, int], list[int]] = {}
    for r, c in zip(rows.tolist(), cols.tolist()):  # histogram cells only
        cells.setdefault((int(gid[r]), c), []).append(r)
    for (g, c), members in cells.items():
        if float_present[g, c]:
            ann.warn(mixed_aggregation(expr_pos))
            drop[g, c] = True
            continue
        hs = [vec.hist[r, c] for r in members]
        try:
            total, collision, reconciled = sum_histograms(hs, mean=(op == "avg"))
        except HistogramError:
            bad = next(r for r, h in zip(members, hs) if h.uses_custom_buckets != hs[0].uses_custom_buckets)
            ann.warn(mixed_exponential_custom(metric_name(vec.labels[bad]), expr_pos))
            continue
        if collision:
            ann.warn(collision_warning("aggregation", expr_pos))
        if reconciled:
            ann.info(reconciled_info("aggregation", expr_pos))
        plane[g, c] = total
    return plane, drop


# --- binary operators -------------------------------------------------------------------------

_TYPE = {True: "histogram", False: "float"}
# the histogram trim operators: ``h </ x`` keeps the observations below x, ``h >/ x`` those above
TRIM_OPS = frozenset({"</", ">/"})


def trim_floats_info(op: str, pos: str, ann: Any) -> None:
    """A trim operator between two floats gives no sample, with Prometheus's info."""
    ann.info(incompatible_binop("float", op, "float", pos))


def elem_binop(op: str, lv: float | FloatHistogram, rv: float | FloatHistogram, pos: str, ann: Any) -> tuple[bool, float | FloatHistogram | None]:
    """One sample pair of which at least one is a histogram (Prometheus's vectorElemBinop).

    Returns (keep, value): value is the result (a float for ``==``/``!=`` of two histograms: the
    left-hand value stays the histogram) or None when the pair gives no sample (annotated)."""
    lh, rh = isinstance(lv, FloatHistogram), isinstance(rv, FloatHistogram)
    if lh and rh:
        if op in ("+", "-"):
            try:
                res, rec = lv.combine(rv, 1.0 if op == "+" else -1.0)  # type: ignore[union-attr, arg-type]
                what = "addition" if op == "+" else "subtraction"
                if lv.merged_hint(rv)[1]:  # type: ignore[union-attr, arg-type]
                    ann.warn(f"PromQL warning: conflicting counter resets during histogram {what}{pos}")
                if rec:
                    ann.info(reconciled_info(what, pos))
                return True, (res if op == "+" else with_hint(res, "gauge")).compact()
            except HistogramError:
                ann.warn(f"PromQL warning: incompatible bucket layout encountered for binary operator {op}{pos}")
                return False, None
        if op == "==":
            return lv.equals(rv), lv  # type: ignore[union-attr, arg-type]
        if op == "!=":
            return not lv.equals(rv), lv  # type: ignore[union-attr, arg-type]
    elif lh:
        if op == "*":
            return True, lv.scale(float(rv))  # type: ignore[union-attr, arg-type]
        if op == "/":
            return True, lv.divide(float(rv))  # type: ignore[union-attr, arg-type]
        if op in TRIM_OPS:
            return True, trim_histogram(lv, float(rv), op == "</")  # type: ignore[arg-type]
    elif rh:
        if op == "*":
            return True, rv.scale(float(lv))  # type: ignore[union-attr, arg-type]
    ann.info(incompatible_binop(_TYPE[lh], op, _TYPE[rh], pos))
    return False, None


def vector_scalar_hist(op: str, vec: VectorSteps, out: VectorSteps, scalar: np.ndarray, swap: bool, return_bool: bool,
                       pos: str, ann: Any) -> VectorSteps:
    """Histogram cells of ``vec op scalar`` added to the float result ``out`` (same rows)."""
    hm = vec.hist_mask()
    if hm is None or not hm.any():
        return out
    plane = empty_plane(hm.shape)
    values = out.values.copy()
    present = out.present.copy()
    rows, cols = np.nonzero(hm)
    is_cmp = op in ("==", "!=", ">", "<", ">=", "<=")
    for r, c in zip(rows.tolist(), cols.tolist()):  # histogram cells only
        h, s = vec.hist[r, c], float(scalar[c])
        keep, res = elem_binop(op, s if swap else h, h if swap else s, pos, ann)
        if res is None:
            continue  # incompatible: no sample, even with bool
        if is_cmp:
            res = h  # the vector's own sample
        if return_bool:
            values[r, c] = 1.0 if keep else 0.0
            present[r, c] = True
        elif keep:
            plane[r, c] = res
    return with_plane(VectorSteps(out.labels, values, present, out.drop_name, out.sample_ts), plane)


def pair_cells(op: str, lhs_cells: np.ndarray, rhs_cells: np.ndarray, return_bool: bool, pos: str, ann: Any
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Element-wise ``elem_binop`` over matched pairs given as object arrays (floats or
    histograms, at least one histogram per pair). Returns (keep, float value, histogram value)."""
    n = len(lhs_cells)
    keep = np.zeros(n, dtype=bool)
    fval = np.zeros(n)
    hval = np.full(n, None, dtype=object)
    for i in range(n):  # histogram pairs only
        k, res = elem_binop(op, lhs_cells[i], rhs_cells[i], pos, ann)
        if res is None:
            continue
        if return_bool:
            keep[i], fval[i] = True, 1.0 if k else 0.0
        elif k:
            keep[i] = True
            hval[i] = res
    return keep, fval, hval


# --- functions --------------------------------------------------------------------------------

def call_with_histograms(spec: FunctionSpec, call: Callable[[list[Value]], Value], args: list[Value], fctx: Any) -> Value:
    """Evaluate the function of ``spec`` whose arguments carry histogram samples, as its
    ``spec.histograms`` says."""
    ann = fctx.annotations
    mode = spec.histograms
    name = spec.name
    if mode is Histograms.READS:
        return call(args)
    if mode is Histograms.UNSUPPORTED:
        raise unsupported(f"{name}()")
    if mode is Histograms.PROPERTY:
        assert spec.histogram_property is not None
        return _hist_property(spec.histogram_property, args[0])  # type: ignore[arg-type]
    if mode is Histograms.NATIVE:
        return native_histogram_function(name, call, args, fctx)
    if mode is Histograms.QUANTILES and isinstance(args[0], VectorSteps):
        return native_histogram_quantiles(call, args, fctx)
    if mode is Histograms.PRESENCE:
        return call([union_presence(a) if isinstance(a, VectorSteps) else a for a in args])
    if mode is Histograms.ABSENT_RANGE:
        rw = args[0]
        assert isinstance(rw, RangeWindows)
        nf, nh = window_counts(rw)
        n = nf + nh
        z = np.zeros_like(n)
        return call([RangeWindows(rw.labels, np.zeros(rw.num_series + 1, np.int64), np.empty(0, np.int64), np.empty(0),
                                  z, n, rw.window_end, rw.range_ms, rw.drop_name)])
    if mode is Histograms.LABELS:
        return _via_row_ids(name, call, args)
    wi = [i for i, a in enumerate(args) if isinstance(a, RangeWindows)]
    if not wi:
        return call([strip(a) for a in args])  # float-only functions ignore histograms
    rw = args[wi[0]]
    assert isinstance(rw, RangeWindows)
    nf, nh = window_counts(rw)
    out = call([strip(a) for a in args])
    pos = fctx.pos(wi[0])
    if mode is Histograms.FLOATS_MIXED_INFO:
        _info_mixed_rows(rw, (nh > 0) & (nf > 0), ann, pos)
        return out
    if mode is Histograms.EXTRAPOLATED or mode is Histograms.INSTANT_PAIR:
        return rate_with_histograms(name, mode is Histograms.EXTRAPOLATED, rw, out, fctx)
    if mode is Histograms.CHANGES:
        return _changes(rw, out, nh)
    if mode is Histograms.RESETS:
        return resets_with_histograms(rw, out)
    raise unsupported(f"{name}()")


def _via_row_ids(name: str, call: Callable[[list[Value]], Value], args: list[Value]) -> Value:
    """Label-only functions keep histogram samples: run the function on a vector whose values are
    the input row numbers, then fetch each output cell's sample (float or histogram) from the
    row it came from -- whatever the function reorders or merges."""
    vec = args[0]
    assert isinstance(vec, VectorSteps) and vec.hist is not None
    u = union_presence(vec)
    s, t = vec.values.shape
    ids = np.broadcast_to(np.arange(s, dtype=np.float64)[:, None], (s, t)).copy()
    out = call([VectorSteps(u.labels, ids, u.present, u.drop_name, u.sample_ts)] + list(args[1:]))
    if not isinstance(out, VectorSteps):
        raise unsupported(f"{name}()")
    src = np.where(out.present, out.values, 0).astype(np.int64)
    cols = np.arange(t)[None, :]
    hm = np.not_equal(vec.hist, None)[src, cols] & out.present
    values = vec.values[src, cols]
    plane = np.where(hm, vec.hist[src, cols], None)
    return VectorSteps(out.labels, values, out.present & ~hm, out.drop_name, out.sample_ts, plane)


def _info_mixed_rows(rw: RangeWindows, mixed: np.ndarray, ann: Any, pos: str) -> None:
    for s in np.flatnonzero(mixed.any(axis=1)).tolist():
        ann.info(mixed_range_ignored(metric_name(rw.labels[s]), pos))


def _changes(rw: RangeWindows, out: Value, nh: np.ndarray) -> Value:
    """changes() over windows holding histograms: a change between samples of different kinds,
    between unequal histograms or unequal floats (Prometheus's funcChanges), per affected cell."""
    assert rw.hist is not None and isinstance(out, VectorSteps)
    pos = {l: i for i, l in enumerate(out.labels)}
    t = rw.num_steps
    rows_needed = [s for s in np.flatnonzero((nh > 0).any(axis=1)).tolist()]
    values = out.values
    present = out.present
    labels = list(out.labels)
    extra_l, extra_v, extra_p = [], [], []
    for s in rows_needed:  # series with histogram samples
        vals_row = np.zeros(t)
        pres_row = np.zeros(t, dtype=bool)
        for c in range(t):
            seq = window_sequence(rw, s, c)
            if not seq:
                continue
            n = 0
            for (_, a), (_, b) in zip(seq, seq[1:]):
                ah, bh = isinstance(a, FloatHistogram), isinstance(b, FloatHistogram)
                if ah != bh:
                    n += 1
                elif ah:
                    n += 0 if a.equals(b) else 1
                elif a != b and not (np.isnan(a) and np.isnan(b)):
                    n += 1
            vals_row[c], pres_row[c] = n, True
        r = pos.get(rw.labels[s])
        if r is None:
            extra_l.append(rw.labels[s])
            extra_v.append(vals_row)
            extra_p.append(pres_row)
        else:
            values = values.copy() if values is out.values else values
            present = present.copy() if present is out.present else present
            values[r] = np.where(pres_row, vals_row, values[r])
            present[r] = present[r] | pres_row
    drop = out.drop_name
    if extra_l:
        labels += extra_l
        values = np.concatenate([values, np.array(extra_v)], axis=0)
        present = np.concatenate([present, np.array(extra_p)], axis=0)
        drop = np.concatenate([out.drop_name_mask(), np.ones(len(extra_l), dtype=bool)])
    return VectorSteps(labels, values, present, drop)


def _hist_property(fn: Callable[[FloatHistogram], float], vec: VectorSteps) -> VectorSteps:
    """histogram_count/sum/avg: one float per histogram sample (float samples are ignored)."""
    hm = vec.hist_mask()
    values = np.zeros(vec.values.shape)
    if hm is None:
        return VectorSteps(vec.labels, values, np.zeros(values.shape, dtype=bool), np.ones(vec.num_series, dtype=bool))
    rows, cols = np.nonzero(hm)
    values[rows, cols] = [fn(h) for h in vec.hist[rows, cols]]
    keep = hm.any(axis=1)
    idx = np.flatnonzero(keep)
    return VectorSteps([vec.labels[i] for i in idx.tolist()], values[idx], hm[idx], np.ones(len(idx), dtype=bool))


def refuse_result(v: Value) -> None:
    """The API and the runner's result types are float-only: a histogram in the final result is
    refused rather than silently dropped."""
    if has_hist(v):
        raise ExecutionError("the query result contains native histogram samples, which this engine cannot return")


def histogram_points(v: Value, steps: np.ndarray) -> list[tuple[Labels, list[tuple[int, FloatHistogram]]]]:
    """The histogram samples of a final result, per series (names dropped where marked)."""
    out: dict[Labels, list[tuple[int, FloatHistogram]]] = {}
    if isinstance(v, VectorSteps):
        vec = apply_name_drop(v)
        hm = vec.hist_mask()
        if hm is not None:
            for r in np.flatnonzero(hm.any(axis=1)).tolist():
                cols = np.flatnonzero(hm[r]).tolist()
                out.setdefault(vec.labels[r], []).extend((int(steps[c]), vec.hist[r, c]) for c in cols)  # type: ignore[index]
    elif isinstance(v, RangeWindows) and v.hist is not None:
        hw = v.hist
        for s in range(v.num_series):
            a, b = int(hw.lo[s, 0]), int(hw.hi[s, 0])
            if b > a:
                lbl = drop_metric_name(v.labels[s]) if v.drop_name is not None and v.drop_name[s] else v.labels[s]
                out.setdefault(lbl, []).extend((int(hw.ts[i]), hw.objs[i]) for i in range(a, b))
    return sorted((l, sorted(p, key=lambda x: x[0])) for l, p in out.items())
