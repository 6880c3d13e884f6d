"""The histogram plane of vectors and windows: reading native-histogram samples beside floats,
the plane helpers every histogram-aware consumer shares, and Prometheus's annotation wording.

The layout is described in promql/types.py: a histogram cell is never ``present`` in the float
plane, so code that does not know histograms ignores them. What each consumer does with the plane
(functions, aggregation, binary operators) is in promql/eval_histogram.py and the modules beside
it; they all build on this one, which imports none of them.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from promql.errors import ExecutionError
from storage.go_format import go_quote
from promql.sample_windows import window_index
from promql.types import FloatHistogram, HistogramSet, HistWindows, RangeWindows, Value, VectorSteps
from storage.labels import Labels
from storage.matchers import Matcher
from storage.series_set import SeriesSet

# --- annotation wording (Prometheus util/annotations/annotations.go) ---------------------------


def ignored_in_aggregation(op: str, pos: str) -> str:
    return f"PromQL info: ignored histogram in {op} aggregation{pos}"


def mixed_aggregation(pos: str) -> str:
    return f"PromQL warning: encountered a mix of histograms and floats for aggregation{pos}"


def mixed_range_ignored(name: str, pos: str) -> str:
    return ("PromQL info: ignored histograms in a range containing both floats and histograms for metric name "
            f"{go_quote(name)}{pos}")


def mixed_floats_histograms(name: str, pos: str) -> str:
    return f"PromQL warning: encountered a mix of histograms and floats for metric name {go_quote(name)}{pos}"


def incompatible_binop(lhs_type: str, op: str, rhs_type: str, pos: str) -> str:
    return f"PromQL info: incompatible sample types encountered for binary operator {go_quote(op)}: {lhs_type} {op} {rhs_type}{pos}"


def mixed_exponential_custom(name: str, pos: str) -> str:
    return ("PromQL warning: vector contains a mix of histograms with exponential and custom buckets schemas for "
            f"metric name {go_quote(name)}{pos}")


def reconciled_info(operation: str, pos: str) -> str:
    """``operation``: addition, subtraction or aggregation."""
    return f"PromQL info: mismatched custom buckets were reconciled during {operation}{pos}"


def unsupported(what: str) -> ExecutionError:
    return ExecutionError(f"{what} is not supported for native histogram samples")


# --- reading --------------------------------------------------------------------------------


def select_histograms(source: Any, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> HistogramSet | None:
    fn = getattr(source, "select_histograms", None)
    if fn is None:
        return None
    parts = [p for p in (fn(ms, mint, maxt) for ms in matcher_sets) if p is not None and p.num_samples]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    seen: dict[Labels, tuple[np.ndarray, np.ndarray]] = {}
    for p in parts:  # per series (the parser's `or` matcher sets)
        for i, lbl in enumerate(p.labels):
            if lbl not in seen:
                a, b = int(p.offsets[i]), int(p.offsets[i + 1])
                seen[lbl] = (p.timestamps[a:b], p.hists[a:b])
    labels = sorted(seen)
    off = np.zeros(len(labels) + 1, np.int64)
    np.cumsum([len(seen[l][0]) for l in labels], out=off[1:])
    return HistogramSet(labels, off, np.concatenate([seen[l][0] for l in labels]),
                        np.concatenate([seen[l][1] for l in labels]))


def _reoffset(src_labels: list[Labels], offsets: np.ndarray, labels: list[Labels]) -> np.ndarray:
    """Offsets of a sorted CSR re-indexed onto a sorted superset of its labels (data unchanged)."""
    lens = dict(zip(src_labels, np.diff(offsets).tolist()))
    out = np.zeros(len(labels) + 1, np.int64)
    np.cumsum([lens.get(l, 0) for l in labels], out=out[1:])
    return out


def align(ss: SeriesSet, hs: HistogramSet) -> tuple[SeriesSet, HistogramSet]:
    """Both selections over the same (sorted) union of series."""
    if list(ss.labels) == list(hs.labels):
        return ss, hs
    labels = sorted(set(ss.labels) | set(hs.labels))
    fs = SeriesSet(labels, _reoffset(list(ss.labels), ss.offsets, labels), ss.timestamps, ss.values)
    hh = HistogramSet(labels, _reoffset(list(hs.labels), hs.offsets, labels), hs.timestamps, hs.hists, hs.plain)
    return fs, hh


def read_hint_sample(objs: np.ndarray, plain: np.ndarray | None, ts: np.ndarray, first: int, i: int,
                     start: int) -> FloatHistogram:
    """Sample ``i`` as the stats iterator returns it when it starts reading at ``start``: its
    computed hint if the previous histogram of the series was read too, else as stored.
    ``first``: index of the series' first sample."""
    if plain is None or (i > first and int(ts[i - 1]) >= start):
        return objs[i]
    return plain[i]


