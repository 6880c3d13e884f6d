"""rate / increase / delta / irate / idelta / resets over windows holding native histograms,
after Prometheus's extrapolatedRate, histogramRate, instantValue and funcResets: histogram-only
windows give a histogram (counter resets found by DetectReset, the same extrapolation as for
floats), windows mixing floats and histograms a warning and no sample. Per-window Python on
histogram windows only.
"""
from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from promql.histogram_planes import (
    empty_plane,
    mask_cells,
    mixed_exponential_custom,
    mixed_floats_histograms,
    reconciled_info,
    unsupported,
    window_counts,
    window_sequence,
)
from storage.go_format import go_quote
from promql.functions.rate import extrapolation_factor
from promql.types import FloatHistogram, HistogramError, RangeWindows, Value, VectorSteps, intersect_bounds
from storage.labels import metric_name

def _not_counter(name: str, pos: str) -> str:
    return f"PromQL warning: this native histogram metric is not a counter: {go_quote(name)}{pos}"


def _not_gauge(name: str, pos: str) -> str:
    return f"PromQL warning: this native histogram metric is not a gauge: {go_quote(name)}{pos}"


def detect_reset(cur: FloatHistogram, prev: FloatHistogram) -> bool:
    """Prometheus's FloatHistogram.DetectReset: the hint if explicit, else any decrease (count,
    zero bucket, any bucket at the current schema) or a layout change that implies a restart."""
    if cur.counter_reset_hint == "reset":
        return True
    if cur.counter_reset_hint == "not_reset":
        return False
    if cur.count < prev.count:
        return True
    if cur.uses_custom_buckets:
        if not prev.uses_custom_buckets:
            return True
        if cur.custom_values != prev.custom_values:
            # both re-binned onto the bounds they share: a reset if any shared bucket decreased
            bounds = intersect_bounds(cur.custom_values, prev.custom_values)
            mine, theirs = cur.custom_buckets_on(bounds), prev.custom_buckets_on(bounds)
            return any(mine.get(i, 0.0) < c for i, c in theirs.items())
    elif prev.uses_custom_buckets:
        return True
    if cur.schema > prev.schema:
        return True
    if cur.zero_threshold < prev.zero_threshold:
        return True
    if cur.zero_threshold != prev.zero_threshold:
        raise unsupported("counter-reset detection across a widened zero bucket")
    if cur.zero_count < prev.zero_count:
        return True
    c_pos, c_neg = cur._buckets_at(cur.schema)
    p_pos, p_neg = prev._buckets_at(cur.schema if not cur.uses_custom_buckets else prev.schema)
    for mine, theirs in ((c_pos, p_pos), (c_neg, p_neg)):
        for i, c in theirs.items():
            if mine.get(i, 0.0) < c:
                return True
    return False


def _histogram_increase(points: list[tuple[int, FloatHistogram]], is_counter: bool, name: str, pos: str, ann: Any) -> FloatHistogram | None:
    """Prometheus's histogramRate: last - first, plus the value before every counter reset."""
    prev = points[0][1]
    last = points[-1][1]
    custom = prev.uses_custom_buckets
    if is_counter and (prev.counter_reset_hint == "gauge" or last.counter_reset_hint == "gauge"):
        ann.warn(_not_counter(name, pos))
    if is_counter and detect_reset(points[1][1], prev):
        second = points[1][1]
        prev = FloatHistogram(schema=second.schema, custom_values=second.custom_values)
        custom = second.uses_custom_buckets
    if last.uses_custom_buckets != custom:
        ann.warn(mixed_exponential_custom(name, pos))
        return None
    for _, cur in points[1:-1]:
        if not is_counter:
            continue
        if cur.counter_reset_hint == "gauge":
            ann.warn(_not_counter(name, pos))
        if cur.uses_custom_buckets != custom:
            ann.warn(mixed_exponential_custom(name, pos))
            return None
    try:
        h, rec = last.combine(prev, -1.0)
        if rec:
            ann.info(reconciled_info("subtraction", pos))
        if is_counter:
            before = prev
            for _, cur in points[1:]:
                if detect_reset(cur, before):
                    h, rec = h.combine(before)
                    if rec:
                        ann.info(reconciled_info("addition", pos))
                before = cur
    except HistogramError:
        ann.warn(mixed_exponential_custom(name, pos))
        return None
    if not is_counter and (points[0][1].counter_reset_hint != "gauge" or points[-1][1].counter_reset_hint != "gauge"):
        ann.warn(_not_gauge(name, pos))
    return FloatHistogram(h.schema, h.count, h.sum, h.zero_threshold, h.zero_count, h.positive, h.negative,
                          h.custom_values, "gauge").compact()


