"""Late samples (older than their series' last folded sample, or older than the live start inside the
backfilled history) are folded into their panes: exact answers still equal raw evaluation over the
same data (1e-9), sketch answers stay within their stated rank error, nothing is dropped."""
from __future__ import annotations

import numpy as np
import pytest

from planner.canary import Canary
from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext
from planner.sds import SDS, SDSSpec
from planner.summarizer import Summarizer
from promql.engine import Engine
from storage.batch import SampleBatch
from tests.test_planner_exact import _compare
from storage.labels import make_labels
from promql.memory_source import MemorySource
from promql.query_opts import QueryOpts
from tests.test_planner_fixtures import T0, feed, load, random_series

QUERIES = [
    "sum_over_time(g[{r}])", "count_over_time(g[{r}])", "stddev_over_time(g[{r}])", "min_over_time(g[{r}])",
    "last_over_time(g[{r}])", "first_over_time(g[{r}])", "changes(g[{r}])", "delta(g[{r}])",
    "rate(x_total[{r}])", "increase(x_total[{r}])", "resets(x_total[{r}])",
    "histogram_quantile(0.9, sum by (le) (rate(h_bucket[{r}])))",
]


def _split(batch: SampleBatch, held: np.ndarray) -> tuple[SampleBatch, SampleBatch]:
    keep = ~held
    a = SampleBatch(batch.series, batch.series_index[keep], batch.timestamps[keep], batch.values[keep])
    b = SampleBatch(batch.series, batch.series_index[held], batch.timestamps[held], batch.values[held])
    return a, b


@pytest.fixture(scope="module")
def late_world():
    """In-order data first (live + backfill), then ~4% of the samples arrive late in random order:
    some in the open/sealed live panes, some below the live start inside the backfilled history."""
    items = random_series(seed=21)
    _, full = load(items)
    tmin, tmax = int(full.timestamps.min()), int(full.timestamps.max())
    live_from = tmin + (tmax - tmin) // 2 + 7_777
    rng = np.random.default_rng(22)
    held = (rng.random(len(full)) < 0.04) & (full.timestamps >= live_from - 3 * 3_600_000)
    on_time, late = _split(full, held)
    src, _ = load([])
    src.append(on_time)
    summ = Summarizer(src)
    sdss = {}
    for metric, alg in [("g", "exact"), ("x_total", "exact"), ("h_bucket", "exact"), ("g", "kll"), ("g", "req")]:
        sds = SDS(SDSSpec(metric, alg, 60_000))
        sds.seal_delay_ms = 0
        summ.start_live(sds, live_from_ts=live_from)
        sdss[(metric, alg)] = sds
    feed(summ, on_time)
    for sds in sdss.values():
        summ.backfill(sds, 30 * 86_400_000)
    # the late ones: stored first (the pipeline hands sinks only accepted samples), in shuffled chunks
    src.append(late)
    perm = rng.permutation(len(late))
    for ch in np.array_split(perm, 7):
        summ.consume(SampleBatch(late.series, late.series_index[ch], late.timestamps[ch], late.values[ch]))
    return src, summ, sdss, tmin, tmax, live_from, int(held.sum())


def _hook(sdss, served=None):
    return RewriteHook(RewriteContext(lambda m, a, ms, func=None: sdss.get((m, a)),
                                      (lambda s, c: served.append((s, c))) if served is not None else None,
                                      cost_based=False, approximate=True))


@pytest.mark.parametrize("qi", range(len(QUERIES)))
def test_exact_answers_with_late_samples_equal_raw(late_world, qi):
    src, summ, sdss, tmin, tmax, live_from, n_late = late_world
    eng, hook = Engine(src), _hook(sdss)
    rng = np.random.default_rng(300 + qi)
    served = 0
    for _ in range(5):
        r_ms = int(rng.choice([300_000, 1_000_000, 3_600_000, 4 * 3_600_000]))
        step = int(rng.choice([60_000, 137_000, 600_000]))
        start = int(rng.integers(live_from - 4 * 3_600_000, tmax - 1_800_000))
        end = min(start + step * int(rng.integers(5, 80)), tmax + 300_000)
        q = QUERIES[qi].format(r=f"{r_ms // 1000}s")
        raw = eng.range_query(q, start, end, step)
        fast = eng.range_query(q, start, end, step, QueryOpts(node_hooks=[hook]))
        _compare(raw, fast, q)
        served += any(p.startswith("summary:") for p in fast.stats.paths)
    assert served >= 3


