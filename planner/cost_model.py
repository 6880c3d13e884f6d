"""Does an SDS pay? Raw CPU from the query log vs summary path + ingest-side cost + storage.

All figures are per second of wall time over the observation period:

* raw cost      = query rate x mean raw CPU per query (measured; the log's cpu_s of queries on the
                  raw path that would use this SDS; refreshes the step answers shortened count at
                  their own cost and share of the arrivals, ``Planner._consider``)
* summary cost  = query rate x (raw cost x edge fraction (the two raw edge runs, <= 2 panes per
                  window, relative to the window, or the share of the span the pattern's step grid
                  leaves raw when that is more) + per-window merge cost + the summary path's fixed
                  cost per evaluation (coverage, pane reads, raw-edge setup: measured over the plans'
                  shadow runs, ~1 ms; a query whose raw cost is about that, e.g. the newest step of a
                  refresh whose other steps come from the step cache, cannot be cheaper served))
* ingest cost   = ingest rate of the metric x fold cost per sample (measured by the summarizer,
                  default 2 µs until measured), and at least what a live plan costs per second now
                  (measured over plans live for a minute or more: a fold also has a fixed cost per
                  scrape batch, which dominates on small scrapes), plus the one-time backfill of the
                  plan's history (samples x measured backfill cost per sample) spread over
                  ``amortize_s`` (the planner's retire_after: a plan that stops paying goes then)
* storage       = series x panes kept (the history and the panes a plan holds past it until its next
                  trim) x bytes per pane; must fit the remaining budget.

Adopt when the summary path costs at most ``MAX_SUMMARY_SHARE`` of the raw path per query and
raw - summary > ingest x safety; retire when hits stop or the saving turns negative.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.algorithm_registry import ALGORITHMS

DEFAULT_FOLD_COST_S = 2e-6
# a live plan's fold CPU per second until one has been measured for a minute: ~2e-4 was measured per
# plan in `make demo` (13 plans, 8 workers scraped every second, 2-core machine); half of it as the prior
DEFAULT_PLAN_CPU_PER_S = 1e-4
# the summary path's fixed CPU per served evaluation (the whole served query: the engine's own fixed
# cost, which the raw path pays too, and the summary read's) until shadow runs have measured it:
# 1.9-3 ms was measured for the newest steps of vLLM-fleet panels over 8-96 series (`make demo`, the
# live dashboard bench). A prior of a quarter of that (0.5 ms) had `make demo` adopt a dozen 8-16
# series plans within its first minute that the shadow runs then found no faster (0 hits, their fold
# and backfill a third of the summarization CPU); a little under the cheapest measurement instead
DEFAULT_SUMMARY_FIXED_S = 1.5e-3
# ... and per series of the plan: its raw edges and pane reads are per series. Measured for a refresh's
# newest steps: ~7.6 µs per series on the 1,449-series TTFT plan (11 ms), 8 µs on a 6,400-series node
# CPU plan (52-55 ms on a slower box, against 10-12 ms raw); under half of it as the prior
DEFAULT_SUMMARY_PER_SERIES_S = 3e-6


def summary_prior_s(series: int, fixed_s: float = DEFAULT_SUMMARY_FIXED_S) -> float:
    """The summary path's CPU per evaluation of a plan over ``series`` series, until measured
    (``fixed_s``: ``planner.summary_cost_prior``)."""
    return fixed_s + DEFAULT_SUMMARY_PER_SERIES_S * max(series, 0)
# CPU per history sample read and folded by a backfill until one has been measured (0.2-0.4 µs measured
# in remote-write-sized chunks, bench/planner_fold_bench.py)
DEFAULT_BACKFILL_COST_S = 4e-7
# the largest summary / raw CPU per query a plan is adopted at. Both sides are estimates from a few
# millisecond-scale measurements (thread CPU of a handful of queries, a prior or the cheapest measured
# fixed cost): on the demo's small counter panels (8 series, rate over [1m], ~1.5 ms raw) plans
# estimated at 0.77x of raw measured 1.2-2.0x once served, then cost their backfill and live fold until
# retired; the histogram panels that pay were estimated at 0.5-0.67x and measured 0.3-0.8x
MAX_SUMMARY_SHARE = 0.75


@dataclass
class Estimate:
    query_rate: float  # queries/s using the SDS
    raw_cpu_per_query: float
    summary_cpu_per_query: float
    ingest_cpu_per_s: float
    storage_bytes: int
    pays: bool
    reason: str

    @property
    def saving_per_s(self) -> float:
        return self.query_rate * (self.raw_cpu_per_query - self.summary_cpu_per_query) - self.ingest_cpu_per_s


def estimate(
    *,
    algorithm: str,
    queries: int,
    period_s: float,
    raw_cpu_per_query: float,
    range_ms: int,
    windows_per_query: float,
    series: int,
    ingest_samples_per_s: float,
    pane_ms: int,
    history_ms: int,
    budget_left_bytes: int,
    fold_cost_s: float = DEFAULT_FOLD_COST_S,
    plan_cpu_floor_per_s: float = 0.0,
    safety: float = 1.0,
    bytes_per_pane: int | None = None,
    summary_fixed_s: float = DEFAULT_SUMMARY_FIXED_S,
    backfill_cost_s: float = DEFAULT_BACKFILL_COST_S,
    amortize_s: float = 3600.0,
    slack_panes: int = 0,
    edge_fraction: float | None = None,
) -> Estimate:
    rate = queries / max(period_s, 1e-9)
    # the raw edges' share: two panes per window, or what the pattern's own step grid leaves raw when
    # that is more (``Planner._grid_edges``; 1.0 where the rewrite would answer the grid raw)
    edge_fraction = max(min(1.0, 2.0 * pane_ms / max(range_ms, 1)), edge_fraction or 0.0)
    alg = ALGORITHMS[algorithm]
    per_window = alg.window_cost_s
    summary = raw_cpu_per_query * edge_fraction + per_window * windows_per_query + summary_fixed_s
    backfill = ingest_samples_per_s * history_ms / 1000 * backfill_cost_s  # one-time: the history's samples
    ingest = max(ingest_samples_per_s * fold_cost_s, plan_cpu_floor_per_s) + backfill / max(amortize_s, 1.0)
    per_pane = alg.bytes_per_pane if bytes_per_pane is None else bytes_per_pane  # a store keeping fewer fields
    # the panes kept: the history, and the newer ones a plan holds until its next trim (``slack_panes``;
    # a plan estimated just under the budget went over it within minutes and was retired)
    storage = int(max(series, 1) * (history_ms // max(pane_ms, 1) + 1 + slack_panes) * per_pane)
    if storage > budget_left_bytes:
        return Estimate(rate, raw_cpu_per_query, summary, ingest, storage, False,
                        f"storage {storage} B exceeds the remaining budget {budget_left_bytes} B")
    if summary > MAX_SUMMARY_SHARE * raw_cpu_per_query:
        return Estimate(rate, raw_cpu_per_query, summary, ingest, storage, False,
                        f"no clear saving: summary {summary:.6f} s is {summary / max(raw_cpu_per_query, 1e-12):.2f}x"
                        f" the raw {raw_cpu_per_query:.6f} s per query (at most {MAX_SUMMARY_SHARE:.2f}x pays"
                        " beyond the estimates' noise)")
    saving = rate * (raw_cpu_per_query - summary) - ingest * safety
    if saving <= 0:
        return Estimate(rate, raw_cpu_per_query, summary, ingest, storage, False,
                        f"no saving: {rate:.4f} q/s x ({raw_cpu_per_query:.6f} - {summary:.6f}) s <= ingest {ingest:.6f} CPU-s/s"
                        f" (backfill {backfill:.3f} CPU-s over {amortize_s:.0f} s)")
    return Estimate(rate, raw_cpu_per_query, summary, ingest, storage, True,
                    f"saves {saving:.6f} CPU-s/s: {rate:.4f} q/s x ({raw_cpu_per_query:.6f} raw - {summary:.6f} summary)"
                    f" - {ingest:.6f} ingest (backfill {backfill:.3f} CPU-s over {amortize_s:.0f} s); storage {storage} B")
