"""Functions through the real engine (parser, evaluator, in-memory source): what needs the whole
pipeline: annotation positions, instant-query ordering, info() selecting info series."""
from __future__ import annotations

import numpy as np
import pytest

from promql.engine import Engine
from promql.errors import PromQLError
from promql.memory_source import MemorySource
from storage.labels import make_labels

M = 60_000


@pytest.fixture()
def engine() -> Engine:
    src = MemorySource()
    ts = np.arange(0, 31 * M, M, dtype=np.int64)

    def add(lbls: dict, vals) -> None:
        src.add_series(make_labels(lbls), ts, np.asarray(vals, dtype=float))

    add({"__name__": "queue_depth", "instance": "a", "job": "w"}, np.arange(31) % 7)
    add({"__name__": "jobs_total", "instance": "a", "job": "w"}, np.arange(31) * 2.0)
    add({"__name__": "jobs_total", "instance": "b", "job": "w"}, np.arange(31) * 3.0)
    add({"__name__": "target_info", "instance": "a", "job": "w", "region": "eu"}, np.ones(31))
    add({"__name__": "build_info", "instance": "a", "job": "w", "version": "1.2"}, np.ones(31))
    for le, share in (("0.5", 0.5), ("1", 0.8), ("+Inf", 1.0)):
        add({"__name__": "lat_bucket", "le": le}, np.arange(31) * 10 * share)
    return Engine(src)


def test_rate_non_counter_info_points_at_the_argument(engine):
    res = engine.instant_query("sum(rate(queue_depth[5m]))", 30 * M)
    assert res.annotations.infos == [
        'PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: '
        '"queue_depth" (1:10)'
    ]
    assert engine.instant_query("rate(jobs_total[5m])", 30 * M).annotations.infos == []


def test_quantile_warning_position(engine):
    res = engine.instant_query("quantile_over_time(2, queue_depth[5m])", 30 * M)
    assert res.annotations.warnings == ["PromQL warning: quantile value should be between 0 and 1, got 2 (1:20)"]


def test_sort_desc_orders_instant_result(engine):
    res = engine.instant_query("sort_desc(rate(jobs_total[5m]))", 30 * M)
    assert [dict(lb)["instance"] for lb in res.labels] == ["b", "a"]
    res = engine.instant_query("sort(rate(jobs_total[5m]))", 30 * M)
    assert [dict(lb)["instance"] for lb in res.labels] == ["a", "b"]


@pytest.mark.parametrize("fn", ["sort", "sort_desc", "sort_by_label", "sort_by_label_desc"])
def test_sorting_warns_in_range_queries_only(engine, fn):
    expr = f'{fn}(jobs_total, "instance")' if "label" in fn else f"{fn}(jobs_total)"
    warning = "PromQL warning: sort is ineffective for range queries since results are always ordered by labels (1:1)"
    assert engine.range_query(expr, 0, 10 * M, M).annotations.warnings == [warning]
    assert engine.instant_query(expr, 10 * M).annotations.warnings == []


def test_histogram_quantile_over_rate(engine):
    res = engine.instant_query("histogram_quantile(0.5, rate(lat_bucket[5m]))", 30 * M)
    # per-second rates 5/60, 8/60, 10/60: rank 5/60 is exactly the le=0.5 bucket -> 0.5
    assert res.labels == [()] and res.values[0] == pytest.approx(0.5)


def test_info_adds_target_info_labels(engine):
    res = engine.instant_query('info(rate(jobs_total[5m]))', 30 * M)
    got = {dict(lb)["instance"]: dict(lb) for lb in res.labels}
    assert got["a"]["region"] == "eu"  # joined on instance/job
    assert "region" not in got["b"]  # no target_info for b: unchanged
    res = engine.instant_query('info(rate(jobs_total[5m]), {__name__="build_info"})', 30 * M)
    got = {dict(lb)["instance"]: dict(lb) for lb in res.labels}
    assert got["a"]["version"] == "1.2" and "region" not in got["a"]


def test_label_replace_collision_is_an_execution_error(engine):
    with pytest.raises(PromQLError, match="vector cannot contain metrics with the same labelset"):
        engine.instant_query('label_replace(jobs_total, "instance", "x", "", "")', 30 * M)


def test_label_replace_and_join_label_names_are_prometheus_utf8(engine):
    """Destination/source label names are valid when they are valid UTF-8 (U+FFFD included) and
    refused when a ``\\x`` escape makes a byte that is not UTF-8, as in Prometheus 3.x."""
    res = engine.instant_query('label_replace(queue_depth, "\\ufffd", "$1", "instance", "(.*)")', 30 * M)
    assert dict(res.labels[0])["\ufffd"] == "a"
    res = engine.instant_query('label_join(queue_depth, "\\ufffd", "-", "job", "instance")', 30 * M)
    assert dict(res.labels[0])["\ufffd"] == "w-a"
    for q in ('label_replace(queue_depth, "\\xff", "", "instance", "(.*)")',
              'label_join(queue_depth, "\\xff", "-", "job")', 'label_join(queue_depth, "dst", "-", "\\xff")'):
        with pytest.raises(PromQLError, match="invalid (destination|source) label name"):
            engine.instant_query(q, 30 * M)


def test_extended_range_selector_shown_as_range_vector():
    """``m[1m] anchored`` / ``smoothed`` as an instant query's result (Prometheus's extendFloats):
    the boundary value at the window start, the samples inside, the boundary value at its end."""
    src = MemorySource()
    src.add_series(make_labels({"__name__": "m"}), np.arange(0, 5 * M, M, dtype=np.int64), np.arange(1.0, 6.0))
    eng = Engine(src)
    t = 150_000  # window (90s, 150s]: one sample (120s) inside
    plain = eng.instant_query("m[1m]", t).csr
    assert plain[1].tolist() == [120_000] and plain[2].tolist() == [3.0]
    _, ts, vals = eng.instant_query("m[1m] anchored", t).csr
    assert ts.tolist() == [90_000, 120_000, 150_000] and vals.tolist() == [2.0, 3.0, 3.0]
    _, ts, vals = eng.instant_query("m[1m] smoothed", t).csr
    assert ts.tolist() == [90_000, 120_000, 150_000] and vals.tolist() == [2.5, 3.0, 3.5]
    with pytest.raises(PromQLError, match="anchored modifier can only be used with: changes, delta, increase, "
                                          "rate, resets - not with sum_over_time"):
        eng.instant_query("sum_over_time(m[1m] anchored)", t)
