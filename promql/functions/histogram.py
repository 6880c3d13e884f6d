"""histogram_quantile / histogram_fraction on classic (``le``-labelled) bucket series.

Series are grouped once per query by their labels without ``le`` (Python per series); the bucket
arithmetic then runs on a padded (groups, buckets, steps) array with a loop over bucket positions
only, reproducing Prometheus's per-step rules: buckets sorted by upper bound and coalesced when
equal, result NaN unless the highest present bucket is +Inf, small relative deltas (< 1e-12)
ignored, monotonicity forced (reported as an info), linear interpolation inside the bucket and the
special cases for the lowest and highest bucket.

Native histograms are out of scope: this engine stores float samples only, so the native-only
functions (histogram_count/sum/avg/stddev/stdvar) see no histogram samples and return nothing,
exactly what Prometheus returns for float input.
"""
from __future__ import annotations

import datetime as _dt
import math

import numpy as np

from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import scalar_arg, string_arg, vector_arg
from storage.go_format import format_float_g as format_go_g
from promql.types import FloatHistogram, Value, VectorSteps
from storage.labels import Labels, get, metric_name, set_label
from promql.functions.labels import merge_same_labelsets

_SMALL_DELTA = 1e-12
_MIN_NORMAL = 2.2250738585072014e-308
_MONOTONICITY_INFO = (
    "PromQL info: input to histogram_quantile needed to be fixed for monotonicity "
    "(see https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile)"
)


def go_parse_float(s: str) -> float | None:
    """strconv.ParseFloat(s, 64): None where Go would fail."""
    t = s
    if not t or t != t.strip() or "_" in t:
        # Go only allows underscores in base-prefixed literals; the le label never uses them.
        if "_" in t and t.lower().startswith(("0x", "+0x", "-0x")):
            t = t.replace("_", "")
        else:
            return None
    low = t.lower()
    try:
        if low.lstrip("+-").startswith("0x"):
            return float.fromhex(t)
        if low.lstrip("+-") in ("inf", "infinity", "nan"):
            return float(low)
        # Python accepts forms Go does not ("1_0" handled above); both accept "1e3", ".5", "5.".
        return float(t)
    except ValueError:
        return None


