"""An ingester's share of a pushed-down aggregation answered from its exact summaries
(turboprom/cluster/partition_eval.py): the partial states equal the raw evaluation's over the same
partitions, whether the request asks for every partition the node holds or for some of them (the
summaries' series then filtered by partition), and ``exact`` keeps it raw. The planner learns the
pushed sub-trees as queries of the node's own."""
from __future__ import annotations

import time

import numpy as np

from planner.stack import build
from promql.engine import Engine
from promql.memory_source import MemorySource
from promql.partial_aggregate import merge
from promql.types import Annotations
from tests.test_planner_step_answers import STEP, Fleet, write
from turboprom.cluster import columns_codec
from turboprom.cluster.partition_eval import PartialRequest, PartitionIndex, evaluate_partial
from turboprom.tenancy import DEFAULT_TENANT, TenantView

T0 = (int(time.time() * 1000) - 2 * 3_600_000) // 3_600_000 * 3_600_000  # recent: plans cover from now back
TOTAL = 16
HELD = set(range(TOTAL))
QUERIES = [
    ("histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
     "vllm:time_to_first_token_seconds_bucket"),
    ("sum by (model_name) (rate(vllm:generation_tokens_total[5m]))", "vllm:generation_tokens_total"),
    ("max by (instance) (max_over_time(vllm:num_requests_waiting[10m]))", "vllm:num_requests_waiting"),
]


def stack_with(tmp_path, pinned: list[str], minutes: int = 100):
    src = MemorySource()
    view = TenantView(src, DEFAULT_TENANT)
    st = build(view, Engine(view), tmp_path / "planner", {
        "pinned": [{"metric": m, "algorithm": "exact", "pane": "1m"} for m in pinned],
        "cost_based": False, "background_backfill": False, "seal_delay": "1s"})
    fleet = Fleet(instances=12)
    for k in range(minutes * 60_000 // STEP):
        write(src, st, fleet.batch(T0 + k * STEP))
    return src, st


def request(query: str, agg_text: str, partitions: list[int], exact: bool = False) -> PartialRequest:
    start = query.index(agg_text)
    steps = np.arange(T0 + 30 * 60_000, T0 + 80 * 60_000 + 1, 60_000, dtype=np.int64)
    return PartialRequest(query, (start, start + len(agg_text)), DEFAULT_TENANT, partitions, steps,
                          int(steps[0]), int(steps[-1]), 60_000, 300_000, 0, 50_000_000, 0, 30.0, exact)


def aggregation_text(query: str) -> str:
    i = query.index("sum by") if "sum by" in query else query.index("max by")
    depth, j = 0, query.index("(", query.index(")", i) + 1)
    for j in range(j, len(query)):
        depth += query[j] == "("
        depth -= query[j] == ")"
        if depth == 0:
            break
    return query[i:j + 1]


def answer(src, req, planned=None, index=None):
    part, header = columns_codec.decode_partial(evaluate_partial(src, req, HELD, TOTAL, planned, index))
    return part, header


def assert_states_equal(a, b, q):
    """Equal per group (groups in any order: the summaries list series in the order they registered them)."""
    assert sorted(a.labels) == sorted(b.labels), q
    assert sorted(a.arrays) == sorted(b.arrays), q
    rows = {lbl: i for i, lbl in enumerate(b.labels)}
    for i, lbl in enumerate(a.labels):
        j = rows[lbl]
        assert np.array_equal(a.present[i], b.present[j]), (q, lbl)
        for k in a.arrays:
            x, y = a.arrays[k][i][a.present[i]], b.arrays[k][j][b.present[j]]
            assert np.allclose(x, y, rtol=1e-9, atol=1e-12, equal_nan=True), (q, lbl, k)


def test_partial_states_from_summaries_equal_raw_for_all_or_some_partitions(tmp_path):
    src, st = stack_with(tmp_path, [m for _, m in QUERIES])
    index = PartitionIndex(TOTAL)
    halves = [list(range(0, TOTAL, 2)), list(range(1, TOTAL, 2))]
    for q, _ in QUERIES:
        agg = aggregation_text(q)
        for parts in (sorted(HELD), *halves):
            raw, _ = answer(src, request(q, agg, parts))
            served, header = answer(src, request(q, agg, parts), st.engine, index)
            assert_states_equal(served, raw, (q, len(parts)))
            assert any("served from summary" in i for i in header["infos"]), (q, header)
            forced, header = answer(src, request(q, agg, parts, exact=True), st.engine, index)
            assert_states_equal(forced, raw, q)
            assert not any("served from summary" in i for i in header["infos"]), q
        # the two halves' states merge to the whole node's, as the querier merges two owners'
        whole, _ = answer(src, request(q, agg, sorted(HELD)))
        parts = [answer(src, request(q, agg, h), st.engine, index)[0] for h in halves]
        op = "max" if agg.startswith("max") else "sum"
        names = ["instance"] if op == "max" else (["le", "model_name"] if "le," in agg else ["model_name"])
        merged = merge(op, parts, len(request(q, agg, halves[0]).steps), names, False, None, Annotations(), "")
        alone = merge(op, [whole], len(request(q, agg, halves[0]).steps), names, False, None, Annotations(), "")
        rows = {lbl: i for i, lbl in enumerate(alone.labels)}
        assert sorted(merged.labels) == sorted(alone.labels), q
        for i, lbl in enumerate(merged.labels):
            j = rows[lbl]
            assert np.array_equal(merged.present[i], alone.present[j]), q
            assert np.allclose(merged.values[i][merged.present[i]], alone.values[j][alone.present[j]], rtol=1e-9), q


def test_pushed_sub_trees_are_learnt_as_the_node_own_queries(tmp_path):
    src, st = stack_with(tmp_path, [], minutes=30)
    index = PartitionIndex(TOTAL)
    q = QUERIES[1][0]
    agg = aggregation_text(q)
    before = st.query_log.sql("SELECT count(*) FROM query_log WHERE origin = 'pushdown'")[0][0]
    for _ in range(4):
        answer(src, request(q, agg, list(range(8))), st.engine, index)
    st.query_log.flush()
    rows = st.query_log.sql("SELECT expr, pattern FROM query_log WHERE origin = 'pushdown'")
    assert len(rows) - before == 4
    assert rows[-1][0] == "rate(vllm:generation_tokens_total[5m])"
    seen = {c["metric"]: c for c in st.planner.candidates_report()}
    c = seen["vllm:generation_tokens_total"]
    assert c["recent_queries"] == 4 and c["mean_raw_cpu_s"] > 0, c
    assert c["patterns"] == ["rate(vllm:generation_tokens_total{}[$r])"], c
