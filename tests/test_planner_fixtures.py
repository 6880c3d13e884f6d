"""Shared data builders for the planner tests (random counters, gauges, histograms); no tests here."""
from __future__ import annotations

import numpy as np

from planner.sds import SDS, SDSSpec
from planner.summarizer import Summarizer
from promql.memory_source import MemorySource
from storage.batch import SampleBatch
from storage.labels import make_labels
from storage.stale import STALE_NAN

# ``planner.summary_cost_prior`` for tests of adoption mechanics on these small synthetic data sets:
# their raw queries cost 1-3 ms, about the default prior (1.5 ms), where adoption would depend on the
# machine's speed. The default's own effect: test_planner_planner's test_the_default_prior_...
SMALL_DATA_PRIOR_S = 0.0005

T0 = 1_700_000_000_000  # data starts here (ms)


def random_series(seed: int, n_series: int = 6, n: int = 1500, with_specials: bool = True) -> list:
    """Counters with resets (x_total), gauges around a large mean (g), histogram buckets (h_bucket)."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n_series):
        ts = T0 + np.cumsum(rng.integers(5_000, 25_000, n))
        inc = rng.random(n) * 10
        c = np.cumsum(inc)
        resets = np.nonzero(rng.random(n) < 0.01)[0]
        for r in resets:
            c[r:] -= c[r] - rng.random()
        items.append((make_labels({"__name__": "x_total", "job": f"j{i % 2}", "inst": str(i)}), ts, c))
        g = rng.normal(1e6, 5.0, n)
        if with_specials and i == 0:
            g[rng.integers(0, n, 3)] = np.nan
            g[rng.integers(0, n, 2)] = STALE_NAN
        items.append((make_labels({"__name__": "g", "job": f"j{i % 2}", "inst": str(i)}), ts, g))
    # a histogram: cumulative buckets le=0.1,0.5,1,+Inf for 3 instances
    for i in range(3):
        ts = T0 + np.arange(n) * 15_000 + i * 1000
        obs = rng.exponential(0.4, (n, 20))
        for le in ("0.1", "0.5", "1", "+Inf"):
            bound = np.inf if le == "+Inf" else float(le)
            cnt = np.cumsum((obs <= bound).sum(axis=1)).astype(float)
            items.append((make_labels({"__name__": "h_bucket", "le": le, "inst": str(i)}), ts, cnt))
    return items


def load(items: list) -> tuple[MemorySource, SampleBatch]:
    src = MemorySource()
    batch = SampleBatch.from_series(items)
    src.append(batch)
    return src, batch


def feed(summ: Summarizer, batch: SampleBatch, chunks: int = 40) -> None:
    """Hand the batch to the summarizer in time order, as ingest would."""
    order = np.argsort(batch.timestamps, kind="stable")
    for ch in np.array_split(order, chunks):
        summ.consume(SampleBatch(batch.series, batch.series_index[ch], batch.timestamps[ch], batch.values[ch]))


def summarized(src: MemorySource, batch: SampleBatch, metrics_algs: list[tuple[str, str]], live_from: int,
               pane_ms: int = 60_000, history_ms: int = 30 * 86_400_000) -> tuple[Summarizer, list[SDS]]:
    summ = Summarizer(src)
    out = []
    for metric, alg in metrics_algs:
        sds = SDS(SDSSpec(metric, alg, pane_ms))
        sds.seal_delay_ms = 0
        summ.start_live(sds, live_from_ts=live_from)
        out.append(sds)
    feed(summ, batch)
    for sds in out:
        summ.backfill(sds, history_ms)
    return summ, out