def test_late_samples_are_counted_not_dropped(late_world):
    src, summ, sdss, tmin, tmax, live_from, n_late = late_world
    exact = [s for (m, a), s in sdss.items() if a == "exact"]
    assert sum(s.stats.late_folded for s in exact) > 0
    assert all(s.stats.late_dropped == 0 for s in sdss.values())
    assert all(s.stats.late_rebuilt_samples > 0 for s in exact)
    # sketches fold late samples directly: every sample of g is in the panes exactly once (sketches
    # skip NaN, stale markers included)
    for alg in ("kll", "req"):
        st = sdss[("g", alg)].store
        lo, hi = sdss[("g", alg)].coverage()
        n_panes = sum(sk.n for (s, k), sk in st.panes.items() if lo <= k < hi)
        ss = src.select(sdss[("g", alg)].spec.scope_matchers(), lo * 60_000, hi * 60_000 - 1)
        assert n_panes == int((~np.isnan(ss.values)).sum()), alg


def test_sketch_answers_with_late_samples_within_bound(late_world):
    src, summ, sdss, tmin, tmax, live_from, n_late = late_world
    served = []
    eng, hook = Engine(src), _hook(sdss, served)
    canary = Canary(fraction=0.0)
    recs = []
    for q in ['quantile_over_time(0.5, g{inst!="0"}[2h])', 'quantile_over_time(0.95, g{inst!="0"}[3h])']:  # inst 0 holds NaN: sketches skip NaN
        res = eng.range_query(q, live_from - 2 * 3_600_000, tmax, 600_000, QueryOpts(node_hooks=[hook]))
        assert any(p.startswith("summary:") for p in res.stats.paths)
        recs.append(canary.check_now(*served[-1]))
    assert recs[0]["algorithm"] == "kll" and recs[1]["algorithm"] == "req"
    within = sum(r["within_bound"] for r in recs)
    total = sum(r["checked"] for r in recs)
    assert total > 0 and within / total >= 0.99, recs


def test_without_raw_storage_exact_late_samples_are_counted_dropped():
    items = random_series(seed=5, n_series=2, n=300)
    _, full = load(items)
    summ = Summarizer(None)
    sds = SDS(SDSSpec("x_total", "exact", 60_000))
    summ.start_live(sds, live_from_ts=int(full.timestamps.min()))
    feed(summ, full)
    summ.flush()
    before = sds.stats.ingested_samples
    old = full.timestamps < np.median(full.timestamps)
    summ.consume(SampleBatch(full.series, full.series_index[old], full.timestamps[old] + 1, full.values[old]))
    summ.flush()
    n_x = int(np.isin(full.series_index[old], [i for i, l in enumerate(full.series) if dict(l)["__name__"] == "x_total"]).sum())
    assert sds.stats.late_dropped == n_x and sds.stats.ingested_samples == before


