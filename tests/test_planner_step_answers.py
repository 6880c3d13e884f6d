"""Step answers under live ingest: a refresh reuses the steps no new sample touches and evaluates the
rest, and every refresh equals ``exact=true`` (the raw path) -- with in-order live writes, late and
out-of-order samples, new series, and deletions."""
from __future__ import annotations

import numpy as np
from promql import parser as promql_parser

from planner.stack import build
from planner.step_answers import EVERYTHING, NEVER, WriteFrontier, cacheable
from promql.engine import Engine
from promql.memory_source import MemorySource
from promql.query_opts import QueryOpts
from storage.batch import SampleBatch
from storage.labels import make_labels

T0 = 1_700_000_000_000
STEP = 15_000
PANELS = [
    "histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
    "sum by (model_name) (rate(vllm:generation_tokens_total[5m]))",
    "avg by (model_name) (avg_over_time(vllm:kv_cache_usage_perc[5m]))",
    "max by (instance) (max_over_time(vllm:num_requests_waiting[1m]))",
    "sum(vllm:num_requests_running) by (model_name) / on() group_left count(up)",
    "topk(2, vllm:num_requests_waiting)",
    "quantile_over_time(0.9, vllm:num_requests_waiting[10m])",
    "absent(nothing_here)",
]
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")


class Fleet:
    """vLLM-like series written in scrape-sized batches, each to storage then to the summarizer
    (as the ingest pipeline does)."""

    def __init__(self, instances: int = 6, seed: int = 7):
        self.rng = np.random.default_rng(seed)
        self.series = []
        for i in range(instances):
            base = {"instance": f"10.0.0.{i}:8000", "model_name": f"m{i % 2}", "job": "vllm"}
            for le in BUCKETS:
                self.series.append(make_labels({"__name__": "vllm:time_to_first_token_seconds_bucket", "le": le, **base}))
            for name in ("vllm:generation_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
                         "vllm:num_requests_running", "up"):
                self.series.append(make_labels({"__name__": name, **base}))
        self.state = np.zeros(len(self.series))

    def values(self) -> np.ndarray:
        out = np.empty(len(self.series))
        for j, lbl in enumerate(self.series):
            name = dict(lbl)["__name__"]
            if name.endswith("_bucket"):
                le = dict(lbl)["le"]
                self.state[j] += self.rng.poisson(3 if le == "+Inf" else 3 * min(1.0, float(le) * 1.5))
                out[j] = self.state[j]
            elif name.endswith("_total"):
                self.state[j] = 0.0 if self.rng.random() < 0.002 else self.state[j] + self.rng.poisson(40)
                out[j] = self.state[j]
            elif name == "up":
                out[j] = 1.0
            else:
                out[j] = float(self.rng.integers(0, 12)) if "num_" in name else self.rng.random()
        return out

    def batch(self, t: int, rows: np.ndarray | None = None) -> SampleBatch:
        rows = np.arange(len(self.series)) if rows is None else rows
        v = self.values()[rows]
        return SampleBatch(self.series, rows.astype(np.int64), np.full(len(rows), t, np.int64), v)


def write(src: MemorySource, st, batch: SampleBatch) -> None:
    src.append(batch)
    st.summarizer.consume(batch)


def grafana_range(now: int, hours: float = 1.0) -> tuple[int, int]:
    end = now // STEP * STEP
    return (now - int(hours * 3_600_000)) // STEP * STEP, end


def same(a, b, q: str) -> None:
    assert a.labels == b.labels, q
    np.testing.assert_array_equal(a.present, b.present, err_msg=q)
    np.testing.assert_allclose(np.where(a.present, a.values, 0), np.where(b.present, b.values, 0), rtol=1e-9,
                               atol=0, err_msg=q)


