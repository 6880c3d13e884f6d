"""Partial aggregation states (promql/partial_aggregate.py) merged over disjoint series sets give
what one aggregation over all the series gives; the pushdown decision names why a query is not
pushed; the partial state survives the columnar codec unchanged."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from promql.eval_aggregate import aggregate
from promql.engine import parse
from promql.partial_aggregate import merge, partial
from promql.types import Annotations, Scalar, VectorSteps
from turboprom.cluster import columns_codec
from turboprom.cluster.pushdown_decision import decide

OPS = ["sum", "count", "min", "max", "avg", "group", "topk", "bottomk"]


def fleet(rng: np.random.Generator, s: int, t: int, special: bool, big: bool = True, ties: bool = True) -> VectorSteps:
    labels = sorted(tuple(sorted({"__name__": f"m{i % 2}", "job": f"j{i % 3}", "instance": f"i{i}",
                                  "zone": f"z{i % 4}"}.items())) for i in range(s))
    values = rng.normal(0, 100, (s, t))
    if ties:  # rounded: equal values at the topk boundary occur
        values = values.round(1)
    if special:
        values[rng.random((s, t)) < 0.05] = np.nan
        if ties:  # several infinities tie
            values[rng.random((s, t)) < 0.02] = np.inf
        if big:  # sums of these overflow, in an order-dependent way (not for sum, then)
            values[rng.random((s, t)) < 0.02] = 9.988465674311579e307
            values[rng.random((s, t)) < 0.02] = -9.988465674311579e307
    present = rng.random((s, t)) < 0.8
    drop = rng.random(s) < 0.5
    return VectorSteps(labels, np.where(present, values, 0.0), present, drop)


def split(vec: VectorSteps, parts: int, rng: np.random.Generator) -> list[VectorSteps]:
    owner = rng.integers(0, parts, vec.num_series)
    out = []
    for p in range(parts):
        idx = np.flatnonzero(owner == p)
        out.append(VectorSteps([vec.labels[i] for i in idx.tolist()], vec.values[idx], vec.present[idx],
                               None if vec.drop_name is None else vec.drop_name[idx]))
    return out


def same(a: VectorSteps, b: VectorSteps) -> None:
    assert a.labels == b.labels
    assert (a.present == b.present).all()
    np.testing.assert_allclose(np.where(a.present, a.values, 0), np.where(b.present, b.values, 0), rtol=1e-12, atol=0)
    assert (a.drop_name_mask() == b.drop_name_mask()).all()


@pytest.mark.parametrize("op,whole", [(op, True) for op in OPS] + [("topk", False), ("bottomk", False)])
@pytest.mark.parametrize("grouping", [([], False), (["job"], False), (["instance"], True), (["zone", "job"], False)])
@pytest.mark.parametrize("t", [1, 7, 90])
@pytest.mark.parametrize("special", [False, True])
def test_merged_partials_equal_one_aggregation(op, whole, grouping, t, special, monkeypatch):
    """``whole`` False: topk/bottomk parts too large to send every series (only candidates)."""
    import promql.partial_aggregate as pa

    if not whole:
        monkeypatch.setattr(pa, "COMPLETE_CELLS", 0)
    rng = np.random.default_rng(zlib.crc32(repr((op, t, special, grouping)).encode()))
    names, without = grouping
    select = op in ("topk", "bottomk")
    vec = fleet(rng, 150, t, special, big=op not in ("sum", "topk", "bottomk"), ties=not select)
    param = Scalar(np.full(t, 3.0)) if select else None
    want = aggregate(op, vec, names, without, param, Annotations())
    for parts in (1, 3, 7):
        states = [partial(op, p, names, without, param) for p in split(vec, parts, rng)]
        got = merge(op, states, t, names, without, param, Annotations())
        same(want, got)


@pytest.mark.parametrize("op", ["topk", "bottomk"])
@pytest.mark.parametrize("grouping", [([], False), (["job"], False)])
def test_top_k_ties_merge_exactly_or_refuse(op, grouping, monkeypatch):
    """Equal values at the k-th place: a single evaluation replays Prometheus's heap over all of a
    group's series when that fits its work budget. Parts small enough to send every series
    (``COMPLETE_CELLS``) let the merge replay it too (equal answers); from candidates alone it cannot
    (NotMergeable: the querier evaluates raw), unless a single evaluation would not replay either
    and breaks ties by series order, as the merge does."""
    import promql.eval_aggregate as ea
    import promql.partial_aggregate as pa
    from promql.partial_aggregate import NotMergeable

    rng = np.random.default_rng(3)
    names, without = grouping
    vec = fleet(rng, 150, 20, False)
    vec.values[:] = np.round(vec.values / 50)  # few distinct values: ties everywhere
    param = Scalar(np.full(20, 4.0))
    parts = split(vec, 4, rng)
    want = aggregate(op, vec, names, without, param, Annotations())
    states = [partial(op, p, names, without, param) for p in parts]
    assert all(s.complete for s in states)
    same(want, merge(op, states, 20, names, without, param, Annotations()))
    # one part too large to send whole: only candidates from it, and the heap cannot be replayed
    monkeypatch.setattr(pa, "COMPLETE_CELLS", parts[0].num_series * 20 - 1)
    states = [partial(op, p, names, without, param) for p in parts]
    assert not all(s.complete for s in states)
    with pytest.raises(NotMergeable):
        merge(op, states, 20, names, without, param, Annotations())
    monkeypatch.setattr(ea, "_HEAP_SIM_BUDGET", 10)  # a single evaluation would not replay either
    same(aggregate(op, vec, names, without, param, Annotations()), merge(op, states, 20, names, without, param, Annotations()))


def test_codec_round_trip_keeps_every_state():
    rng = np.random.default_rng(7)
    vec = fleet(rng, 40, 5, True)
    for op in OPS:
        param = Scalar(np.full(5, 2.0)) if op in ("topk", "bottomk") else None
        p = partial(op, vec, ["job"], False, param)
        q, header = columns_codec.decode_partial(columns_codec.encode_partial(p, {"infos": ["x"]}))
        assert header == {"infos": ["x"]}
        assert (q.op, q.labels, q.first, q.groups, q.complete) == (p.op, p.labels, p.first, p.groups, p.complete)
        assert (q.present == p.present).all()
        assert set(q.arrays) == set(p.arrays)
        for k in p.arrays:
            assert np.array_equal(q.arrays[k], p.arrays[k], equal_nan=True)
        assert (p.dp is None) == (q.dp is None) and (p.dp is None or (p.dp == q.dp).all())
        assert (p.drop is None) == (q.drop is None) and (p.drop is None or (p.drop == q.drop).all())


@pytest.mark.parametrize("query", [
    "sum(x)", "sum by (job) (rate(x[5m]))", "avg without (i) (irate(x[1m] offset 5m) * 8)",
    "topk(5, x)", "bottomk by (a) (2, -delta(x[5m]))", "count(x > 3)", "max(quantile_over_time(0.9, x[5m]))",
    'group by (le) (increase({__name__=~"x_bucket|y_bucket"}[5m]) / 60)', "min(x @ 100)", "sum((x))",
])
def test_pushable(query):
    assert decide(parse(query)).pushed, decide(parse(query)).reason


@pytest.mark.parametrize("query,reason", [
    ("stddev(x)", "stddev has no mergeable partial state"),
    ("quantile(0.9, x)", "quantile has no mergeable partial state"),
    ("sum(x * y)", "binary expression between two vectors"),
    ("sum(abs(x))", "function abs is not a per-series range function"),
    ("sum(rate(x[5m:1m]))", "rate of something other than a range selector"),
    ("sum(sum(x))", "AggregateExpr is not evaluated series by series"),
    ("topk(scalar(y), x)", "topk parameter is not a number"),
    ("sum(x and y)", "binary operator and is not arithmetic or a comparison"),
    ("sum(absent_over_time(x[5m]))", "function absent_over_time is not a per-series range function"),
    ("sum(rate(x[5m+1m]))", "range given as a duration expression"),
    ("rate(x[5m])", "not an aggregation"),
])
def test_not_pushable_names_why(query, reason):
    d = decide(parse(query))
    assert not d.pushed and d.reason == reason