def vector_plane(hs: HistogramSet, e: np.ndarray, lookback: int, f_has: np.ndarray, f_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Instant selection of histograms: (hist object (S, T), hist-wins mask, its timestamps).

    A histogram is the series' sample at a step when it is inside the lookback and newer than the
    newest float sample (stale markers included) at or before that step."""
    hi = window_index(hs.offsets, hs.timestamps, e)
    idx = hi - 1
    has = idx >= hs.offsets[:-1, None]
    safe = np.where(has, idx, 0)
    hts = hs.timestamps[safe]
    inside = has & (hts > (e - lookback)[None, :])
    wins = inside & (~f_has | (hts > f_ts))
    plane = np.full(wins.shape, None, dtype=object)
    plane[wins] = hs.hists[safe[wins]]
    if hs.plain is not None:  # stats-iterator hints: only if the previous sample was read too
        rows, cols = np.nonzero(wins)
        for r, c in zip(rows.tolist(), cols.tolist()):  # histogram cells only
            plane[r, c] = read_hint_sample(hs.hists, hs.plain, hs.timestamps, int(hs.offsets[r]), int(safe[r, c]),
                                           int(e[c]) - lookback)
    return plane, wins, hts


def window_plane(hs: HistogramSet, e: np.ndarray, rng: int, before: int = 0, after: int = 0) -> HistWindows:
    """The histogram windows ``(e - rng, e]``; an extended (anchored/smoothed) selection's reach
    ``before`` ms further back and ``after`` ms further on, as its float windows do."""
    return HistWindows(hs.offsets, hs.timestamps, hs.hists, window_index(hs.offsets, hs.timestamps, e - rng - before),
                       window_index(hs.offsets, hs.timestamps, e + after), hs.plain)


def window_histograms(hw: HistWindows, s: int, lo: int, hi: int, start: int) -> list[FloatHistogram]:
    """The histograms of one window ``[lo, hi)`` of series ``s`` starting at ``start``, with the
    hints they are read with (see read_hint_sample)."""
    out = list(hw.objs[lo:hi])
    if out and hw.plain is not None:
        out[0] = read_hint_sample(hw.objs, hw.plain, hw.ts, int(hw.offsets[s]), lo, start)
    return out


def plane_to_set(labels: list[Labels], plane: np.ndarray | None, times: np.ndarray) -> HistogramSet | None:
    """A vector's histogram plane as CSR samples at ``times`` (a subquery's inner steps)."""
    if plane is None:
        return None
    hm = np.not_equal(plane, None)
    if not hm.any():
        return None
    rows, cols = np.nonzero(hm)
    off = np.zeros(len(labels) + 1, np.int64)
    np.cumsum(hm.sum(axis=1), out=off[1:])
    objs = plane[rows, cols]
    # Prometheus forgets reset / not_reset hints of subquery samples (a subquery may skip or
    # repeat samples), so counter resets are detected explicitly again
    for k, h in enumerate(objs):
        if h.counter_reset_hint in ("reset", "not_reset"):
            objs[k] = with_hint(h, "unknown")
    return HistogramSet(list(labels), off, times[cols].astype(np.int64), objs)


# --- plane helpers --------------------------------------------------------------------------


def has_hist(v: Value) -> bool:
    if isinstance(v, VectorSteps):
        return v.hist is not None and bool(np.not_equal(v.hist, None).any())
    if isinstance(v, RangeWindows):
        return v.hist is not None and bool((v.hist.hi > v.hist.lo).any())
    return False


def strip(v: Value) -> Value:
    """The float plane only."""
    if isinstance(v, VectorSteps) and v.hist is not None:
        return VectorSteps(v.labels, v.values, v.present, v.drop_name, v.sample_ts)
    if isinstance(v, RangeWindows) and v.hist is not None:
        return RangeWindows(v.labels, v.offsets, v.ts, v.vals, v.lo, v.hi, v.window_end, v.range_ms, v.drop_name,
                            extended=v.extended)
    return v


def union_presence(vec: VectorSteps) -> VectorSteps:
    """Every sample present (histograms as NaN placeholders) and no histogram plane: for consumers
    that only look at which samples exist (count, group, absent, timestamp, matching)."""
    hm = vec.hist_mask()
    if hm is None:
        return vec
    return VectorSteps(vec.labels, np.where(hm, np.nan, vec.values), vec.present | hm, vec.drop_name, vec.sample_ts)


def with_plane(vec: VectorSteps, plane: np.ndarray | None) -> VectorSteps:
    """``vec`` (same rows) with histogram cells ``plane`` (taken out of its float plane)."""
    if plane is None:
        return vec
    hm = np.not_equal(plane, None)
    if not hm.any():
        return vec
    return VectorSteps(vec.labels, vec.values, vec.present & ~hm, vec.drop_name, vec.sample_ts, plane)


def empty_plane(shape: tuple[int, int]) -> np.ndarray:
    return np.full(shape, None, dtype=object)


def window_counts(rw: RangeWindows) -> tuple[np.ndarray, np.ndarray]:
    """(float samples, histogram samples) per (series, step) window."""
    nf = rw.hi - rw.lo
    nh = rw.hist.hi - rw.hist.lo if rw.hist is not None else np.zeros_like(nf)
    return nf, nh


def with_hint(h: FloatHistogram, hint: str) -> FloatHistogram:
    return FloatHistogram(h.schema, h.count, h.sum, h.zero_threshold, h.zero_count, h.positive, h.negative,
                          h.custom_values, hint)


def mask_cells(out: Value, rw: RangeWindows, cells: np.ndarray) -> Value:
    """Remove the (series, step) cells of a per-series function result."""
    if not cells.any() or not isinstance(out, VectorSteps):
        return out
    pos = {l: i for i, l in enumerate(rw.labels)}
    rows = np.array([pos.get(l, -1) for l in out.labels], dtype=np.int64)
    kill = np.where(rows[:, None] >= 0, cells[np.maximum(rows, 0)], False)
    return VectorSteps(out.labels, out.values, out.present & ~kill, out.drop_name, out.sample_ts)


def window_sequence(rw: RangeWindows, s: int, c: int) -> list[tuple[int, float | FloatHistogram]] | None:
    """The samples of window (s, c), floats and histograms in time order. For an ``anchored``
    selection: the last sample at or before the window start (of either kind; older ones are
    skipped), then the samples inside; None when there is no sample inside (no result)."""
    assert rw.hist is not None
    seq: list[tuple[int, float | FloatHistogram]] = sorted(
        [(int(rw.ts[i]), float(rw.vals[i])) for i in range(int(rw.lo[s, c]), int(rw.hi[s, c]))]
        + [(int(rw.hist.ts[i]), rw.hist.objs[i]) for i in range(int(rw.hist.lo[s, c]), int(rw.hist.hi[s, c]))],
        key=lambda p: p[0])
    if rw.extended != "anchored":
        return seq
    start = int(rw.window_end[c]) - rw.range_ms
    k = next((i for i, (t, _) in enumerate(seq) if t > start), len(seq))
    if k == len(seq):
        return None
    return seq[max(k - 1, 0):]