def extrapolated_histogram_rate(points: list[tuple[int, FloatHistogram]], range_start: int, range_end: int, range_ms: int,
                                is_counter: bool, is_rate: bool, name: str, pos: str, ann: Any) -> FloatHistogram | None:
    """rate / increase / delta of a window holding only histograms (Prometheus's extrapolatedRate)."""
    if len(points) < 2:
        return None
    res = _histogram_increase(points, is_counter, name, pos, ann)
    if res is None:
        return None
    first_t, last_t = points[0][0], points[-1][0]
    if last_t == first_t:
        return res.scale(1.0)
    factor = float(extrapolation_factor(np.float64(res.count), np.float64(points[0][1].count), np.int64(first_t),
                                        np.int64(last_t), np.int64(len(points)), range_start, range_end,
                                        range_ms / 1000, is_counter, is_rate))
    return res.scale(factor)


def interpolate_histograms(a: tuple[int, FloatHistogram], b: tuple[int, FloatHistogram], t: int,
                           is_counter: bool, pos: str, ann: Any) -> FloatHistogram:
    """The histogram on the straight line from sample ``a`` to sample ``b`` at time ``t``; a
    counter that resets between them restarts from zero (``b`` scaled). Raises HistogramError
    for layouts that cannot be combined."""
    (t1, h1), (t2, h2) = a, b
    if t == t1:
        return h1
    if t == t2:
        return h2
    fraction = (t - t1) / (t2 - t1)
    if is_counter and detect_reset(h2, h1):
        return h2.scale(fraction)
    d, rec = h2.combine(h1, -1.0)
    if rec:
        ann.info(reconciled_info("subtraction", pos))
    res, rec = d.scale(fraction).combine(h1)
    if rec:
        ann.info(reconciled_info("addition", pos))
    return res


def _extended_correction(points: list[tuple[int, FloatHistogram]], first: int, last: int, left: FloatHistogram,
                         right: FloatHistogram, range_start: int, smoothed: bool, pos: str, ann: Any) -> FloatHistogram | None:
    """The counter-reset correction of an anchored/smoothed histogram increase: the histogram
    before every reset among left, the samples strictly between the two boundary samples, and
    right. A left boundary interpolated across a reset has accounted for it already; the last
    boundary sample never counts (right stands for it)."""
    k = first + 1
    prev = left
    if smoothed and points[first][0] < range_start and detect_reset(points[first + 1][1], points[first][1]):
        prev = points[first + 1][1]
        k += 1
    if k > last:
        return None
    corr: FloatHistogram | None = None

    def add(h: FloatHistogram) -> FloatHistogram:
        if corr is None:
            return h
        res, rec = corr.combine(h)
        if rec:
            ann.info(reconciled_info("addition", pos))
        return res

    for _, cur in points[k:last]:
        if detect_reset(cur, prev):
            corr = add(prev)
        prev = cur
    if detect_reset(right, prev):
        corr = add(prev)
    return corr