def test_late_samples_at_pane_boundaries_fix_the_next_entry_pair():
    """Step gauges (values from {0, 1, 2}) and counters resetting often, one sample per 20 s: late
    samples that were the last of their pane change the next pane's entry pair (a change / a reset),
    which the rebuild must recompute."""
    rng = np.random.default_rng(31)
    items = []
    n = 2000
    for i in range(4):
        ts = T0 + np.arange(n) * 20_000 + i * 100
        items.append((make_labels({"__name__": "st", "i": str(i)}), ts, rng.integers(0, 3, n).astype(float)))
        c = np.cumsum(rng.random(n) * 3)
        for r in np.nonzero(rng.random(n) < 0.2)[0]:
            c[r:] -= c[r] - rng.random()
        items.append((make_labels({"__name__": "rc_total", "i": str(i)}), ts, c))
    _, full = load(items)
    live_from = T0 + n * 20_000 // 3 + 5
    # hold back exactly the last sample of many panes (the one before a pane boundary)
    last_of_pane = (full.timestamps // 60_000) != ((full.timestamps + 20_000) // 60_000)
    held = last_of_pane & (rng.random(len(full)) < 0.5) & (full.timestamps >= live_from)
    on_time, late = _split(full, held)
    src, _ = load([])
    src.append(on_time)
    summ = Summarizer(src)
    sdss = {}
    for metric in ("st", "rc_total"):
        sds = SDS(SDSSpec(metric, "exact", 60_000))
        sds.seal_delay_ms = 0
        summ.start_live(sds, live_from_ts=live_from)
        sdss[(metric, "exact")] = sds
    feed(summ, on_time)
    for sds in sdss.values():
        summ.backfill(sds, 30 * 86_400_000)
    src.append(late)
    perm = rng.permutation(len(late))
    for ch in np.array_split(perm, 9):
        summ.consume(SampleBatch(late.series, late.series_index[ch], late.timestamps[ch], late.values[ch]))
    eng, hook = Engine(src), _hook(sdss)
    tmax = int(full.timestamps.max())
    for q in ["changes(st[10m])", "changes(st[1h])", "resets(rc_total[10m])", "increase(rc_total[7m])",
              "rate(rc_total[1h])"]:
        args = (live_from + 600_000, tmax, 120_000)
        raw = eng.range_query(q, *args)
        fast = eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
        assert fast.stats.paths[0].startswith("summary:"), q
        _compare(raw, fast, q)


def test_late_samples_after_cached_answers_still_equal_raw():
    """Answers computed (and cached by the summary path) before late samples arrive must not be reused
    once the late samples changed their panes."""
    items = random_series(seed=23, n_series=4, n=1200)
    _, full = load(items)
    tmin, tmax = int(full.timestamps.min()), int(full.timestamps.max())
    live_from = tmin + (tmax - tmin) // 3
    rng = np.random.default_rng(24)
    held = (rng.random(len(full)) < 0.05) & (full.timestamps >= live_from)
    on_time, late = _split(full, held)
    src, _ = load([])
    src.append(on_time)
    summ = Summarizer(src)
    sdss = {}
    for metric, alg in [("x_total", "exact"), ("g", "exact"), ("g", "kll")]:
        sds = SDS(SDSSpec(metric, alg, 60_000))
        sds.seal_delay_ms = 0
        summ.start_live(sds, live_from_ts=live_from)
        sdss[(metric, alg)] = sds
    feed(summ, on_time)
    for sds in sdss.values():
        summ.backfill(sds, 30 * 86_400_000)
    eng, hook = Engine(src), _hook(sdss)
    qs = ["rate(x_total[30m])", "changes(g[1h])", "sum_over_time(g[45m])", "quantile_over_time(0.5, g{inst!=\"0\"}[1h])"]
    args = (live_from + 3_600_000, tmax, 300_000)
    for q in qs:  # fill whatever the summary path caches, twice (a dashboard refresh)
        eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
        eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
    src.append(late)
    summ.consume(late)
    for q in qs[:3]:
        raw = eng.range_query(q, *args)
        fast = eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
        assert fast.stats.paths[0].startswith("summary:"), q
        _compare(raw, fast, q)
    # the KLL answers reflect the late samples too: the served value has the raw window's rank
    served: list = []
    hook2 = _hook(sdss, served)
    res = eng.range_query(qs[3], *args, QueryOpts(node_hooks=[hook2]))
    rec = Canary(fraction=0.0).check_now(*served[-1])
    assert res.stats.paths[0].startswith("summary:kll-") and rec["within_bound"] >= 0.99 * rec["checked"]
    assert rec["rank_within_bound"] >= 0.99 * rec["rank_checked"]


class _StoresDuringRead:
    """Raw storage whose next scope reads are each followed by one more write reaching storage and
    then the summarizer: the interleaving of a live write with the backfill's read of the same range."""

    def __init__(self, src, summ_ref: list, writes: list):
        self.src, self.summ_ref, self.writes = src, summ_ref, writes

    def select(self, matchers, mint, maxt):
        ss = self.src.select(matchers, mint, maxt)
        if self.writes:
            b = self.writes.pop(0)
            self.src.append(b)
            self.summ_ref[0].consume(b)
        return ss

    def __getattr__(self, name):
        return getattr(self.src, name)


def test_samples_stored_while_the_backfill_reads_their_range_are_folded():
    """Series written at one timestamp by two senders: the second sender's samples (older than the live
    start the first one set) are stored just after the backfill read that range. They reach the
    summarizer below the fold floor, are held, and are folded once the backfill has covered them --
    every exact answer over those panes equals raw evaluation."""
    rng = np.random.default_rng(41)
    series = [make_labels({"__name__": "x_total", "inst": str(i), "job": "j"}) for i in range(6)]
    t_hist = T0 + np.arange(200) * 15_000
    vals = np.cumsum(rng.random((6, len(t_hist))) * 10, axis=1)
    src = MemorySource()
    hist = SampleBatch(series, np.repeat(np.arange(6), len(t_hist)), np.tile(t_hist, 6), vals.ravel())
    src.append(hist)
    t0 = int(t_hist[-1]) + 15_000
    first = SampleBatch(series, np.arange(3), np.full(3, t0, np.int64), vals[:3, -1] + 5.0)
    second = SampleBatch(series, np.arange(3, 6), np.full(3, t0, np.int64), vals[3:, -1] + 7.0)
    summ_ref: list = []
    storage = _StoresDuringRead(src, summ_ref, [second])
    summ = Summarizer(storage)
    summ_ref.append(summ)
    src.append(first)
    summ.consume(first)  # the first sender: the newest time seen is now t0
    sds = SDS(SDSSpec("x_total", "exact", 60_000))
    sds.seal_delay_ms = 0
    summ.start_live(sds)  # live from t0 + 1: the second sender's t0 samples are below it
    summ.backfill(sds, 86_400_000)  # its first read is followed by the second sender's write
    t = t0
    live = vals[:, -1] + 10.0
    for _ in range(40):  # live writes afterwards, both senders
        t += 15_000
        live = live + rng.random(6) * 10
        b = SampleBatch(series, np.arange(6), np.full(6, t, np.int64), live.copy())
        src.append(b)
        summ.consume(b)
    summ.flush()
    assert sds.stats.late_dropped == 0
    eng, hook = Engine(src), _hook({("x_total", "exact"): sds})
    for q in ("increase(x_total[5m])", "count_over_time(x_total[5m])", "sum_over_time(x_total[10m])", "changes(x_total[5m])"):
        raw = eng.range_query(q, t0 - 1_800_000, t, 15_000)
        fast = eng.range_query(q, t0 - 1_800_000, t, 15_000, QueryOpts(node_hooks=[hook]))
        assert any(p.startswith("summary:") for p in fast.stats.paths), q
        _compare(raw, fast, q)


# --- the summarizer's queue: batches fold together, decided as of their arrival --------------------

def _gauge_batch(series, t_ms, values, ids):
    n = len(series)
    return SampleBatch(series, np.arange(n), np.full(n, t_ms, np.int64), np.asarray(values, float),
                       series_ids=np.asarray(ids, np.int64))


def test_a_queued_late_sample_is_folded_before_a_read_of_its_pane():
    series = [make_labels({"__name__": "g", "i": str(i)}) for i in range(3)]
    summ = Summarizer(None)
    sds = SDS(SDSSpec("g", "kll", 60_000))
    summ.start_live(sds, live_from_ts=T0)
    for k in range(40):  # 10 minutes at 15 s, in order
        summ.consume(_gauge_batch(series, T0 + 15_000 * k, [k, k, k], [0, 1, 2]))
    summ.backfill(sds, 0)  # no raw storage: nothing older to fill, coverage starts at the live start
    summ.flush()
    lo, hi = sds.coverage()
    assert hi > lo
    before = sds.stats.late_folded
    summ.consume(_gauge_batch(series[:1], T0 + 61_000, [1e6], [0]))  # late, in a sealed pane
    assert summ._queue, "a small batch waits in the queue"
    sds.coverage()  # a read of the panes folds it first
    assert not summ._queue and sds.stats.late_folded == before + 1


def test_in_order_batches_stay_queued_across_reads_of_sealed_panes():
    series = [make_labels({"__name__": "g", "i": str(i)}) for i in range(3)]
    summ = Summarizer(None)
    sds = SDS(SDSSpec("g", "exact", 60_000))
    summ.start_live(sds, live_from_ts=T0)
    for k in range(40):
        summ.consume(_gauge_batch(series, T0 + 15_000 * k, [k, k, k], [0, 1, 2]))
    summ.backfill(sds, 0)
    summ.flush()
    cov = sds.coverage()
    assert cov[1] > cov[0]
    summ.consume(_gauge_batch(series, T0 + 15_000 * 40, [40, 40, 40], [0, 1, 2]))
    assert sds.coverage() == cov and summ._queue  # newer than every sealed pane: no fold needed yet
    summ.flush()
    assert sds.stats.ingested_samples == 41 * 3


def test_order_independent_payload_keeps_the_floor_a_batch_met_on_arrival():
    """A sample below the fold floor when it arrived is the backfill's (it read storage, which had it);
    the floor moving down while the batch waits must not make live folding count it again."""
    series = [make_labels({"__name__": "g", "i": str(i)}) for i in range(2)]
    summ = Summarizer(None)
    sds = SDS(SDSSpec("g", "kll", 60_000))
    live_from = T0 + 600_000
    summ.start_live(sds, live_from_ts=live_from)
    sds.cov_lo = live_from // 60_000  # backfilled down to the live start so far
    summ.consume(_gauge_batch(series, live_from - 90_000, [5, 6], [0, 1]))  # below the floor: backfill's
    summ.consume(_gauge_batch(series, live_from + 1_000, [7, 8], [0, 1]))  # live
    sds.widen(sds.cov_lo - 5)  # the backfill folds an older chunk (which held the first batch) meanwhile
    summ.flush()
    assert sds.stats.ingested_samples == 2 and sds.stats.late_folded == 0


def test_an_sds_adopted_after_a_batch_arrived_does_not_fold_it():
    series = [make_labels({"__name__": "g", "i": "0"})]
    summ = Summarizer(None)
    first = SDS(SDSSpec("g", "kll", 60_000))
    summ.start_live(first, live_from_ts=T0)
    summ.consume(_gauge_batch(series, T0 + 5_000, [1.0], [0]))
    later = SDS(SDSSpec("g", "exact", 60_000))
    summ.start_live(later, live_from_ts=T0)  # even with a live start before the queued sample
    summ.flush()
    assert first.stats.ingested_samples == 1 and later.stats.ingested_samples == 0
