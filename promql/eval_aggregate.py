"""Aggregation operators over (S, T) matrices.

Rows are grouped once per query (per-series Python for the grouping key), sorted by group, and
every aggregation then works on whole column blocks:

* count / group / min / max: ``reduceat`` over the group-sorted rows;
* sum / avg / stddev / stdvar: Prometheus's sequential algorithms (Kahan-Neumaier summation,
  direct mean with a switch to incremental mean on overflow, Welford variance), vectorized
  across groups and steps by iterating over the *rank within the group* -- so results are
  bit-identical to Prometheus for groups of up to ``RANK_LOOP_MAX`` series. Larger groups use a
  compensated pairwise (TwoSum tree) reduction instead of a Python loop over series;
* quantile / topk / bottomk / limitk: stable argsorts along the series axis of every column;
* count_values: ``np.unique`` over present values.
"""
from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from promql.errors import ExecutionError
from storage.go_format import format_float_f, format_float_g
from promql.eval_histogram import aggregate_histograms
from promql.histogram_planes import has_hist, ignored_in_aggregation, strip, union_presence, unsupported
from promql.eval_histogram_buckets import histogram_string
from promql.eval_labels import dense_ids, grouping_keys, grouping_labels, merge_same_labels
from promql.types import Annotations, Scalar, StringValue, VectorSteps
from storage.labels import METRIC_NAME, Labels

RANK_LOOP_MAX = 64
_MAX_INT64 = float(2**63)
_REDUCE_BLOCK_CELLS = 1 << 20