def extended_histogram_rate(points: list[tuple[int, FloatHistogram]], range_start: int, range_end: int, range_ms: int,
                            smoothed: bool, is_counter: bool, is_rate: bool, name: str, pos: str,
                            ann: Any) -> FloatHistogram | None:
    """rate / increase / delta of an ``anchored`` or ``smoothed`` window holding only histograms
    (``points``: the window's samples with the lookback delta before it, and after it when
    smoothed), after Prometheus's extendedHistogramRate: the histogram at each boundary is the
    last sample at or before it (anchored) or interpolated between the samples around it
    (smoothed); the result is right - left plus the counter-reset correction, per second for
    rate, never extrapolated."""
    times = [t for t, _ in points]
    last = len(points) - 1
    first = max(0, bisect.bisect_right(times, range_start, 0, last) - 1)
    if smoothed:
        last = bisect.bisect_left(times, range_end, 0, last)
    if times[last] <= range_start or (smoothed and times[first] > range_end):
        return None
    custom = points[first][1].uses_custom_buckets
    for _, h in points[first:last + 1]:
        if h.uses_custom_buckets != custom:
            ann.warn(mixed_exponential_custom(name, pos))
            return None
        if is_counter and h.counter_reset_hint == "gauge":
            ann.warn(_not_counter(name, pos))
    try:
        left = points[first][1]
        if smoothed and times[first] < range_start:
            left = interpolate_histograms(points[first], points[first + 1], range_start, is_counter, pos, ann)
        right = points[last][1]
        if smoothed and last > 0 and times[last] > range_end:
            right = interpolate_histograms(points[last - 1], points[last], range_end, is_counter, pos, ann)
        if not is_counter and (left.counter_reset_hint != "gauge" or right.counter_reset_hint != "gauge"):
            ann.warn(_not_gauge(name, pos))
        res, rec = right.combine(left, -1.0)
        if rec:
            ann.info(reconciled_info("subtraction", pos))
        if is_counter:
            corr = _extended_correction(points, first, last, left, right, range_start, smoothed, pos, ann)
            if corr is not None:
                res, rec = res.combine(corr)
                if rec:
                    ann.info(reconciled_info("addition", pos))
    except HistogramError:
        ann.warn(mixed_exponential_custom(name, pos))
        return None
    if is_rate:
        res = res.divide(range_ms / 1000)
    return FloatHistogram(res.schema, res.count, res.sum, res.zero_threshold, res.zero_count, res.positive, res.negative,
                          res.custom_values, "gauge").compact()


def instant_histogram_rate(a: tuple[int, FloatHistogram], b: tuple[int, FloatHistogram], is_rate: bool, name: str, pos: str,
                           ann: Any) -> FloatHistogram | None:
    """irate / idelta from the last two samples, both histograms (Prometheus's instantValue)."""
    (ta, ha), (tb, hb) = a, b
    if tb == ta:
        return None
    if is_rate and (hb.counter_reset_hint == "gauge" or ha.counter_reset_hint == "gauge"):
        ann.warn(_not_counter(name, pos))
    if not is_rate and (hb.counter_reset_hint != "gauge" or ha.counter_reset_hint != "gauge"):
        ann.warn(_not_gauge(name, pos))
    res = hb
    if not is_rate or not detect_reset(hb, ha):
        if hb.uses_custom_buckets != ha.uses_custom_buckets:
            ann.warn(mixed_exponential_custom(name, pos))
            return None
        res, rec = hb.combine(ha, -1.0)
        if rec:
            ann.info(reconciled_info("subtraction", pos))
    res = FloatHistogram(res.schema, res.count, res.sum, res.zero_threshold, res.zero_count, res.positive, res.negative,
                         res.custom_values, "gauge").compact()
    return res.divide((tb - ta) / 1000) if is_rate else res


def _window_samples(rw: RangeWindows, s: int, c: int) -> tuple[list[tuple[int, float]], list[tuple[int, FloatHistogram]]]:
    assert rw.hist is not None
    fl = [(int(rw.ts[i]), float(rw.vals[i])) for i in range(int(rw.lo[s, c]), int(rw.hi[s, c]))]
    hl = [(int(rw.hist.ts[i]), rw.hist.objs[i]) for i in range(int(rw.hist.lo[s, c]), int(rw.hist.hi[s, c]))]
    return fl, hl


