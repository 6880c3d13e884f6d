"""Vector and matrix selectors, vectorized over all (series, step) pairs.

A selection's samples arrive as one CSR block (``SeriesSet``). The window bounds of every
(series, step) pair come from a single ``searchsorted`` over a composite (series, time) key, so
there is no loop over points:

* instant vector at effective time e: the last sample with ``e - lookback < t <= e``; a stale
  marker there hides the series;
* range vector at e: all samples with ``e - range < t <= e`` (left-open), stale markers removed.

Effective time per step = (``@`` time if given, else the step time) - ``offset``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from promql.errors import BadData, TooManySamples
from promql.eval_context import EvalContext
from promql.parser import AtModifierType
from promql.eval_histogram import smoothed_selection, with_stats_hints
from promql.histogram_planes import align, select_histograms, vector_plane, window_plane
from promql.sample_windows import drop_stale, window_index
from promql.types import HistogramSet, RangeWindows, VectorSteps
from storage.labels import METRIC_NAME
from storage.matchers import Matcher
from storage.series_set import SeriesSet
from storage.stale import is_stale

_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def duration_ms(td: Any) -> int:
    """A parser duration (datetime.timedelta, may be negative) in integer milliseconds."""
    if td is None:
        return 0
    return (td.days * 86_400_000) + (td.seconds * 1000) + (td.microseconds // 1000)


def at_ms(node: Any, ctx: EvalContext) -> int | None:
    """The node's ``@`` time in ms (may be before 1970), or None. ``start()``/``end()`` are the
    query's bounds."""
    at = node.at
    if at is None:
        return None
    if at.type == AtModifierType.Start:
        return ctx.query_start_ms
    if at.type == AtModifierType.End:
        return ctx.query_end_ms
    return at.ms


def effective_times(node: Any, ctx: EvalContext) -> np.ndarray:
    """Per step: (@ time or step time) - offset, int64 (T,)."""
    off = duration_ms(node.offset)
    at = at_ms(node, ctx)
    if at is not None:
        return np.full(ctx.num_steps, at - off, dtype=np.int64)
    return ctx.step_times - off


def selector_matchers(vs: Any) -> list[list[Matcher]]:
    """A parsed vector selector's matcher sets (more than one only for the parser's ``or``
    extension), the metric name first. The one parser-to-storage matcher conversion: queries,
    the planner and the HTTP API's ``match[]`` all use it, so they accept the same regexes.
    Raises :class:`storage.regex.RegexError` (a ValueError) for a regex RE2 refuses."""
    base: list[Matcher] = []
    if vs.name:
        base.append(Matcher(METRIC_NAME, "=", vs.name))
    groups = [vs.matchers.matchers] if not vs.matchers.or_matchers else list(vs.matchers.or_matchers)
    return [base + [Matcher(m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value) for m in group] for group in groups]


def to_matchers(vs: Any) -> list[list[Matcher]]:
    """The selector's matcher sets for evaluation: each must have a matcher that rejects ""."""
    try:
        sets = selector_matchers(vs)
    except ValueError as e:
        raise BadData(str(e)) from e
    for ms in sets:
        if not ms or all(m.matches_empty for m in ms):
            raise BadData("vector selector must contain at least one non-empty matcher")
    return sets


def select(ctx: EvalContext, vs: Any, mint: int, maxt: int) -> SeriesSet:
    sets = to_matchers(vs)
    if len(sets) == 1:
        ss = ctx.source.select(sets[0], mint, maxt)
    else:
        ss = _union([ctx.source.select(ms, mint, maxt) for ms in sets])
    ctx.stats.series_touched += len(ss.labels)
    ctx.stats.samples_scanned += ss.num_samples
    return ss