class Groups:
    """Rows grouped by output label set, in order of first appearance."""

    def __init__(self, labels: list[Labels], names: list[str], without: bool) -> None:
        keys = grouping_keys(labels, names, without)
        self.gid, self.labels = dense_ids(keys)
        self.n = len(self.labels)
        self.order = np.argsort(self.gid, kind="stable")
        self.sizes = np.bincount(self.gid, minlength=self.n).astype(np.int64)
        self.starts = np.zeros(self.n, np.int64)
        if self.n:
            np.cumsum(self.sizes[:-1], out=self.starts[1:])

    def reduce(self, ufunc: Any, x: np.ndarray) -> np.ndarray:
        """ufunc.reduceat over group-sorted rows: (G, T). Done in blocks of steps: numpy holds the
        GIL through one reduceat, and a (5000 x 3600) one takes ~120 ms the event loop would wait."""
        if self.n == 0:
            return np.zeros((0, x.shape[1]), x.dtype)
        s, t = x.shape
        step = max(1, _REDUCE_BLOCK_CELLS // max(s, 1))
        if step >= t:
            return ufunc.reduce(x, axis=0, keepdims=True) if self.n == 1 else ufunc.reduceat(x[self.order], self.starts, axis=0)
        out = np.empty((self.n, t), dtype=ufunc.reduce(x[:1, :1], axis=0).dtype)
        for a in range(0, t, step):
            blk = x[:, a:a + step]
            out[:, a:a + step] = (ufunc.reduce(blk, axis=0, keepdims=True) if self.n == 1
                                  else ufunc.reduceat(blk[self.order], self.starts, axis=0))
        return out

    def ranks(self, small_only: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (group ids, row ids) for rank 0, 1, ... within each (small) group."""
        sel = self.sizes <= RANK_LOOP_MAX if small_only else np.ones(self.n, bool)
        groups = np.flatnonzero(sel)
        if len(groups) == 0:
            return
        sizes = self.sizes[groups]
        for r in range(int(sizes.max())):
            g = groups[sizes > r]
            yield g, self.order[self.starts[g] + r]

    def large(self) -> list[int]:
        return np.flatnonzero(self.sizes > RANK_LOOP_MAX).tolist()

    def rows_of(self, g: int) -> np.ndarray:
        return self.order[self.starts[g]: self.starts[g] + self.sizes[g]]


def _kahan_inc(x: np.ndarray, s: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prometheus's kahansum.Inc (Neumaier variant), elementwise."""
    t = s + x
    big = np.abs(s) >= np.abs(x)
    c2 = c + np.where(big, (s - t) + x, (x - t) + s)
    c2 = np.where(np.isinf(t), 0.0, c2)
    return t, c2


_WIDE = np.longdouble if np.finfo(np.longdouble).nmant >= 63 else None


def tree_sum(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accurate sum along axis 0 for big groups: (sum, compensation).

    With x86 80-bit long doubles (64-bit mantissa, wider exponent) a single widened pass is
    as accurate as Kahan summation for practical inputs and cannot overflow; elsewhere an
    error-free TwoSum pairwise tree is used."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] == 0:
        z = np.zeros(x.shape[1:])
        return z, z.copy()
    if _WIDE is not None:
        s = x.astype(_WIDE).sum(axis=0).astype(np.float64)
        return s, np.zeros_like(s)
    e = np.zeros_like(x)
    while x.shape[0] > 1:
        if x.shape[0] % 2:
            x = np.concatenate([x, np.zeros((1,) + x.shape[1:])], axis=0)
            e = np.concatenate([e, np.zeros((1,) + e.shape[1:])], axis=0)
        a, b = x[0::2], x[1::2]
        s = a + b
        bb = s - a
        err = (a - (s - bb)) + (b - bb)
        err = np.where(np.isfinite(s), err, 0.0)
        e = e[0::2] + e[1::2] + err
        x = s
    return x[0], e[0]


def wide_mean(x: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Mean along axis 0 of ``x`` (absent entries already 0) over ``cnt`` present values."""
    if _WIDE is not None:
        w = x.astype(_WIDE).sum(axis=0) / np.maximum(cnt, 1)
        return w.astype(np.float64)
    ss, cc = tree_sum(x)
    with np.errstate(all="ignore"):
        direct = ss / np.maximum(cnt, 1) + cc / np.maximum(cnt, 1)
        over = np.isinf(ss) & ~np.isinf(x).any(axis=0)
        if over.any():
            ms, mc = tree_sum(x / np.maximum(cnt, 1))
            direct = np.where(over, ms + mc, direct)
    return direct


def _finish(s: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(s), s + c, s)


# A widened sum is kept only where it cannot differ from the compensated one by more than rounding:
# its error is at most n * 2**-64 * sum|x|, which must stay below 2**-53 * |sum| (half a float64 unit
# in the last place), i.e. n * sum|x| < 2**11 * |sum|. Cancellation (the compensated-sum test cases:
# 1e100 + 1 - 1e100), non-finite values and overflow all fail it and take the sequential recurrence.
_WIDE_SLACK = float(2**11)
# ... and only for few steps (instant queries, rules, a refresh's newest steps), where it replaces the
# recurrence's ~15 numpy calls per rank by a handful; over long ranges the widened arrays fall out of
# cache and the recurrence is as fast.
_WIDE_MAX_STEPS = 64


def _wide_group_sums(vec: VectorSteps, g: Groups) -> tuple[np.ndarray, np.ndarray] | None:
    """(sum, count of present values) per group and step in one widened pass over the group-sorted
    rows, or None when some cell could differ from Prometheus's sequential compensated sum by more
    than rounding (see ``_WIDE_SLACK``). Replaces ~15 numpy calls per rank of the largest group."""
    if _WIDE is None or g.n == 0 or vec.num_steps > _WIDE_MAX_STEPS:
        return None
    P = vec.present[g.order]
    x = np.where(P, vec.values[g.order], 0.0)
    if g.n == 1:
        wide = x.astype(_WIDE).sum(axis=0, keepdims=True)
        mag = np.abs(x).sum(axis=0, keepdims=True)
        cnt = P.sum(axis=0, keepdims=True)
    else:
        wide = np.add.reduceat(x.astype(_WIDE), g.starts, axis=0)
        mag = np.add.reduceat(np.abs(x), g.starts, axis=0)
        cnt = np.add.reduceat(P.astype(np.int64), g.starts, axis=0)
    with np.errstate(all="ignore"):
        zero = mag == 0
        ok = zero | (cnt * mag < np.abs(wide) * _WIDE_SLACK)
    if not ok.all():
        return None
    return np.where(zero, 0.0, wide.astype(np.float64)), cnt


def _sum(vec: VectorSteps, g: Groups) -> np.ndarray:
    return _finish(*sum_state(vec, g))


def sum_state(vec: VectorSteps, g: Groups) -> tuple[np.ndarray, np.ndarray]:
    """Per group and step the compensated sum before it is finished: (sum, compensation), what
    ``_sum`` returns as ``sum + compensation``; partial sums of disjoint series merge from it."""
    t = vec.num_steps
    fast = _wide_group_sums(vec, g)
    if fast is not None:
        return fast[0], np.zeros_like(fast[0])
    s = np.zeros((g.n, t))
    c = np.zeros((g.n, t))
    n = np.zeros((g.n, t), np.int64)
    V, P = vec.values, vec.present
    for gi, rows in g.ranks():
        x, p = V[rows], P[rows]
        first = p & (n[gi] == 0)
        ts, tc = _kahan_inc(x, s[gi], c[gi])
        s[gi] = np.where(first, x, np.where(p, ts, s[gi]))
        c[gi] = np.where(first, 0.0, np.where(p, tc, c[gi]))
        n[gi] += p
    for gi in g.large():
        rows = g.rows_of(gi)
        ss, cc = tree_sum(np.where(P[rows], V[rows], 0.0))
        s[gi], c[gi] = ss, cc
    return s, c


def _avg(vec: VectorSteps, g: Groups) -> np.ndarray:
    t = vec.num_steps
    fast = _wide_group_sums(vec, g)
    if fast is not None:
        with np.errstate(all="ignore"):
            return fast[0] / np.maximum(fast[1], 1)
    V, P = vec.values, vec.present
    s = np.zeros((g.n, t))
    c = np.zeros((g.n, t))
    mean = np.zeros((g.n, t))
    n = np.zeros((g.n, t))
    incr = np.zeros((g.n, t), bool)
    for gi, rows in g.ranks():
        x, p = V[rows], P[rows]
        sg, cg, mg, ng, ig = s[gi], c[gi], mean[gi], n[gi], incr[gi]
        first = p & (ng == 0)
        rest = p & ~first
        n1 = ng + p
        # direct mean as long as the running sum does not overflow
        ns, nc = _kahan_inc(x, sg, cg)
        overflow = rest & ~ig & np.isinf(ns)
        direct_ok = rest & ~ig & ~np.isinf(ns)
        sg2 = np.where(direct_ok, ns, sg)
        cg2 = np.where(direct_ok, nc, cg)
        # switch to incremental mean where the sum would overflow
        with np.errstate(all="ignore"):
            mg_sw = np.where(overflow, sg / np.maximum(n1 - 1, 1), mg)
            cg_sw = np.where(overflow, cg / np.maximum(n1 - 1, 1), cg2)
        ig2 = ig | overflow
        use_incr = rest & ig2
        q = (n1 - 1) / np.maximum(n1, 1)
        im, ic = _kahan_inc(x / np.maximum(n1, 1), q * mg_sw, q * cg_sw)
        mg3 = np.where(use_incr, im, mg_sw)
        cg3 = np.where(use_incr, ic, cg_sw)
        s[gi] = np.where(first, x, sg2)
        c[gi] = np.where(first, 0.0, cg3)
        mean[gi] = np.where(first, x, mg3)
        n[gi] = n1
        incr[gi] = np.where(first, False, ig2)
    with np.errstate(all="ignore"):
        out = np.where(incr, mean + c, s / np.maximum(n, 1) + c / np.maximum(n, 1))
    for gi in g.large():
        rows = g.rows_of(gi)
        x = np.where(P[rows], V[rows], 0.0)
        cnt = P[rows].sum(axis=0).astype(np.float64)
        with np.errstate(all="ignore"):
            out[gi] = wide_mean(x, cnt)
    return out


def _variance(vec: VectorSteps, g: Groups) -> np.ndarray:
    """Population variance with Prometheus's Welford recurrence."""
    t = vec.num_steps
    V, P = vec.values, vec.present
    mean = np.zeros((g.n, t))
    m2 = np.zeros((g.n, t))
    n = np.zeros((g.n, t))
    for gi, rows in g.ranks():
        x, p = V[rows], P[rows]
        ng = n[gi]
        first = p & (ng == 0)
        n1 = ng + p
        with np.errstate(all="ignore"):
            delta = x - mean[gi]
            nm = mean[gi] + delta / np.maximum(n1, 1)
            nv = m2[gi] + delta * (x - nm)
        mean[gi] = np.where(first, x, np.where(p, nm, mean[gi]))
        m2[gi] = np.where(first, np.where(np.isfinite(x), 0.0, np.nan), np.where(p, nv, m2[gi]))
        n[gi] = n1
    with np.errstate(all="ignore"):
        out = m2 / np.maximum(n, 1)
    for gi in g.large():
        rows = g.rows_of(gi)
        p = P[rows]
        x = np.where(p, V[rows], 0.0)
        cnt = np.maximum(p.sum(axis=0), 1).astype(np.float64)
        with np.errstate(all="ignore"):
            mu = wide_mean(x, cnt)
            d = np.where(p, V[rows] - mu[None, :], 0.0)
            var = wide_mean(d * d, cnt)
        bad = (~np.isfinite(V[rows]) & p).any(axis=0)
        out[gi] = np.where(bad, np.nan, var)
    return out


_PER_GROUP_SORT_MAX = 256


def _seg_gid(g: Groups) -> np.ndarray:
    """Group id of every position in the group-sorted row layout."""
    return np.repeat(np.arange(g.n, dtype=np.int64), g.sizes)


def quantile_sorted(V: np.ndarray, P: np.ndarray, g: Groups, q: np.ndarray) -> np.ndarray:
    """Prometheus's quantile (NaN sorts first; linear interpolation between closest ranks) per
    group and step. q: (T,)."""
    s_, t = V.shape
    # sort key: absent rows last (+inf); NaNs sort as -inf and are put back as NaN afterwards
    isn = np.isnan(V) & P
    key = np.where(P, np.where(isn, -np.inf, V), np.inf)
    if g.n <= _PER_GROUP_SORT_MAX:
        sv = np.empty_like(key)
        for gi in range(g.n):  # per group: contiguous sorts along the series axis
            rows = g.rows_of(gi)
            a = int(g.starts[gi])
            sv[a:a + len(rows)] = np.sort(np.ascontiguousarray(key[rows].T), axis=1).T
    else:
        kt = np.ascontiguousarray(key.T)
        gb = np.broadcast_to(g.gid[None, :], kt.shape)
        o = np.lexsort((kt, gb), axis=-1)
        sv = np.take_along_axis(kt, o, axis=1).T
    cnt = g.reduce(np.add, P.astype(np.int64)).astype(np.float64)  # (G, T)
    nan_cnt = g.reduce(np.add, isn.astype(np.int64))
    seg = _seg_gid(g)
    pos = (np.arange(s_) - g.starts[seg])[:, None]
    sv = np.where(pos < nan_cnt[seg], np.nan, sv)
    with np.errstate(all="ignore"):
        rank = q[None, :] * (cnt - 1)
        lower = np.maximum(0, np.floor(rank))
        upper = np.minimum(cnt - 1, lower + 1)
        weight = rank - np.floor(rank)
    lower_i = np.clip(np.nan_to_num(lower), 0, max(s_ - 1, 0)).astype(np.int64)
    upper_i = np.clip(np.nan_to_num(upper), 0, max(s_ - 1, 0)).astype(np.int64)
    base = g.starts[:, None]
    cols = np.arange(t)[None, :]
    lo_v = sv[np.minimum(base + lower_i, s_ - 1), cols]
    hi_v = sv[np.minimum(base + upper_i, s_ - 1), cols]
    with np.errstate(all="ignore"):
        res = lo_v * (1 - weight) + hi_v * weight
    qq = np.broadcast_to(q[None, :], res.shape)
    res = np.where(np.isnan(qq), np.nan, np.where(qq < 0, -np.inf, np.where(qq > 1, np.inf, res)))
    return res


_U_NAN = np.uint64(0xFFFFFFFFFFFFFFFE)
_U_ABSENT = np.uint64(0xFFFFFFFFFFFFFFFF)
_SIGN = np.uint64(1 << 63)


def _ordered_key(V: np.ndarray, P: np.ndarray, desc: bool) -> np.ndarray:
    """uint64 keys whose integer order is the float order (ascending, or descending when
    ``desc``), with NaN after every number and absent cells last."""
    x = (-V if desc else V) + 0.0  # +0.0 folds -0.0 into 0.0
    bits = np.ascontiguousarray(x).view(np.uint64)
    neg = (bits & _SIGN) != 0
    u = np.where(neg, ~bits, bits | _SIGN)
    u = np.where(np.isnan(V), _U_NAN, u)
    return np.where(P, u, _U_ABSENT)


def _ranks_within_groups(key: np.ndarray, g: Groups) -> np.ndarray:
    """Stable rank (S, T) of every (row, step) inside its group by ``key``."""
    s_, t = key.shape
    if g.n <= _PER_GROUP_SORT_MAX:
        rank = np.empty((t, s_), dtype=np.int64)
        for gi in range(g.n):
            rows = g.rows_of(gi)
            kb = np.ascontiguousarray(key[rows].T)  # (T, n)
            o = np.argsort(kb, axis=1, kind="stable")
            rb = np.empty_like(o)
            np.put_along_axis(rb, o, np.arange(len(rows))[None, :], axis=1)
            rank[:, rows] = rb
        return rank.T
    if int(g.sizes.max()) <= 32:
        # many small groups: count, for every row, the group members ordered before it
        rank = np.zeros((s_, t), dtype=np.int64)
        rows = np.arange(s_)
        gs = g.sizes[g.gid]
        for r in range(int(g.sizes.max())):
            ok = gs > r
            other = np.where(ok, g.order[np.minimum(g.starts[g.gid] + r, s_ - 1)], rows)
            ko = key[other]
            before = (ko < key) | ((ko == key) & (other < rows)[:, None])
            rank += before & ok[:, None]
        return rank
    kt = np.ascontiguousarray(key.T)
    gb = np.broadcast_to(g.gid[None, :], kt.shape)
    o = np.lexsort((kt, gb), axis=-1)  # stable: ties keep row order
    posr = np.arange(s_)[None, :] - g.starts[g.gid[o]]
    rank = np.empty((t, s_), dtype=np.int64)
    np.put_along_axis(rank, o, posr, axis=1)
    return rank.T


def _select_smallest(key: np.ndarray, g: Groups, k: np.ndarray) -> np.ndarray:
    """bool (S, T): per group and step, the k smallest keys (ties by row order)."""
    s_, t = key.shape
    kc = int(k.max())
    if g.n <= _PER_GROUP_SORT_MAX and (k == kc).all() and kc >= 1:
        sel = np.zeros((s_, t), dtype=bool)
        for gi in range(g.n):  # partition instead of a full sort: O(n) per step
            rows = g.rows_of(gi)
            n = len(rows)
            if kc >= n:
                sel[rows] = True
                continue
            kb = np.ascontiguousarray(key[rows].T)  # (T, n)
            kth = np.partition(kb, kc - 1, axis=1)[:, kc - 1:kc]
            less = kb < kth
            eq = kb == kth
            need = kc - less.sum(axis=1, keepdims=True)
            take = less | (eq & (np.cumsum(eq, axis=1) <= need))
            sel[rows] = take.T
        return sel
    return _ranks_within_groups(key, g) < k[None, :]


_HEAP_SIM_BUDGET = 2_000_000  # row visits of exact heap replay for tie-straddled cells


def heap_tie_cells(P: np.ndarray, key: np.ndarray, g: Groups, k: np.ndarray, sel: np.ndarray,
                   sizes: np.ndarray | None = None) -> list[tuple[int, int]]:
    """The (group, step) cells where equal values straddle the k-th place and the heap replay fits
    its work budget (``sizes``: the groups' series counts, default ``g.sizes``); [] when none."""
    sizes = g.sizes if sizes is None else sizes
    if g.n == 0 or not sel.any() or int(sizes.max()) <= int(k.min()):
        return []  # every present series of every group is kept: nothing to break
    thr = g.reduce(np.maximum, np.where(sel, key, np.uint64(0)))  # (G, T) worst selected key
    tie = P & ~sel & (key == thr[g.gid])
    if not tie.any():
        return []
    cells = sorted({(int(gi), int(c)) for gi, c in zip(g.gid[np.nonzero(tie)[0]].tolist(), np.nonzero(tie)[1].tolist())})
    if sum(int(sizes[gi]) for gi, _ in cells) > _HEAP_SIM_BUDGET:
        return []
    return cells


def _heap_ties(op: str, V: np.ndarray, P: np.ndarray, key: np.ndarray, g: Groups, k: np.ndarray, sel: np.ndarray) -> None:
    """Where equal values straddle the k-th place, Prometheus's choice follows its heap
    (container/heap with replace-the-top-only-if-strictly-better), not input order. Replay that
    heap exactly for just those (group, step) cells (rare: exact ties at the boundary), within a
    work budget; elsewhere the vectorized selection is already identical."""
    for gi, c in heap_tie_cells(P, key, g, k, sel):  # per tie-straddled (group, step)
        rows = [int(r) for r in np.sort(g.rows_of(gi)) if P[r, c]]
        kept = _go_heap_select(op, [(float(V[r, c]), r) for r in rows], int(k[c]))
        sel[rows, c] = False
        sel[kept, c] = True


def _go_heap_select(op: str, items: list[tuple[float, int]], k: int) -> list[int]:
    """Port of Prometheus's topk/bottomk selection over Go's container/heap."""
    if k < 1:
        return []
    nan = math.isnan

    def less(a: tuple[float, int], b: tuple[float, int]) -> bool:
        if nan(a[0]):
            return True
        return a[0] < b[0] if op == "topk" else a[0] > b[0]

    h: list[tuple[float, int]] = []

    def up(j: int) -> None:
        while j > 0:
            i = (j - 1) // 2
            if not less(h[j], h[i]):
                break
            h[i], h[j] = h[j], h[i]
            j = i

    def down(i0: int) -> bool:
        i, n = i0, len(h)
        while True:
            j1 = 2 * i + 1
            if j1 >= n:
                break
            j = j1
            if j1 + 1 < n and less(h[j1 + 1], h[j1]):
                j = j1 + 1
            if not less(h[j], h[i]):
                break
            h[i], h[j] = h[j], h[i]
            i = j
        return i > i0

    for it in items:
        if len(h) < k:
            h.append(it)
            up(len(h) - 1)
            continue
        top = h[0][0]
        better = (top < it[0]) if op == "topk" else (top > it[0])
        if better or (nan(top) and not nan(it[0])):
            h[0] = it
            if k > 1 and not down(0):
                up(0)
    return [r for _, r in h]


def _first_step_order(key: np.ndarray, g: Groups) -> np.ndarray:
    """Rows in (group, key, row) order at the first step (instant-query output order)."""
    return np.lexsort((np.arange(key.shape[0]), key[:, 0], g.gid))


def _output(vec: VectorSteps, g: Groups, values: np.ndarray, present: np.ndarray | None = None,
            plane: np.ndarray | None = None) -> VectorSteps:
    """One row per group; ``present``/``plane`` override the float presence and add a histogram
    plane (sum/avg over native histograms)."""
    if present is None:
        present = g.reduce(np.logical_or, vec.present)
    dp = None
    if vec.drop_name is not None and vec.drop_name.any() and g.n:
        inp = vec.present if plane is None else vec.any_present()
        dp = g.reduce(np.logical_or, inp & vec.drop_name[:, None])
    return group_rows(list(g.labels), values, present, dp, plane)


def group_rows(labels: list[Labels], values: np.ndarray, present: np.ndarray, dp: np.ndarray | None,
               plane: np.ndarray | None = None) -> VectorSteps:
    """An aggregation's output from its groups' (G, T) values and presence: ``dp`` (G, T) says where
    an input sample marked for delayed ``__name__`` removal took part (None: none did); a group
    keeps the mark of its last step with a value; groups without any value are left out."""
    alive = present if plane is None else (present | np.not_equal(plane, None))
    drop = None
    if dp is not None and len(labels):
        t = present.shape[1]
        last = t - 1 - np.argmax(alive[:, ::-1], axis=1)
        drop = dp[np.arange(len(labels)), last]
    out = VectorSteps(labels, np.where(present, values, 0.0), present, drop, None, plane)  # type: ignore[arg-type]
    keep = alive.any(axis=1)
    if not keep.all():
        idx = np.flatnonzero(keep)
        out = VectorSteps([out.labels[i] for i in idx.tolist()], out.values[idx], present[idx], None if drop is None else drop[idx],
                          None, None if plane is None else plane[idx])
    return out


# Aggregations that ignore native-histogram samples (with an info annotation), as Prometheus.
_IGNORE_HIST = {"min", "max", "quantile", "stddev", "stdvar", "topk", "bottomk"}


def _aggregate_histograms(op: str, vec: VectorSteps, names: list[str], without: bool, param: Any, ann: Annotations,
                          pos: str, expr_pos: str, agg_pos: str, budget: Any = None) -> VectorSteps:
    """``vec`` carries native-histogram samples (never on the float-only storage path)."""
    if op in _IGNORE_HIST:
        # topk/bottomk name the whole aggregation's position, the others their argument's
        ann.info(ignored_in_aggregation(op, agg_pos if op in ("topk", "bottomk") else expr_pos))
        return aggregate(op, strip(vec), names, without, param, ann, pos)  # type: ignore[arg-type]
    if op in ("count", "group"):
        return aggregate(op, union_presence(vec), names, without, param, ann, pos)
    if op == "count_values":
        return count_values(vec, names, without, param, budget)
    if op in ("limitk", "limit_ratio") and len(set(vec.labels)) == len(vec.labels):
        # histograms are selected like floats; the chosen rows keep their histogram samples
        out = select_k(op, union_presence(vec), names, without, param, ann, pos)
        hm = vec.hist_mask()
        assert hm is not None and vec.hist is not None
        row = {l: i for i, l in enumerate(vec.labels)}
        idx = np.array([row[l] for l in out.labels], dtype=np.int64)
        hsel = out.present & hm[idx] if len(idx) else np.zeros(out.present.shape, dtype=bool)
        plane = np.where(hsel, vec.hist[idx], None) if len(idx) else None
        return VectorSteps(out.labels, out.values, out.present & ~hsel, out.drop_name, None, plane)
    if op in ("sum", "avg"):
        fvec = strip(vec)
        assert isinstance(fvec, VectorSteps)
        g = Groups(vec.labels, names, without)
        with np.errstate(all="ignore"):
            vals = _sum(fvec, g) if op == "sum" else _avg(fvec, g)
        fpres = g.reduce(np.logical_or, fvec.present)
        plane, mixed = aggregate_histograms(op, vec, g.gid, g.n, fpres, ann, expr_pos)
        return _output(vec, g, vals, fpres & ~mixed, plane)
    raise unsupported(f"the {op} aggregation")


def aggregate(op: str, vec: VectorSteps, names: list[str], without: bool, param: Any, ann: Annotations, pos: str = "",
              expr_pos: str = "", agg_pos: str = "", budget: Any = None) -> VectorSteps:
    """``pos``: position suffix of the parameter; ``expr_pos`` / ``agg_pos``: of the aggregated
    expression / the aggregation (for annotations about native histograms). ``budget``: the query's
    QueryBudget, for aggregations whose output can outgrow their input (count_values)."""
    t = vec.num_steps
    if vec.hist is not None:
        if has_hist(vec):
            return _aggregate_histograms(op, vec, names, without, param, ann, pos, expr_pos, agg_pos, budget)
        vec = strip(vec)  # type: ignore[assignment]
    if op == "count_values":
        return count_values(vec, names, without, param, budget)
    if op in ("topk", "bottomk", "limitk", "limit_ratio"):
        return select_k(op, vec, names, without, param, ann, pos)
    if op == "quantile":
        q = param.values if isinstance(param, Scalar) else np.full(t, float("nan"))
        if np.isnan(q).any():
            ann.warn(f"PromQL warning: quantile value should be between 0 and 1, got NaN{pos}")
        finite = q[~np.isnan(q)]
        if finite.size and finite.max() > 1:
            ann.warn(f"PromQL warning: quantile value should be between 0 and 1, got {format_float_g(float(finite.max()))}{pos}")
        if finite.size and finite.min() < 0:
            ann.warn(f"PromQL warning: quantile value should be between 0 and 1, got {format_float_g(float(finite.min()))}{pos}")
    if vec.num_series == 0:
        return VectorSteps.empty(t)
    g = Groups(vec.labels, names, without)
    with np.errstate(all="ignore"):
        if op == "sum":
            vals = _sum(vec, g)
        elif op == "avg":
            vals = _avg(vec, g)
        elif op == "count":
            vals = g.reduce(np.add, vec.present.astype(np.int64)).astype(np.float64)
        elif op == "group":
            vals = np.ones((g.n, t))
        elif op == "max":
            vals = g.reduce(np.fmax, np.where(vec.present, vec.values, np.nan))
        elif op == "min":
            vals = g.reduce(np.fmin, np.where(vec.present, vec.values, np.nan))
        elif op == "stdvar":
            vals = _variance(vec, g)
        elif op == "stddev":
            vals = np.sqrt(_variance(vec, g))
        elif op == "quantile":
            vals = quantile_sorted(vec.values, vec.present, g, param.values)
        else:
            raise ExecutionError(f"unknown aggregation {op!r}")
    return _output(vec, g, vals)


_SAMPLED_STEPS = 64


def _count_values_lower_bound(vec: VectorSteps, t: int, budget: Any) -> None:
    """Refuse cheaply what would be refused after the full grouping: the distinct float values among
    a few evenly spread steps are a lower bound of the output series (each series of a value-labelled
    output has one value), and every output series is a dense row of all ``t`` steps."""
    if t <= 1:
        return
    cols = np.unique(np.linspace(0, t - 1, min(t, _SAMPLED_STEPS)).astype(np.int64))
    sub = vec.present[:, cols]
    if vec.hist is not None:
        hm = vec.hist_mask()
        if hm is not None:
            sub = sub & ~hm[:, cols]
    r, c = np.nonzero(sub)
    if len(r):
        budget.reserve_cells(len(np.unique(vec.values[r, cols[c]])), t)


def count_values(vec: VectorSteps, names: list[str], without: bool, param: Any, budget: Any = None) -> VectorSteps:
    """One output series per (group, distinct value); the value becomes label ``param``.

    Per-series Python for the grouping key, per distinct value for its Go formatting, per
    output series for its labels; the counting itself is a bincount over (output, step).
    The output can have up to one series per input sample, each a dense row of every step: with
    ``budget`` (QueryBudget) its size is checked before any of it is built."""
    t = vec.num_steps
    if not isinstance(param, StringValue):
        raise ExecutionError("count_values needs a string parameter")
    label = param.value
    if not label:
        raise ExecutionError('invalid label name ""')
    if budget is not None and (not without or label not in names):
        _count_values_lower_bound(vec, t, budget)
    rows, cols = np.nonzero(vec.present)
    vals = vec.values[rows, cols]
    uv, vid = np.unique(vals, return_inverse=True)
    value_str: list[str | None] = [None] * len(uv)
    hm = vec.hist_mask()
    if hm is not None and hm.any():  # native histograms count under their String() form
        hr, hc = np.nonzero(hm)
        hs = [histogram_string(h) for h in vec.hist[hr, hc]]  # type: ignore[index]
        uh, hid = np.unique(np.array(hs, dtype=object), return_inverse=True)
        rows, cols = np.concatenate([rows, hr]), np.concatenate([cols, hc])
        vid = np.concatenate([vid, len(uv) + hid])
        value_str += list(uh)
    if len(rows) == 0:
        return VectorSteps.empty(t)
    nv = len(value_str)
    # the series' own `label` is overwritten by the value, so it never takes part in the key
    if without:
        base = [grouping_labels(tuple(p for p in l if p[0] != label), names, True) for l in vec.labels]
        include_value = label not in names
    else:
        keep = [n for n in names if n != label]
        base = [grouping_labels(l, keep, False) for l in vec.labels]
        include_value = True
    bid, bases = dense_ids(base)
    code = bid[rows] * (nv + 1) + (vid if include_value else nv)
    uc, oid = np.unique(code, return_inverse=True)
    if budget is not None:
        budget.reserve_cells(len(uc), t)  # the output rows, before their labels and counts exist
    strs: dict[int, str] = {}
    out_labels: list[Labels] = []
    for c in uc.tolist():  # per output series
        b_, v_ = divmod(c, nv + 1)
        lb = list(bases[b_])  # type: ignore[arg-type]
        if v_ < nv:
            if v_ not in strs:
                strs[v_] = value_str[v_] or format_float_f(float(uv[v_]))
            lb.append((label, strs[v_]))
        out_labels.append(tuple(sorted(lb)))
    counts = np.bincount(oid * t + cols, minlength=len(uc) * t).reshape(len(uc), t).astype(np.float64)
    present = counts > 0
    out = VectorSteps(out_labels, counts, present)
    if len(set(out_labels)) != len(out_labels):
        out = merge_same_labels(out)
    return out


def select_k(op: str, vec: VectorSteps, names: list[str], without: bool, param: Any, ann: Annotations, pos: str,
             heap_ties: bool = True) -> VectorSteps:
    """``heap_ties=False``: equal values at the k-th place are broken by series order, no heap
    replay (a merge of per-partition candidates that has checked no replay is due)."""
    t = vec.num_steps
    pv = param.values if isinstance(param, Scalar) else np.full(t, float("nan"))
    if op == "limit_ratio":
        if np.all(pv == 0):
            return VectorSteps.empty(t)
        if np.isnan(pv).any():
            raise ExecutionError("Ratio value is NaN")
        if pv.max() > 1.0:
            ann.warn(f"PromQL warning: ratio value should be between -1 and 1, got {format_float_g(float(pv.max()))}, capping to 1{pos}")
        if pv.min() < -1.0:
            ann.warn(f"PromQL warning: ratio value should be between -1 and 1, got {format_float_g(float(pv.min()))}, capping to -1{pos}")
    else:
        if np.isnan(pv).any():
            raise ExecutionError("Parameter value is NaN")
        if pv.max() < 1:
            return VectorSteps.empty(t)
        if pv.min() <= -_MAX_INT64:
            raise ExecutionError(f"Scalar value {format_float_g(float(pv.min()))} underflows int64")
        if pv.max() >= _MAX_INT64:
            raise ExecutionError(f"Scalar value {format_float_g(float(pv.max()))} overflows int64")
    if vec.num_series == 0:
        return VectorSteps.empty(t)
    s_ = vec.num_series
    g = Groups(vec.labels, names, without)
    V, P = vec.values, vec.present
    if op == "limit_ratio":
        r = np.clip(pv, -1.0, 1.0)
        offs = np.array([ratio_offset(l) for l in vec.labels])[:, None]
        sel = P & (((r[None, :] >= 0) & (offs < r[None, :])) | ((r[None, :] < 0) & (offs >= 1.0 + r[None, :])))
        order_col0 = np.arange(s_)
    else:
        k = np.minimum(np.trunc(pv), s_).astype(np.int64)
        if op in ("topk", "bottomk"):
            key = _ordered_key(V, P, desc=(op == "topk"))
        else:  # limitk: the first k present series of each group, in input order
            key = np.where(P, np.uint64(0), _U_ABSENT)
        sel = P & _select_smallest(key, g, k)
        if op in ("topk", "bottomk") and heap_ties:
            _heap_ties(op, V, P, key, g, k, sel)
        order_col0 = _first_step_order(key, g) if t == 1 else np.arange(s_)
    if t == 1:
        idx = np.array([i for i in order_col0.tolist() if sel[i, 0]], dtype=np.int64)
    else:
        idx = np.flatnonzero(sel.any(axis=1))
    return VectorSteps(
        [vec.labels[i] for i in idx.tolist()],
        V[idx],
        sel[idx],
        None if vec.drop_name is None else vec.drop_name[idx],
    )


# --- limit_ratio's sampling offset: Prometheus uses labels.Hash() (xxHash64 of the label bytes) ---
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261
_M64 = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, inp: int) -> int:
    acc = (acc + inp * _P2) & _M64
    acc = _rotl(acc, 31)
    return (acc * _P1) & _M64


def _merge(acc: int, val: int) -> int:
    val = _round(0, val)
    acc ^= val
    return (acc * _P1 + _P4) & _M64


def xxhash64(data: bytes, seed: int = 0) -> int:
    """xxHash64 (no library for it is among the pinned dependencies; per-series use only)."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M64
        v2 = (seed + _P2) & _M64
        v3 = seed & _M64
        v4 = (seed - _P1) & _M64
        while i + 32 <= n:
            v1 = _round(v1, int.from_bytes(data[i:i + 8], "little"))
            v2 = _round(v2, int.from_bytes(data[i + 8:i + 16], "little"))
            v3 = _round(v3, int.from_bytes(data[i + 16:i + 24], "little"))
            v4 = _round(v4, int.from_bytes(data[i + 24:i + 32], "little"))
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M64
        h = _merge(h, v1)
        h = _merge(h, v2)
        h = _merge(h, v3)
        h = _merge(h, v4)
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        k1 = _round(0, int.from_bytes(data[i:i + 8], "little"))
        h ^= k1
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    h ^= h >> 32
    return h


def _size_prefix(n: int) -> bytes:
    return bytes([n]) if n < 255 else bytes([255, n & 0xFF, (n >> 8) & 0xFF, (n >> 16) & 0xFF])


def labels_hash(labels: Labels) -> int:
    """Prometheus 3's default (stringlabels) ``Labels.Hash()``: xxHash64 of the packed label data
    (each name and value prefixed by its length)."""
    buf = bytearray()
    for n, v in labels:
        nb, vb = n.encode(), v.encode()
        buf += _size_prefix(len(nb)) + nb + _size_prefix(len(vb)) + vb
    return xxhash64(bytes(buf))


def ratio_offset(labels: Labels) -> float:
    return float(labels_hash(labels)) / float(_M64)


__all__ = ["aggregate", "Groups", "group_rows", "heap_tie_cells", "tree_sum", "sum_state", "METRIC_NAME"]