def _attach(out: Value, rw: RangeWindows, values: np.ndarray | None, present: np.ndarray | None, plane: np.ndarray | None,
            drop_name: bool = True) -> Value:
    """Add per-(window series, step) results computed here (floats and/or histograms) to a
    per-series function result ``out`` (rows matched by labels; series missing from ``out``
    are appended)."""
    assert isinstance(out, VectorSteps)
    t = rw.num_steps
    rows = {l: i for i, l in enumerate(out.labels)}
    labels = list(out.labels)
    extra = [l for s, l in enumerate(rw.labels) if l not in rows and (
        (present is not None and present[s].any()) or (plane is not None and np.not_equal(plane[s], None).any()))]
    n_out = len(labels) + len(extra)
    vals = np.zeros((n_out, t))
    pres = np.zeros((n_out, t), dtype=bool)
    vals[: out.num_series] = out.values
    pres[: out.num_series] = out.present
    out_plane = empty_plane((n_out, t))
    if out.hist is not None:
        out_plane[: out.num_series] = out.hist
    for l in extra:
        rows[l] = len(labels)
        labels.append(l)
    for s, l in enumerate(rw.labels):
        r = rows.get(l)
        if r is None:
            continue
        if present is not None and values is not None:
            vals[r] = np.where(present[s], values[s], vals[r])
            pres[r] |= present[s]
        if plane is not None:
            hm = np.not_equal(plane[s], None)
            out_plane[r, hm] = plane[s, hm]
            pres[r] &= ~hm
    drop = np.concatenate([out.drop_name_mask(), np.full(len(extra), drop_name)])
    return VectorSteps(labels, vals, pres, drop, None, out_plane)


def rate_with_histograms(name: str, extrapolated: bool, rw: RangeWindows, out: Value, fctx: Any) -> Value:
    """rate/increase/delta/irate/idelta where windows hold histogram samples: histogram-only
    windows give a histogram, windows mixing floats and histograms a warning and no sample."""
    ann = fctx.annotations
    pos = fctx.pos(0)
    nf, nh = window_counts(rw)
    plane = empty_plane(nf.shape)
    kill = np.zeros(nf.shape, dtype=bool)
    is_counter = name in ("rate", "increase", "irate")
    is_rate = name in ("rate", "irate")
    for s, c in zip(*np.nonzero(nh > 0)):  # windows holding histograms only
        s, c = int(s), int(c)
        fl, hl = _window_samples(rw, s, c)
        mname = metric_name(rw.labels[s])
        if extrapolated:
            if fl:
                ann.warn(mixed_floats_histograms(mname, pos))
                kill[s, c] = True
                continue
            end = int(rw.window_end[c])
            if rw.extended:
                plane[s, c] = extended_histogram_rate(hl, end - rw.range_ms, end, rw.range_ms, rw.extended == "smoothed",
                                                      is_counter, is_rate, mname, pos, ann)
                continue
            plane[s, c] = extrapolated_histogram_rate(hl, end - rw.range_ms, end, rw.range_ms, is_counter, is_rate, mname, pos, ann)
            continue
        merged = sorted([(t, v) for t, v in fl] + list(hl), key=lambda p: p[0])[-2:]
        if len(merged) < 2:
            continue
        kinds = [isinstance(v, FloatHistogram) for _, v in merged]
        if kinds[0] != kinds[1]:
            ann.warn(mixed_floats_histograms(mname, pos))
            kill[s, c] = True
        elif kinds[0]:
            kill[s, c] = True
            plane[s, c] = instant_histogram_rate(merged[0], merged[1], is_rate, mname, pos, ann)  # type: ignore[arg-type]
    return _attach(mask_cells(out, rw, kill), rw, None, None, plane)


def resets_with_histograms(rw: RangeWindows, out: Value) -> Value:
    """resets() over windows holding histograms: a change of sample kind counts as a reset, a
    histogram pair by DetectReset, a float pair by a decrease (Prometheus's funcResets)."""
    nf, nh = window_counts(rw)
    cells = nh > 0
    values = np.zeros(nf.shape)
    for s, c in zip(*np.nonzero(cells)):  # windows holding histograms only
        seq = window_sequence(rw, int(s), int(c))
        if seq is None:  # anchored, nothing inside the window
            cells[s, c] = False
            continue
        n = 0
        for (_, a), (_, b) in zip(seq, seq[1:]):
            ah, bh = isinstance(a, FloatHistogram), isinstance(b, FloatHistogram)
            if ah != bh:
                n += 1
            elif ah:
                n += detect_reset(b, a)  # type: ignore[arg-type]
            elif b < a:  # type: ignore[operator]
                n += 1
        values[s, c] = n
    return _attach(out, rw, values, cells, None)
