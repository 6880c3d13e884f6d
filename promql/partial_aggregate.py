"""Partial aggregation states of disjoint series sets, and their merge.

An aggregation over series split into disjoint sets (a cluster's partitions) is computed as one
``Partial`` per set and merged into what ``aggregate`` gives over all of them:

* sum: per group and step the compensated sum and its compensation (``sum_state``); merged by
  Kahan-Neumaier over the parts' sums, compensations added;
* count / group: counts / presence, added / or-ed;
* min / max: the group's extreme (NaN only where every value is NaN), merged with fmin / fmax;
* avg: sum state, count, and the sum state of the values scaled by 2**-64; merged as sum / count,
  or where the sum is not finite (overflow, infinities) from the scaled sums;
* topk / bottomk: the part's candidate series: per step every series ranked within the top k of
  its group, ties with the k-th included; the merge runs topk / bottomk over the candidates. Where
  a single evaluation would replay Prometheus's heap to break ties at the k-th place (small groups),
  the merge raises ``NotMergeable`` instead, unless every part is *complete* (``COMPLETE_CELLS``:
  a part small enough sends every present series, not only its candidates): the merge then holds
  all of each group's series in a single evaluation's order and replays the heap itself. Gauges of
  small integers (queue lengths: many series at 0) tie at the k-th place at nearly every step.

Groups keep the labels of their first series, so the merge orders them as a single evaluation
would (first appearance, series sorted by labels), and the input's delayed ``__name__`` removal
marks (``dp``), so the merged output drops names where a single evaluation would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from promql.eval_aggregate import (
    Groups,
    _kahan_inc,
    _ordered_key,
    _select_smallest,
    group_rows,
    heap_tie_cells,
    select_k,
    sum_state,
)
from promql.types import Annotations, Scalar, VectorSteps
from storage.labels import Labels

GROUP_OPS = frozenset({"sum", "count", "min", "max", "avg", "group"})
SELECT_OPS = frozenset({"topk", "bottomk"})
# a topk/bottomk part of at most this many (series x step) cells sends every present series (8 bytes
# and a flag each), so ties at the k-th place merge exactly instead of failing the pushdown
COMPLETE_CELLS = 250_000


@dataclass
class Partial:
    """One set's state. For the group operators ``labels`` are the groups' output labels, ``first``
    the labels of each group's first series, ``arrays`` (G, T) per-op state and ``dp`` (G, T) the
    delayed-name-removal marks (None: none). For topk/bottomk ``labels`` are the candidate series,
    ``arrays["v"]`` their values, ``present`` where each is a candidate, ``drop`` (S,) their marks,
    and ``groups`` / ``first`` every group of the set with its first series."""

    op: str
    labels: list[Labels]
    present: np.ndarray
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    first: list[Labels] = field(default_factory=list)
    dp: np.ndarray | None = None
    drop: np.ndarray | None = None
    groups: list[Labels] = field(default_factory=list)  # topk/bottomk: every group, ``first`` aligned
    sizes: np.ndarray | None = None  # topk/bottomk: each group's series count
    complete: bool = False  # topk/bottomk: every present series of the set, not only the candidates

    @property
    def num_steps(self) -> int:
        return int(self.present.shape[1])


def partial(op: str, vec: VectorSteps, names: list[str], without: bool, param: Any = None) -> Partial:
    """The state of ``op`` over ``vec`` (float samples only) to merge with other sets' states."""
    t = vec.num_steps
    if op in SELECT_OPS:
        return _candidates(op, vec, names, without, param, complete=vec.num_series * t <= COMPLETE_CELLS)
    if op not in GROUP_OPS:
        raise ValueError(f"{op} has no partial state")
    if vec.num_series == 0:
        return Partial(op, [], np.zeros((0, t), bool))
    g = Groups(vec.labels, names, without)
    first = [vec.labels[int(g.order[int(a)])] for a in g.starts.tolist()]
    present = g.reduce(np.logical_or, vec.present)
    arrays: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        if op in ("sum", "avg"):
            arrays["s"], arrays["c"] = sum_state(vec, g)
        if op in ("count", "avg"):
            arrays["n"] = g.reduce(np.add, vec.present.astype(np.int64)).astype(np.float64)
        if op == "avg":
            arrays["s2"], arrays["c2"] = _scaled_sum_state(vec, g, arrays["s"], arrays["c"])
        elif op == "max":
            arrays["v"] = g.reduce(np.fmax, np.where(vec.present, vec.values, np.nan))
        elif op == "min":
            arrays["v"] = g.reduce(np.fmin, np.where(vec.present, vec.values, np.nan))
    dp = None
    if vec.drop_name is not None and vec.drop_name.any():
        dp = g.reduce(np.logical_or, vec.present & vec.drop_name[:, None])
    return Partial(op, list(g.labels), present, arrays, first, dp)


_SCALE = 2.0 ** -64  # exact (a power of two): sums of float64 values this much smaller never overflow