def _almost_equal(a: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        both_nan = np.isnan(a) & np.isnan(b)
        eq = a == b
        abs_sum = np.abs(a) + np.abs(b)
        diff = np.abs(a - b)
        tiny = (a == 0) | (b == 0) | (abs_sum < _MIN_NORMAL)
        rel = diff / np.minimum(abs_sum, np.finfo(np.float64).max) < eps
        return both_nan | eq | np.where(tiny, diff < eps * _MIN_NORMAL, rel)


class _Buckets:
    """Classic histogram buckets of a vector, grouped: counts (G, B, T), present (G, B, T),
    upper bounds (G, B) ascending (padding +Inf, never present)."""

    def __init__(self, ctx: FunctionContext, vec: VectorSteps, arg_index: int) -> None:
        groups: dict[Labels, int] = {}
        g_of: list[int] = []
        ub_of: list[float] = []
        keep: list[int] = []
        for i, lb in enumerate(vec.labels):
            le = get(lb, "le")
            ub = go_parse_float(le)
            if ub is None:
                if vec.present[i].any():
                    name = metric_name(lb)
                    suffix = f' for metric name "{name}"' if name else ""
                    ctx.annotations.warn(
                        f'PromQL warning: bucket label "le" is missing or has a malformed value of '
                        f'"{le}"{suffix}{ctx.pos(arg_index)}'
                    )
                continue
            key = tuple(p for p in lb if p[0] != "le")
            g = groups.setdefault(key, len(groups))
            g_of.append(g)
            ub_of.append(ub)
            keep.append(i)
        self.labels: list[Labels] = list(groups.keys())
        G = len(self.labels)
        T = vec.num_steps
        self.T = T
        if G == 0:
            self.ub = np.zeros((0, 0))
            return
        g_arr = np.asarray(g_of, dtype=np.int64)
        ub_arr = np.asarray(ub_of, dtype=np.float64)
        # Slot of each series inside its group: rank of its (deduplicated) upper bound.
        order = np.lexsort((ub_arr, g_arr))
        gs, us = g_arr[order], ub_arr[order]
        new_slot = np.ones(len(order), dtype=bool)
        new_slot[1:] = (gs[1:] != gs[:-1]) | (us[1:] != us[:-1])
        group_start = np.ones(len(order), dtype=bool)
        group_start[1:] = gs[1:] != gs[:-1]
        slot_running = np.cumsum(new_slot) - 1
        first_slot_of_group = slot_running[group_start]
        grp_index = np.cumsum(group_start) - 1
        slot_sorted = slot_running - first_slot_of_group[grp_index]
        slot = np.empty(len(order), dtype=np.int64)
        slot[order] = slot_sorted
        B = int(slot.max()) + 1
        self.ub = np.full((G, B), np.inf)
        self.ub[g_arr, slot] = ub_arr
        self._g = g_arr
        self._slot = slot
        self._src = np.asarray(keep, dtype=np.int64)
        self._vec = vec

    def blocks(self, max_cells: int = 4_000_000):
        """Yield (t0, t1, block) with the bucket arrays of steps [t0, t1), sized to ~max_cells."""
        G, B = self.ub.shape
        T = self.T
        width = max(1, max_cells // max(1, G * B))
        for t0 in range(0, T, width):
            t1 = min(T, t0 + width)
            yield t0, t1, self._block(t0, t1)

    def _block(self, t0: int, t1: int) -> "_Block":
        G, B = self.ub.shape
        vals = self._vec.values[self._src, t0:t1]
        pres = self._vec.present[self._src, t0:t1]
        counts = np.zeros((G, B, t1 - t0))
        present = np.zeros((G, B, t1 - t0), dtype=bool)
        np.add.at(counts, (self._g, self._slot), np.where(pres, vals, 0.0))
        np.logical_or.at(present, (self._g, self._slot), pres)
        return _Block(counts, present, self.ub)


class _Block:
    """Bucket arrays of a range of steps: counts/present (G, B, T'), upper bounds (G, B)."""

    def __init__(self, counts: np.ndarray, present: np.ndarray, ub: np.ndarray) -> None:
        self.counts, self.present, self.ub = counts, present, ub

    def output_present(self) -> np.ndarray:
        return self.present.any(axis=1)

    def last_present_is_inf(self) -> np.ndarray:
        G, B, T = self.counts.shape
        if B == 0:
            return np.zeros((G, T), dtype=bool)
        rev = self.present[:, ::-1, :]
        last = B - 1 - np.argmax(rev, axis=1)  # (G, T)
        ubl = np.take_along_axis(np.broadcast_to(self.ub[:, :, None], (G, B, T)), last[:, None, :], axis=1)[:, 0, :]
        return np.isposinf(ubl)


def _quantile_warning(ctx: FunctionContext, qs: np.ndarray, arg_index: int) -> None:
    bad = np.isnan(qs) | (qs < 0) | (qs > 1)
    for q in qs[bad]:
        ctx.annotations.warn(f"PromQL warning: quantile value should be between 0 and 1, got {format_go_g(float(q))}{ctx.pos(arg_index)}")


def _previous_present(p: np.ndarray) -> np.ndarray:
    """(G, B, T): index of the nearest present bucket below each bucket (-1: none)."""
    G, B, T = p.shape
    j = np.arange(B, dtype=np.int64)[None, :, None]
    upto = np.maximum.accumulate(np.where(p, j, -1), axis=1)  # nearest present at or below
    prev = np.full((G, B, T), -1, dtype=np.int64)
    prev[:, 1:, :] = upto[:, :-1, :]
    return prev


def _fix_monotonicity(bk: "_Block", prev_idx: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Prometheus's ensureMonotonicAndIgnoreSmallDeltas over every (group, step): bucket counts
    that fall are raised to the count below, counts within a tiny relative delta of it take it.
    Buckets that are already non-decreasing with no such near-equal neighbours (the usual case) are
    checked in one pass over all buckets; only otherwise is the bucket-by-bucket walk needed."""
    G, B, T = bk.counts.shape
    c, p = bk.counts, bk.present
    later = p & (prev_idx >= 0)
    below = np.take_along_axis(c, np.maximum(prev_idx, 0), axis=1)
    with np.errstate(all="ignore"):
        same = later & (c == below)
        fix = later & ~same & (_almost_equal(below, c, _SMALL_DELTA) | (c < below))
    if not fix.any():
        return c, {"forced": np.zeros((G, T), dtype=bool), "min_b": np.full((G, T), np.inf),
                   "max_b": np.full((G, T), -np.inf), "max_diff": np.zeros((G, T))}
    c = c.copy()
    forced = np.zeros((G, T), dtype=bool)
    min_b = np.full((G, T), np.inf)
    max_b = np.full((G, T), -np.inf)
    max_diff = np.zeros((G, T))
    started = np.zeros((G, T), dtype=bool)
    prev = np.zeros((G, T))
    with np.errstate(all="ignore"):
        for j in range(B):
            pj = p[:, j, :]
            cur = c[:, j, :].copy()
            ubj = bk.ub[:, j][:, None]
            first = pj & ~started
            later_j = pj & started
            same_j = later_j & (cur == prev)
            small = later_j & ~same_j & _almost_equal(prev, cur, _SMALL_DELTA)
            dec = later_j & ~same_j & ~small & (cur < prev)
            inc = later_j & ~same_j & ~small & ~dec
            c[:, j, :] = np.where(small | dec, prev, cur)
            forced |= dec
            min_b = np.where(dec & (ubj < min_b), ubj, min_b)
            max_b = np.where(dec & (ubj > max_b), ubj, max_b)
            d = prev - cur
            max_diff = np.where(dec & (d > max_diff), d, max_diff)
            prev = np.where(first | inc, cur, prev)
            started |= pj
    return c, {"forced": forced, "min_b": min_b, "max_b": max_b, "max_diff": max_diff}


def bucket_quantiles(bk: "_Block", qs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per (group, step) quantile and the monotonicity-fix report arrays (Prometheus's
    bucketQuantile: the first bucket, below the highest present one, whose count reaches the rank,
    interpolated linearly from the present bucket below it)."""
    G, B, T = bk.counts.shape
    p = bk.present
    q = np.broadcast_to(qs[None, :], (G, T))
    if B == 0:
        res = np.full((G, T), np.nan)
        res = np.where(q > 1, np.inf, np.where(q < 0, -np.inf, res))
        z = np.zeros((G, T), dtype=bool)
        return res, {"forced": z, "min_b": np.full((G, T), np.inf), "max_b": np.full((G, T), -np.inf),
                     "max_diff": np.zeros((G, T))}
    prev_idx = _previous_present(p)
    c, rep = _fix_monotonicity(bk, prev_idx)
    npres = p.sum(axis=1)
    ub = np.broadcast_to(bk.ub[:, :, None], (G, B, T))
    with np.errstate(all="ignore"):
        # Observations = (fixed) count of the highest present bucket.
        last_idx = B - 1 - np.argmax(p[:, ::-1, :], axis=1)  # (G, T)
        obs = np.take_along_axis(c, last_idx[:, None, :], axis=1)[:, 0, :]
        rank = q * obs
        j = np.arange(B, dtype=np.int64)[None, :, None]
        cand = p & (j != last_idx[:, None, :]) & (c >= rank[:, None, :])
        found = cand.any(axis=1)
        at = np.argmax(cand, axis=1)[:, None, :]  # the first such bucket
        b_end = np.take_along_axis(ub, at, axis=1)[:, 0, :]
        b_cnt = np.take_along_axis(c, at, axis=1)[:, 0, :]
        below = np.take_along_axis(prev_idx, at, axis=1)[:, 0, :]
        seen = below >= 0
        bi = np.maximum(below, 0)[:, None, :]
        b_start = np.where(seen, np.take_along_axis(ub, bi, axis=1)[:, 0, :], 0.0)
        b_prevc = np.where(seen, np.take_along_axis(c, bi, axis=1)[:, 0, :], 0.0)
        # no bucket reached the rank: the upper bound of the present bucket below the highest one
        last_present = np.take_along_axis(p, last_idx[:, None, :], axis=1)[:, 0, :]
        below_last = np.take_along_axis(prev_idx, last_idx[:, None, :], axis=1)[:, 0, :]
        second_last_ub = np.where(last_present & (below_last >= 0),
                                  np.take_along_axis(ub, np.maximum(below_last, 0)[:, None, :], axis=1)[:, 0, :], np.nan)
        interp = b_start + (b_end - b_start) * ((rank - b_prevc) / (b_cnt - b_prevc))
        res = np.where(~found, second_last_ub, np.where(~seen & (b_end <= 0), b_end, interp))
        res = np.where((npres < 2) | (obs == 0), np.nan, res)
        inf_top = bk.last_present_is_inf()
        res = np.where(inf_top, res, np.nan)
        # Early returns for the quantile itself come first in Prometheus.
        res = np.where(q > 1, np.inf, res)
        res = np.where(q < 0, -np.inf, res)
        res = np.where(np.isnan(q), np.nan, res)
        valid_q = ~(np.isnan(q) | (q < 0) | (q > 1))
        rep["forced"] = rep["forced"] & valid_q & inf_top
    return res, rep


def _rfc3339(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms // 1000, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _report_monotonicity(ctx: FunctionContext, bk: _Buckets, rep: dict[str, np.ndarray], present: np.ndarray, arg_index: int) -> None:
    """One info per metric name, merged over groups and steps as Prometheus merges them."""
    forced = rep["forced"] & present
    if not forced.any():
        return
    steps = np.asarray(ctx.step_times, dtype=np.int64)
    by_name: dict[str, list[int]] = {}
    for g, lb in enumerate(bk.labels):
        if forced[g].any():
            by_name.setdefault(metric_name(lb), []).append(g)
    for name, gs in by_name.items():
        f = forced[gs]
        ts = np.broadcast_to(steps[None, :], f.shape)[f]
        min_b = rep["min_b"][gs][f].min()
        max_b = rep["max_b"][gs][f].max()
        max_diff = rep["max_diff"][gs][f].max()
        count = int(f.sum())
        head = _MONOTONICITY_INFO + (f' for metric name "{name}"' if name else "")
        pos = ctx.pos(arg_index)
        ctx.annotations.info(
            f"{head}, from buckets {format_go_g(float(min_b))} to {format_go_g(float(max_b))}, with a max diff of "
            f"{_go_2g(float(max_diff))}, over {count} samples from {_rfc3339(int(ts.min()))} to {_rfc3339(int(ts.max()))}{pos}"
        )


def _go_2g(v: float) -> str:
    s = "%.2g" % v
    if "e" in s:
        mant, exp = s.split("e")
        sign = exp[0]
        digits = exp[1:].lstrip("0").rjust(2, "0")
        s = f"{mant}e{sign}{digits}"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return s


@register("histogram_quantile", histograms=Histograms.NATIVE)
def histogram_quantile(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[1])
    T = vec.num_steps
    qs = scalar_arg(args[0], T)
    _quantile_warning(ctx, qs, 0)
    bk = _Buckets(ctx, vec, 1)
    G = len(bk.labels)
    if G == 0:
        return VectorSteps.empty(T)
    res, rep, present = _quantiles_all_steps(bk, qs)
    _report_monotonicity(ctx, bk, rep, present, 1)
    return VectorSteps(bk.labels, np.where(present, res, 0.0), present, np.ones(G, dtype=bool))


def _quantiles_all_steps(bk: _Buckets, qs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    parts = [(bucket_quantiles(blk, qs[t0:t1]), blk.output_present()) for t0, t1, blk in bk.blocks()]
    res = np.concatenate([p[0][0] for p in parts], axis=1)
    rep = {k: np.concatenate([p[0][1][k] for p in parts], axis=1) for k in parts[0][0][1]}
    present = np.concatenate([p[1] for p in parts], axis=1)
    return res, rep, present


def bucket_fractions(bk: "_Block", lower_t: np.ndarray, upper_t: np.ndarray) -> np.ndarray:
    G, B, T = bk.counts.shape
    c = bk.counts
    p = bk.present
    lower = np.broadcast_to(lower_t[None, :], (G, T))
    upper = np.broadcast_to(upper_t[None, :], (G, T))
    with np.errstate(all="ignore"):
        first_idx = np.argmax(p, axis=1)
        first_ub = np.take_along_axis(np.broadcast_to(bk.ub[:, :, None], (G, B, T)), first_idx[:, None, :], axis=1)[:, 0, :]
        last_idx = B - 1 - np.argmax(p[:, ::-1, :], axis=1)
        count = np.take_along_axis(c, last_idx[:, None, :], axis=1)[:, 0, :]
        lower_bound = np.where(first_ub <= 0, -np.inf, 0.0)
        rank = np.zeros((G, T))
        lower_rank = np.zeros((G, T))
        upper_rank = np.zeros((G, T))
        lower_set = np.zeros((G, T), dtype=bool)
        upper_set = np.zeros((G, T), dtype=bool)
        done = np.zeros((G, T), dtype=bool)
        seen = np.zeros((G, T), dtype=bool)
        prev_ub = np.zeros((G, T))
        for j in range(B):
            pj = p[:, j, :] & ~done
            cj = c[:, j, :]
            ubj = np.broadcast_to(bk.ub[:, j][:, None], (G, T))
            lb = np.where(seen, prev_ub, lower_bound)

            def interp(v: np.ndarray) -> np.ndarray:
                return np.where(np.isneginf(lb), cj, rank + (cj - rank) * (v - lb) / (ubj - lb))

            hit_l = pj & ~lower_set & (lb >= lower)
            lower_rank = np.where(hit_l, rank, lower_rank)
            lower_set |= hit_l
            hit_u = pj & ~upper_set & (lb >= upper)
            upper_rank = np.where(hit_u, rank, upper_rank)
            upper_set |= hit_u
            stop = pj & lower_set & upper_set
            done |= stop
            go = pj & ~stop
            in_l = go & ~lower_set & (lb < lower) & (ubj > lower)
            lower_rank = np.where(in_l, interp(lower), lower_rank)
            lower_set |= in_l
            in_u = go & ~upper_set & (lb < upper) & (ubj > upper)
            upper_rank = np.where(in_u, interp(upper), upper_rank)
            upper_set |= in_u
            stop2 = go & lower_set & upper_set
            done |= stop2
            cont = go & ~stop2
            rank = np.where(cont, cj, rank)
            prev_ub = np.where(p[:, j, :], ubj, prev_ub)
            seen |= p[:, j, :]
        lower_rank = np.where(~lower_set | (lower_rank > count), count, lower_rank)
        upper_rank = np.where(~upper_set | (upper_rank > count), count, upper_rank)
        res = (upper_rank - lower_rank) / count
        res = np.where(lower >= upper, 0.0, res)
        res = np.where((count == 0) | np.isnan(lower) | np.isnan(upper), np.nan, res)
        res = np.where(bk.last_present_is_inf(), res, np.nan)
    return res


@register("histogram_fraction", histograms=Histograms.NATIVE)
def histogram_fraction(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[2])
    T = vec.num_steps
    lower = scalar_arg(args[0], T)
    upper = scalar_arg(args[1], T)
    bk = _Buckets(ctx, vec, 2)
    G = len(bk.labels)
    if G == 0:
        return VectorSteps.empty(T)
    parts = [(bucket_fractions(blk, lower[t0:t1], upper[t0:t1]), blk.output_present()) for t0, t1, blk in bk.blocks()]
    res = np.concatenate([p[0] for p in parts], axis=1)
    present = np.concatenate([p[1] for p in parts], axis=1)
    return VectorSteps(bk.labels, np.where(present, res, 0.0), present, np.ones(G, dtype=bool))


def _native_only(ctx: FunctionContext, args: list[Value]) -> Value:
    """Functions defined on native histogram samples only: float samples give no output."""
    vec = vector_arg(args[0])
    return VectorSteps.empty(vec.num_steps)


def _histogram_avg(h: FloatHistogram) -> float:
    return h.divide(h.count).sum if h.count else FloatHistogram(sum=h.sum).divide(0.0).sum


register("histogram_count", histograms=Histograms.PROPERTY, histogram_property=lambda h: h.count)(_native_only)
register("histogram_sum", histograms=Histograms.PROPERTY, histogram_property=lambda h: h.sum)(_native_only)
register("histogram_avg", histograms=Histograms.PROPERTY, histogram_property=_histogram_avg)(_native_only)
register("histogram_stddev", histograms=Histograms.NATIVE)(_native_only)
register("histogram_stdvar", histograms=Histograms.NATIVE)(_native_only)


def format_openmetrics_float(v: float) -> str:
    """labels.FormatOpenMetricsFloat: Go's %g, with ".0" appended to integral values."""
    s = format_go_g(v)
    if math.isnan(v) or math.isinf(v) or "e" in s or "." in s:
        return s
    return s + ".0"


@register("histogram_quantiles", histograms=Histograms.QUANTILES, experimental=True)
def histogram_quantiles(ctx: FunctionContext, args: list[Value]) -> Value:
    """Experimental: several quantiles at once, each output series labelled with its quantile."""

    vec = vector_arg(args[0])
    T = vec.num_steps
    label = string_arg(args[1])
    q_arrays = [scalar_arg(a, T) for a in args[2:]]
    for i, qs in enumerate(q_arrays):
        _quantile_warning(ctx, qs, 2 + i)
    bk = _Buckets(ctx, vec, 0)
    G = len(bk.labels)
    if G == 0:
        return VectorSteps.empty(T)
    out_labels: list[Labels] = []
    vals: list[np.ndarray] = []
    pres: list[np.ndarray] = []
    for qs in q_arrays:
        res, rep, present = _quantiles_all_steps(bk, qs)
        _report_monotonicity(ctx, bk, rep, present, 0)
        # The quantile label value is per step in general; Prometheus computes it per step too.
        uniq = np.unique(qs[~np.isnan(qs)]).tolist() + ([float("nan")] if np.isnan(qs).any() else [])
        for qv in uniq:
            at = np.isnan(qs) if math.isnan(qv) else (qs == qv)
            qstr = format_openmetrics_float(float(qv))
            for g in range(G):
                p = present[g] & at
                if not p.any():
                    continue
                out_labels.append(set_label(bk.labels[g], label, qstr))
                vals.append(np.where(p, res[g], 0.0))
                pres.append(p)
    if not out_labels:
        return VectorSteps.empty(T)
    return merge_same_labelsets(out_labels, np.array(vals), np.array(pres, dtype=bool), np.ones(len(out_labels), dtype=bool))