def setup(**cfg):
    """Reuse mechanics: cost_based false reuses every sealed step (no measured bypass on small data)."""
    src = MemorySource()
    st = build(src, Engine(src), None, {"background_backfill": False, "canary_fraction": 0.0, "cost_based": False, **cfg})
    fleet = Fleet()
    t = T0
    for _ in range(2 * 3600 // 15):  # two hours of history at 15 s
        write(src, st, fleet.batch(t))
        t += 15_000
    return src, st, fleet, t


def test_refreshes_under_live_ingest_equal_raw_and_reuse_steps():
    src, st, fleet, t = setup()
    try:
        for refresh in range(12):  # a refresh every 10 s, samples every 5 s in between
            for _ in range(2):
                write(src, st, fleet.batch(t))
                t += 5_000
            start, end = grafana_range(t)
            for q in PANELS:
                served = st.engine.range_query(q, start, end, STEP)
                raw = st.engine.range_query(q, start, end, STEP, QueryOpts(exact=True))
                same(served, raw, q)
                if refresh:
                    assert any(p.startswith("steps:reused:") for p in served.stats.paths), q
        d = st.engine.step_answers.describe()
        assert d["reuse_ratio"] > 0.9, d
    finally:
        st.planner.stop()


def test_late_and_out_of_order_writes_invalidate_exactly_what_they_touch():
    src, st, fleet, t = setup()
    try:
        start, end = grafana_range(t)
        for q in PANELS:
            st.engine.range_query(q, start, end, STEP)
        rng = np.random.default_rng(3)
        for k in range(6):
            # a late batch for some series 20-40 minutes back (an out-of-order window), then a new series
            # whose first samples are backfilled into the past, then live samples
            late_t = t - int(rng.integers(20, 40)) * 60_000 + 1234
            write(src, st, fleet.batch(late_t, rows=rng.choice(len(fleet.series), 8, replace=False)))
            new = make_labels({"__name__": "vllm:num_requests_waiting", "instance": f"late-{k}:8000",
                               "model_name": "m0", "job": "vllm"})
            write(src, st, SampleBatch([new], np.zeros(3, np.int64), late_t + np.arange(3) * 15_000, np.array([5.0, 9.0, 1.0])))
            write(src, st, fleet.batch(t))
            t += 10_000
            start, end = grafana_range(t)
            for q in PANELS:
                same(st.engine.range_query(q, start, end, STEP), st.engine.range_query(q, start, end, STEP, QueryOpts(exact=True)), q)
        assert st.engine.step_answers.describe()["invalidated_steps"] > 0
    finally:
        st.planner.stop()


def test_deletion_invalidates_every_kept_step():
    src, st, fleet, t = setup()
    try:
        q = PANELS[1]
        start, end = grafana_range(t)
        before = st.engine.range_query(q, start, end, STEP)
        st.planner.forget_deleted([])  # what the admin API calls after deleting series
        again = st.engine.range_query(q, start, end, STEP)
        assert not any(p.startswith("steps:reused") for p in again.stats.paths)
        same(before, again, q)
    finally:
        st.planner.stop()


def test_answers_that_read_outside_their_window_are_never_kept():
    for q, ok in [("rate(x[5m])", True), ("x offset 5m", True), ("x offset -5m", False), ("x @ 100", False),
                  ("max_over_time(rate(x[1m])[10m:1m] @ end())", False), ("sum(x) + y offset -1m", False)]:
        assert cacheable(promql_parser.parse(q)) is ok, q


def test_lagging_senders_and_refreshes_at_any_phase_equal_raw():
    """Engines whose samples arrive 0-5 s behind (each its own batch, as scrapes and remote writes do),
    a write every 5 s, refreshes at every phase of the step grid: every refresh equals exact=true,
    through summaries (adopted during the run) and reused steps alike."""
    src = MemorySource()
    st = build(src, Engine(src), None, {"canary_fraction": 0.0, "min_count": 2})  # backfill in the background, as served
    fleet = Fleet(instances=8, seed=11)
    rng = np.random.default_rng(5)
    per = len(fleet.series) // 8
    lag = rng.integers(0, 5_000, 8)
    lag[:3] = 0  # some engines stamp exactly on the step and pane grid (window edges are (t - r, t])
    t = T0 // 60_000 * 60_000
    try:
        for _ in range(2 * 3600 // 5):  # two hours of history, every 5 s, engines lagging
            for i in np.argsort(lag)[::-1]:
                rows = np.arange(i * per, (i + 1) * per)
                write(src, st, fleet.batch(int(t - lag[i]), rows))
            t += 5_000
        for tick in range(40):
            for i in np.argsort(lag)[::-1]:
                rows = np.arange(i * per, (i + 1) * per)
                write(src, st, fleet.batch(int(t - lag[i]), rows))
            t += 5_000
            if tick % 2:
                continue
            now = t - int(rng.integers(0, 15_000))  # the refresh lands anywhere in the step grid
            start, end = grafana_range(now)
            for q in PANELS[:4] + ["sum by (model_name) (increase(vllm:generation_tokens_total[10m]))"]:
                same(st.engine.range_query(q, start, end, STEP), st.engine.range_query(q, start, end, STEP, QueryOpts(exact=True)), q)
        assert any(s.spec.algorithm == "exact" for s in st.planner.sds.values())
    finally:
        st.planner.stop()


def test_refreshes_on_a_new_grid_each_time_are_not_kept():
    """A client that sends end=now (no alignment to the step) never meets its own grid again: its
    answers are evaluated whole and not kept (they would only push Grafana's panels out of the cache),
    while an aligned panel's are kept from its first load."""
    src, st, fleet, t = setup()
    try:
        q = PANELS[1]
        sa = st.engine.step_answers
        for k in range(6):
            write(src, st, fleet.batch(t))
            t += 5_000
            now = t - 1_000 - 7 * k  # a new phase of the 15 s grid every time
            served = st.engine.range_query(q, now - 3_600_000, now, STEP)
            same(served, st.engine.range_query(q, now - 3_600_000, now, STEP, QueryOpts(exact=True)), q)
            assert not any(p.startswith("steps:reused") for p in served.stats.paths)
        d = sa.describe()
        assert d["entries"] == 0 and d["unkept_queries"] == 6, d
        start, end = grafana_range(t)
        st.engine.range_query(q, start, end, STEP)
        assert sa.describe()["entries"] == 1
        # the same unaligned grid twice (a client repeating one exact range): kept from the second on
        odd = t - 3_333
        for _ in range(3):
            st.engine.range_query(q, odd - 3_600_000, odd, STEP)
        assert sa.describe()["entries"] == 2
        again = st.engine.range_query(q, odd - 3_600_000, odd, STEP)
        assert any(p.startswith("steps:reused") for p in again.stats.paths)
    finally:
        st.planner.stop()


def test_reuse_that_costs_more_than_evaluating_whole_is_bypassed_and_measured_again():
    """A key whose refreshes cost no less CPU than evaluating their steps whole is evaluated whole (its
    kept steps dropped) for the bypass period, then measured again from a whole evaluation."""
    from planner.step_answers import _Cost

    c = _Cost()
    c.full_per_step.extend([1e-5] * 3)
    c.warm.extend([(3e-3, 240)] * 2)
    assert c.reuse_pays() is None  # too few refreshes measured
    c.warm.append((3e-3, 240))
    assert c.reuse_pays() is False  # 3 ms per refresh against 2.4 ms for all 240 steps
    c.warm.clear()
    c.warm.extend([(1e-3, 240)] * 3)
    assert c.reuse_pays() is True

    src, st, fleet, t = setup(cost_based=True)
    try:
        q = PANELS[3]
        sa = st.engine.step_answers
        for k in range(8):
            write(src, st, fleet.batch(t))
            t += 5_000
            start, end = grafana_range(t)
            if k == 4:  # the measurements say reuse does not pay for this key
                key = next(iter(sa.costs))
                sa.costs[key].full_per_step.extend([1.0] * 8)
                sa.costs[key].warm.clear()
                sa.costs[key].warm.extend([(1e6, 1)] * 2)
            served = st.engine.range_query(q, start, end, STEP)
            same(served, st.engine.range_query(q, start, end, STEP, QueryOpts(exact=True)), q)
        d = sa.describe()
        assert d["bypassed_keys"] == 1 and d["bypassed_queries"] >= 2, d
        assert not any(p.startswith("steps:reused:") for p in served.stats.paths)
        assert d["entries"] == 0  # the bypassed key's kept steps were dropped
    finally:
        st.planner.stop()


def test_write_log_answers_everything_for_a_sequence_it_no_longer_holds():
    """A kept answer armed before a trim dropped the writes after its sequence must not be validated
    as if none happened (a first evaluation running while another refresh trims the log; a cluster
    querier asking an ingester with an old sequence)."""
    f = WriteFrontier(seal_delay_ms=10_000)
    f.observe(0, 100_000)  # live: nothing logged
    armed, _ = f.arm()
    f.observe(50_000, 100_000)  # late: at or below the sealed frontier (90 s)
    late_seq = f.seq
    f.observe(100_000, 101_000)
    assert f.oldest_since(armed) == 50_000 and f.oldest_since(late_seq) == NEVER
    f.trim(late_seq)  # every kept entry is valid from late_seq on: the late write is forgotten
    assert f.oldest_since(late_seq) == NEVER
    assert f.oldest_since(armed) == EVERYTHING  # older than the log holds: nothing kept may stand


def test_reuse_is_measured_with_the_cpu_other_processes_spent():
    """A cluster querier evaluates little itself: its ingesters do the pushed-down work and report
    their CPU (``QueryStats.remote_cpu_seconds``). Reuse is weighed with it, so a querier keeps reusing
    steps where evaluating them whole costs its ingesters more (it used to measure only its own
    thread, found refreshes no cheaper and evaluated every refresh whole)."""
    from planner.step_answers import StepAnswers
    from promql.types import QueryResult, QueryStats

    frontier = WriteFrontier(seal_delay_ms=10_000)
    frontier.observe(T0, T0 + 3 * 3_600_000)  # everything up to 3 h after T0 has arrived (sealed)
    sa = StepAnswers(frontier, measured=True)

    def compute(s: int, e: int) -> QueryResult:
        ts = np.arange(s, e + 1, STEP, dtype=np.int64)
        stats = QueryStats(remote_cpu_seconds=1e-3 * len(ts))  # 1 ms of ingester CPU per step
        return QueryResult("matrix", [make_labels({"job": "x"})], values=ts[None, :].astype(float),
                           present=np.ones((1, len(ts)), bool), timestamps=ts, stats=stats)

    for k in range(12):
        end = T0 + 3_600_000 + k * STEP
        res = sa.range_query(("default", "q", 300_000, False), end - 3_600_000, end, STEP, compute)
        assert res.values[0].tolist() == np.arange(end - 3_600_000, end + 1, STEP).astype(float).tolist()
    assert sa.describe()["bypassed_keys"] == 0
    assert any(p.startswith("steps:reused:") for p in res.stats.paths)