def _union(parts: list[SeriesSet]) -> SeriesSet:
    seen: dict = {}
    for p in parts:
        for i, lbl in enumerate(p.labels):
            if lbl not in seen:
                seen[lbl] = p.series(i)
    labels = sorted(seen)
    lens = np.array([len(seen[l][0]) for l in labels], np.int64)
    off = np.zeros(len(labels) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    if not labels:
        return SeriesSet.empty()
    return SeriesSet(labels, off, np.concatenate([seen[l][0] for l in labels]), np.concatenate([seen[l][1] for l in labels]))


def _count_step_samples(ctx: EvalContext, per_step: np.ndarray) -> None:
    """Prometheus-style totalQueryableSamples (and per top-level step)."""
    ctx.stats.total_queryable_samples += int(per_step.sum())
    if ctx.subquery_depth == 0:
        st = ctx.stats.samples_per_step
        if st is None:
            ctx.stats.samples_per_step = (ctx.step_times.copy(), per_step.astype(np.int64))
        elif len(st[1]) == len(per_step):
            st[1][:] += per_step.astype(np.int64)


def _guard_cells(ctx: EvalContext, s: int, t: int) -> None:
    """Dense (S, T) results cost ~17 bytes per cell: refuse before allocating when even a
    quarter of the cells would exceed the sample limit, or when they would take the query over
    its memory budget."""
    if s * t > 4 * ctx.budget.max_samples:
        raise TooManySamples()
    ctx.budget.reserve_cells(s, t, 64)  # int64 window indexes, gathered values/timestamps, masks


def _select_hist(ctx: EvalContext, vs: Any, mint: int, maxt: int, ss: SeriesSet) -> tuple[SeriesSet, HistogramSet | None]:
    """Native-histogram samples of the selection (only sources holding them have any), with both
    selections aligned onto the same series."""
    if not hasattr(ctx.source, "select_histograms") or not getattr(ctx.source, "has_histograms", True):
        return ss, None  # float-only source (the real storage): nothing to do
    stats = id(vs) in ctx.extra.get("histogram_stats_selectors", ())
    # read through Prometheus's HistogramStatsIterator: from the window start itself (its seek
    # includes it), for the hint of the first sample inside
    hs = select_histograms(ctx.source, to_matchers(vs), mint - 1 if stats else mint, maxt)
    if hs is None:
        return ss, None
    if stats:
        hs = with_stats_hints(hs)
    ctx.stats.samples_scanned += hs.num_samples
    ctx.stats.series_touched += len(set(hs.labels) - set(ss.labels))
    return align(ss, hs)


def eval_vector_selector(ctx: EvalContext, vs: Any, pos: str = "") -> VectorSteps:
    """``pos``: the selector's position suffix, for the annotations of a smoothed selection."""
    e = effective_times(vs, ctx)
    lb = ctx.lookback_delta_ms
    t = ctx.num_steps
    mint, maxt = int(e.min()) - lb + 1, int(e.max()) + (lb if vs.smoothed else 0)
    ss = select(ctx, vs, mint, maxt)
    ss, hs = _select_hist(ctx, vs, mint, maxt, ss)
    if vs.smoothed:
        floats = _smoothed_steps(ctx, ss, e, lb)
        return floats if hs is None else smoothed_selection(ss, hs, floats, e, lb, pos, ctx.annotations)
    s = len(ss.labels)
    if s == 0:
        return VectorSteps.empty(t)
    _guard_cells(ctx, s, t)
    if ss.num_samples == 0 and hs is None:
        return VectorSteps.empty(t)
    rows = max(1, _SELECT_BLOCK_CELLS // max(t, 1))
    if hs is not None or s <= rows:
        return _select_steps(ctx, ss, hs, e, lb)
    # Blocks of series: numpy holds the GIL through each call on the whole (S, T) grid (a 5000 x 3600
    # selection stalled the event loop for 100s of ms); blocks keep each call short and the
    # temporaries small.
    parts = []
    for a in range(0, s, rows):
        ctx.budget.check()
        b = min(s, a + rows)
        lo_, hi_ = int(ss.offsets[a]), int(ss.offsets[b])
        sub = SeriesSet(ss.labels[a:b], ss.offsets[a:b + 1] - lo_, ss.timestamps[lo_:hi_], ss.values[lo_:hi_])
        part = _select_steps(ctx, sub, None, e, lb)
        if part.num_series:
            parts.append(part)
    if not parts:
        return VectorSteps.empty(t)
    if len(parts) == 1:
        return parts[0]
    return VectorSteps([l for p_ in parts for l in p_.labels], np.concatenate([p_.values for p_ in parts]),
                       np.concatenate([p_.present for p_ in parts]), None,
                       np.concatenate([p_.sample_ts for p_ in parts]))


_SELECT_BLOCK_CELLS = 1 << 20


def _select_steps(ctx: EvalContext, ss: SeriesSet, hs: HistogramSet | None, e: np.ndarray, lb: int) -> VectorSteps:
    """The instant-vector selection of ``ss`` at times ``e`` with lookback ``lb``."""
    hi = window_index(ss.offsets, ss.timestamps, e)
    idx = hi - 1
    starts = ss.offsets[:-1, None]
    has = idx >= starts
    if ss.num_samples:
        safe = np.where(has, idx, 0)
        sts = ss.timestamps[safe]
        vals = ss.values[safe]
    else:
        safe = np.zeros(has.shape, np.int64)
        sts = np.zeros(has.shape, np.int64)
        vals = np.zeros(has.shape)
    stale_n = is_stale(ss.values)
    present = has & (sts > (e - lb)[None, :])
    plane = None
    if hs is not None:  # a histogram newer than the newest float (stale marker included) wins
        plane, wins, hts = vector_plane(hs, e, lb, present, sts)
        present &= ~wins
        sts = np.where(wins, hts, sts)
    if stale_n.any():
        present &= ~stale_n[safe]
    alive = present if plane is None else (present | wins)
    _count_step_samples(ctx, alive.sum(axis=0))
    # absent cells keep whatever value was gathered: VectorSteps values are ignored there
    out = VectorSteps(list(ss.labels), vals, present, None, sts, plane)
    keep = alive.any(axis=1)
    if not keep.all():
        idxs = np.flatnonzero(keep)
        out = VectorSteps([out.labels[i] for i in idxs.tolist()], vals[idxs], present[idxs], None, sts[idxs],
                          None if plane is None else plane[idxs])
    return out


def _smoothed_steps(ctx: EvalContext, ss: SeriesSet, e: np.ndarray, lb: int) -> VectorSteps:
    """A ``smoothed`` instant-vector selector (Prometheus 3.x, floats): at each time e the sample
    at e, else the straight line between the samples around e (within the lookback delta on each
    side), else the last sample before e; nothing when there is no sample before e."""
    t = len(e)
    s = len(ss.labels)
    if s == 0 or ss.num_samples == 0:
        return VectorSteps.empty(t)
    _guard_cells(ctx, s, t)
    ts, vals, off = drop_stale(ss)
    lo = window_index(off, ts, e - lb)  # first sample after e - lb
    hi = window_index(off, ts, e + lb)  # one past the last sample at or before e + lb
    i = np.minimum(np.maximum(window_index(off, ts, e - 1), lo), hi)  # first sample at or after e
    top = max(len(ts) - 1, 0)
    has_next = i < hi
    has_prev = i > lo
    nxt = np.minimum(i, top)
    prv = np.clip(i - 1, 0, top)
    if len(ts):
        t_next, v_next = ts[nxt], vals[nxt]
        t_prev, v_prev = ts[prv], vals[prv]
    else:
        t_next = t_prev = np.zeros((s, t), np.int64)
        v_next = v_prev = np.zeros((s, t))
    exact = has_next & (t_next == e[None, :])
    with np.errstate(all="ignore"):
        line = v_prev + (v_next - v_prev) * (e[None, :] - t_prev).astype(np.float64) / (t_next - t_prev).astype(np.float64)
    values = np.where(exact, v_next, np.where(has_next, line, v_prev))
    present = exact | has_prev
    _count_step_samples(ctx, present.sum(axis=0))
    sts = np.broadcast_to(e[None, :], (s, t)).astype(np.int64)
    keep = present.any(axis=1)
    idxs = np.flatnonzero(keep)
    return VectorSteps([ss.labels[k] for k in idxs.tolist()], values[idxs], present[idxs], None, sts[idxs])


def eval_matrix_selector(ctx: EvalContext, ms: Any) -> RangeWindows:
    vs = ms.vector_selector
    rng = duration_ms(ms.range)
    e = effective_times(vs, ctx)
    # anchored: also the samples up to the lookback delta before each window; smoothed: and after
    extended = "anchored" if vs.anchored else "smoothed" if vs.smoothed else None
    before = ctx.lookback_delta_ms if extended else 0
    after = ctx.lookback_delta_ms if extended == "smoothed" else 0
    mint, maxt = int(e.min()) - rng - before + 1, int(e.max()) + after
    ss = select(ctx, vs, mint, maxt)
    ss, hs = _select_hist(ctx, vs, mint, maxt, ss)
    return windows_from_series(ctx, ss, e, rng, hs=hs, extended=extended, before=before, after=after)


def windows_from_series(ctx: EvalContext, ss: SeriesSet, e: np.ndarray, rng: int, drop_name: np.ndarray | None = None,
                        count_samples: bool = True, hs: HistogramSet | None = None, extended: str | None = None,
                        before: int = 0, after: int = 0) -> RangeWindows:
    """RangeWindows over a CSR selection for window ends ``e`` and range ``rng`` (stale markers
    removed); ``hs``: histogram samples of the same series (aligned), if any. An ``extended``
    selection's ``[lo, hi)`` reaches ``before`` ms further back and ``after`` ms further on."""
    _guard_cells(ctx, len(ss.labels), len(e))
    ts, vals, off = ss.timestamps, ss.values, ss.offsets
    stale = is_stale(vals)
    if stale.any():
        keep = ~stale
        counts = np.add.reduceat(keep.astype(np.int64), off[:-1]) if len(ts) else np.zeros(len(off) - 1, np.int64)
        # reduceat on empty segments returns the element at the start; fix those
        counts = np.where(np.diff(off) == 0, 0, counts)
        ts, vals = ts[keep], vals[keep]
        off = np.zeros(len(off), np.int64)
        np.cumsum(counts, out=off[1:])
    hi = window_index(off, ts, e + after)
    lo = window_index(off, ts, e - rng - before)
    # samples held are charged by the evaluator for the node (all windows, or one series' when a
    # function consumes them series by series, as Prometheus's engine does)
    if hi.size and count_samples:  # raw selections only (a subquery's inner selectors count themselves)
        _count_step_samples(ctx, (hi - lo).sum(axis=0))
    hw = window_plane(hs, e, rng, before, after) if hs is not None else None
    return RangeWindows(list(ss.labels), off, ts, vals, lo, hi, e.astype(np.int64), rng, drop_name, hw, extended)