def _scaled_sum_state(vec: VectorSteps, g: Groups, s: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum state of every value times 2**-64: where the plain sum is finite, that sum scaled
    (exactly); where it overflowed or met an infinity, summed again scaled. A merged average whose
    plain sum overflows is taken from these (a single evaluation switches to an incremental mean
    there, which the scaled sum matches within rounding: ``avg`` of +-9.99e307 values is exact)."""
    s2, c2 = s * _SCALE, c * _SCALE
    bad = ~np.isfinite(s)
    if bad.any():
        scaled = VectorSteps(vec.labels, vec.values * _SCALE, vec.present)
        ss, cc = sum_state(scaled, g)
        s2, c2 = np.where(bad, ss, s2), np.where(bad, cc, c2)
    return s2, c2


def _candidates(op: str, vec: VectorSteps, names: list[str], without: bool, param: Any,
                complete: bool = False) -> Partial:
    t = vec.num_steps
    pv = param.values if isinstance(param, Scalar) else np.full(t, np.nan)
    empty = Partial(op, [], np.zeros((0, t), bool), {"v": np.zeros((0, t))}, drop=np.zeros(0, bool),
                    complete=complete)
    if vec.num_series == 0 or np.isnan(pv).any() or pv.max() < 1:
        return empty  # the merge answers (or refuses) these from the parameter alone
    g = Groups(vec.labels, names, without)
    V, P = vec.values, vec.present
    if complete:
        cand = P
    else:
        k = np.minimum(np.clip(np.trunc(pv), 0, None), vec.num_series).astype(np.int64)
        key = _ordered_key(V, P, desc=(op == "topk"))
        sel = P & _select_smallest(key, g, k)
        worst = g.reduce(np.maximum, np.where(sel, key, np.uint64(0)))  # (G, T) k-th key (0: none)
        cand = sel | (P & (key == worst[g.gid]) & (worst[g.gid] > 0))  # ties with the k-th come too
    rows = np.flatnonzero(cand.any(axis=1))
    drop = np.zeros(len(rows), bool) if vec.drop_name is None else vec.drop_name[rows]
    # every group's first series, candidate or not: an instant output orders groups by it
    first = [vec.labels[int(i)] for i in g.order[g.starts].tolist()]
    return Partial(op, [vec.labels[i] for i in rows.tolist()], cand[rows], {"v": V[rows]}, first, drop=drop,
                   groups=list(g.labels), sizes=g.sizes.copy(), complete=complete)


def _group_index(parts: Sequence[Partial]) -> tuple[list[Labels], list[np.ndarray]]:
    """Output groups of all parts in first-appearance order, and each part's group -> output row."""
    first: dict[Labels, Labels] = {}
    for p in parts:
        for lbl, f in zip(p.labels, p.first):  # per group
            cur = first.get(lbl)
            if cur is None or f < cur:
                first[lbl] = f
    labels = sorted(first, key=first.__getitem__)
    row = {lbl: i for i, lbl in enumerate(labels)}
    return labels, [np.array([row[lbl] for lbl in p.labels], np.int64) for p in parts]


def merge(op: str, parts: Sequence[Partial], t: int, names: list[str], without: bool, param: Any = None,
          ann: Annotations | None = None, pos: str = "") -> VectorSteps:
    """What ``aggregate(op, ...)`` gives over the union of the parts' series."""
    if op in SELECT_OPS:
        return _merge_candidates(op, parts, t, names, without, param, ann if ann is not None else Annotations(), pos)
    parts = [p for p in parts if p.labels]
    if not parts:
        return VectorSteps.empty(t)
    labels, where = _group_index(parts)
    g = len(labels)
    present = np.zeros((g, t), bool)
    for p, w in zip(parts, where):
        present[w] |= p.present
    dp = None
    if any(p.dp is not None for p in parts):
        dp = np.zeros((g, t), bool)
        for p, w in zip(parts, where):
            if p.dp is not None:
                dp[w] |= p.dp
    with np.errstate(all="ignore"):
        values = _merge_values(op, parts, where, g, t)
    return group_rows(labels, values, present, dp)


def _scatter(parts: Sequence[Partial], where: list[np.ndarray], name: str, g: int, t: int, fill: float) -> list[np.ndarray]:
    out = []
    for p, w in zip(parts, where):
        a = np.full((g, t), fill)
        a[w] = p.arrays[name]
        out.append(a)
    return out


def _neumaier(xs: list[np.ndarray], present: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    s = np.zeros_like(xs[0])
    c = np.zeros_like(xs[0])
    seen = np.zeros(xs[0].shape, bool)
    for x, p in zip(xs, present):
        ns, nc = _kahan_inc(x, s, c)
        first = p & ~seen
        s = np.where(first, x, np.where(p, ns, s))
        c = np.where(first, 0.0, np.where(p, nc, c))
        seen |= p
    return s, c


def _merge_values(op: str, parts: Sequence[Partial], where: list[np.ndarray], g: int, t: int) -> np.ndarray:
    pres = []
    for p, w in zip(parts, where):
        a = np.zeros((g, t), bool)
        a[w] = p.present
        pres.append(a)
    if op == "group":
        return np.ones((g, t))
    if op == "count":
        return np.sum(_scatter(parts, where, "n", g, t, 0.0), axis=0)
    if op in ("min", "max"):
        f = np.fmin if op == "min" else np.fmax
        vs = _scatter(parts, where, "v", g, t, np.nan)
        out = vs[0]
        for v in vs[1:]:
            out = f(out, v)
        return out
    s, c = _neumaier(_scatter(parts, where, "s", g, t, 0.0), pres)
    c = c + np.sum(_scatter(parts, where, "c", g, t, 0.0), axis=0)
    total = np.where(np.isfinite(s), s + c, s)
    if op == "sum":
        return total
    nn = np.maximum(np.sum(_scatter(parts, where, "n", g, t, 0.0), axis=0), 1)
    direct = s / nn + c / nn
    if np.isfinite(s).all():
        return direct
    s2, c2 = _neumaier(_scatter(parts, where, "s2", g, t, 0.0), pres)
    c2 = c2 + np.sum(_scatter(parts, where, "c2", g, t, 0.0), axis=0)
    scaled = (s2 / nn + c2 / nn) / _SCALE
    return np.where(np.isfinite(s), direct, scaled)


class NotMergeable(Exception):
    """The parts' states cannot give a single evaluation's answer (the caller evaluates raw)."""


def _check_no_heap_replay(op: str, vec: VectorSteps, names: list[str], without: bool, param: Any, total: int,
                          size_of: dict[Labels, int]) -> None:
    """Where equal values straddle the k-th place of a group small enough for a single evaluation
    to replay Prometheus's heap over all of its series, the candidates are not enough (the heap's
    choice depends on series that are not candidates): NotMergeable. Elsewhere a single evaluation
    breaks such ties by series order, as the merge does. Every series tied with the k-th value is
    a candidate, so the straddled cells found among the candidates are all of them."""
    t = vec.num_steps
    pv = param.values if isinstance(param, Scalar) else np.full(t, np.nan)
    if np.isnan(pv).any() or pv.max() < 1 or pv.min() <= -2.0 ** 63 or pv.max() >= 2.0 ** 63:
        return  # select_k answers these from the parameter alone
    g = Groups(vec.labels, names, without)
    k = np.minimum(np.trunc(pv), total).astype(np.int64)
    key = _ordered_key(vec.values, vec.present, desc=(op == "topk"))
    sel = vec.present & _select_smallest(key, g, np.minimum(k, vec.num_series))
    sizes = np.array([size_of[lbl] for lbl in g.labels], np.int64)
    if heap_tie_cells(vec.present, key, g, k, sel, sizes):
        raise NotMergeable(f"{op}: equal values at the k-th place of a group small enough for a heap replay")


def _merge_candidates(op: str, parts: Sequence[Partial], t: int, names: list[str], without: bool, param: Any,
                      ann: Annotations, pos: str) -> VectorSteps:
    """topk/bottomk over the parts' candidates, laid out as a single evaluation sees them: groups in
    the order of their first series (candidate or not), series by labels within a group."""
    parts = [p for p in parts if p.labels]
    labels = [lbl for p in parts for lbl in p.labels]
    if not labels:
        return select_k(op, VectorSteps.empty(t), names, without, param, ann, pos)
    first_of: dict[Labels, Labels] = {}
    size_of: dict[Labels, int] = {}
    for p in parts:
        sizes = p.sizes.tolist() if p.sizes is not None else [0] * len(p.groups)
        for lbl, f, n in zip(p.groups, p.first, sizes):  # per group
            cur = first_of.get(lbl)
            if cur is None or f < cur:
                first_of[lbl] = f
            size_of[lbl] = size_of.get(lbl, 0) + int(n)
    g = Groups(labels, names, without)
    group_first = [first_of[lbl] for lbl in g.labels]
    gid = g.gid.tolist()
    order = sorted(range(len(labels)), key=lambda i: (group_first[gid[i]], labels[i]))
    idx = np.array(order, np.int64)
    vec = VectorSteps([labels[i] for i in order],
                      np.concatenate([p.arrays["v"] for p in parts])[idx],
                      np.concatenate([p.present for p in parts])[idx],
                      np.concatenate([p.drop for p in parts])[idx])
    complete = all(p.complete for p in parts)  # every group's series all here: replay the heap
    if not complete:
        _check_no_heap_replay(op, vec, names, without, param, sum(size_of.values()), size_of)
    out = select_k(op, vec, names, without, param, ann, pos, heap_ties=complete)
    if t > 1 and out.num_series > 1:  # a range's rows in series order, as a single evaluation's
        o = np.array(sorted(range(out.num_series), key=out.labels.__getitem__), np.int64)
        out = VectorSteps([out.labels[i] for i in o.tolist()], out.values[o], out.present[o],
                          None if out.drop_name is None else out.drop_name[o])
    return out


__all__ = ["Partial", "NotMergeable", "partial", "merge", "GROUP_OPS", "SELECT_OPS"]
