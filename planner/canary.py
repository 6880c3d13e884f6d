"""Accuracy canary: re-evaluates a sample of summary-served sub-trees on raw data, exports the error.

Exact algorithms: maximum relative error over the served (series, step) points (a presence mismatch
counts as an infinite error). KLL / REQ: whether Prometheus's exact value (the raw evaluation) lies in
the stated value interval of each window (``scan_kll``'s [low, high], in the value's units): a miss is
recorded as its relative distance from the interval; the observed normalized rank error against the
stated rank bound (``SDS.rank_bound``) is reported beside it. CPC / frequent items: relative count error
against the stated bound. Runs on its own worker thread, off the query.

It also measures shapes of use the rewrite answers raw until measured (``trial``): there the reader got
the raw answer, and the summary path of the same sub-tree runs here; the pair is timed and checked the
same way.

Both kinds of run wait for a quiet moment (``Foreground``): a run queued by a query used to start while
that query was still evaluating its other sub-trees and encoding its answer, and on the interpreter's
one lock it took turns with them (a 4.5 ms panel answered in 7.8 ms while its summary path was measured
beside it, on a 2-core box).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from planner.rewrite import timed
from planner.rewrite_rules import Decision, Rule, Served
from planner.sds import shape_of
from promql.eval_context import QueryBudget
from promql.eval_selectors import eval_matrix_selector
from promql.evaluator import Evaluator
from promql.functions import FUNCTIONS, FunctionContext, load_all
from promql.types import Annotations, QueryStats, Scalar

log = logging.getLogger("turboprom.planner")

CANARY_ERROR = Histogram(
    "turboprom_planner_canary_error", "Observed error of summary-served answers re-evaluated on raw data "
    "(relative error for exact algorithms, normalized rank error for KLL)", ["algorithm"],
    buckets=(0, 1e-12, 1e-9, 1e-6, 1e-3, 0.005, 0.01, 0.02, 0.05, 0.1, 1.0, float("inf")),
)
CANARY_MAX = Gauge("turboprom_planner_canary_max_error", "Largest error seen by the canary per SDS", ["sds"])
CANARY_CHECKS = Counter("turboprom_planner_canary_checks_total", "Canary checks by outcome", ["algorithm", "outcome"])


def exact_error(summary: np.ndarray, summary_present: np.ndarray, raw: np.ndarray, raw_present: np.ndarray) -> float:
    if summary.shape != raw.shape or (summary_present != raw_present).any():
        return float("inf")
    p = summary_present
    if not p.any():
        return 0.0
    a, b = summary[p], raw[p]
    both_nan = np.isnan(a) & np.isnan(b)
    same = (a == b) | both_nan
    with np.errstate(all="ignore"):
        rel = np.abs(a - b) / np.maximum(np.abs(b), 1e-300)
    rel = np.where(same, 0.0, rel)
    rel = np.where(np.isnan(rel), np.inf, rel)
    return float(rel.max())


def kll_rank_errors(values: np.ndarray, present: np.ndarray, rw: Any, phi: float, limit: int = 400,
                    tol: np.ndarray | None = None) -> list[float]:
    """Normalized rank error of each served quantile among its window's raw samples (sampled).

    ``tol`` (per series): the value's representation error (REQ keeps float32 of ``v - c``), so the
    served value stands for any sample within ``v +- tol``."""
    out = []
    idx = np.argwhere(present)
    if len(idx) > limit:
        idx = idx[np.random.default_rng(0).choice(len(idx), limit, replace=False)]
    for s, j in idx:  # bounded by ``limit`` windows per check
        lo, hi = int(rw.lo[s, j]), int(rw.hi[s, j])
        w = np.sort(rw.vals[lo:hi])
        n = len(w)
        if n == 0:
            continue
        v = values[s, j]
        t = float(tol[s]) if tol is not None else 0.0
        r_lo = np.searchsorted(w, v - t, side="left") / n
        r_hi = np.searchsorted(w, v + t, side="right") / n
        out.append(0.0 if r_lo <= phi <= r_hi else float(min(abs(r_lo - phi), abs(r_hi - phi))))
    return out


def value_interval_misses(lo: np.ndarray | None, hi: np.ndarray | None, raw: np.ndarray, present: np.ndarray) -> list[float]:
    """Per checked window: 0 when the raw (Prometheus) value lies in the stated [lo, hi] interval, else
    its distance from the interval relative to the value's magnitude."""
    if lo is None or hi is None or lo.shape != raw.shape:
        return [float("inf")] if present.any() else []
    p = present & np.isfinite(raw)
    r, a, b = raw[p], lo[p], hi[p]
    tol = np.abs(r) * 1e-12  # float formatting of equal values
    miss = np.where(r < a - tol, a - r, np.where(r > b + tol, r - b, 0.0))
    with np.errstate(all="ignore"):
        rel = miss / np.maximum(np.abs(r), 1e-300)
    return [float(x) for x in rel]


class Foreground:
    """Queries a reader is waiting for, in flight (``PlannedEngine`` enters and leaves): background
    measurement waits until none is and the last one left ``QUIET_S`` ago (the answer's encoding and
    sending follow the evaluation), at most ``MAX_WAIT_S`` (a busy server still gets its measurements)."""

    QUIET_S = 0.02
    MAX_WAIT_S = 2.0

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._n = 0
        self._left = 0.0

    def enter(self) -> None:
        with self._cv:
            self._n += 1

    def leave(self) -> None:
        with self._cv:
            self._n -= 1
            self._left = time.monotonic()
            self._cv.notify_all()

    def wait_quiet(self) -> None:
        deadline = time.monotonic() + self.MAX_WAIT_S
        with self._cv:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    return
                if self._n == 0:
                    quiet_in = self._left + self.QUIET_S - now
                    if quiet_in <= 0:
                        return
                    self._cv.wait(min(quiet_in, deadline - now))
                else:
                    self._cv.wait(deadline - now)


class Canary:
    def __init__(self, fraction: float = 0.05, seed: int | None = None, foreground: Foreground | None = None):
        self.fraction = float(fraction)
        self.rng = random.Random(seed)
        self.foreground = foreground if foreground is not None else Foreground()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planner-canary")
        self.pending = 0  # sampled accuracy checks in flight (bounded by MAX_PENDING)
        self.probing: set[tuple[str, tuple]] = set()  # (sds id, shape) of measuring runs in flight
        self.lock = threading.Lock()
        self.results: list[dict[str, Any]] = []  # recent checks, for /api/v1/planner/canary and tests
        load_all()

    def records(self) -> list[dict[str, Any]]:
        """The recent checks (newest last), copied under the lock."""
        with self.lock:
            return list(self.results)

    SHADOW_FIRST = 8  # every SDS's first served sub-trees are shadowed, and each new shape of use: the
    # rewrite skips a summary for shapes measured slower than raw, and the planner retires plans on these
    MAX_PENDING = 4  # sampled checks in flight; more are skipped (the sample is a fraction anyway)
    MAX_PROBING = 16  # measuring runs in flight, at most one per (SDS, shape of use)

    def __call__(self, served: Served, ectx: Any) -> None:
        """Queue a shadow run of ``served`` when it measures the plan (its SDS's first runs, or a shape
        of use without a verdict yet) or falls in the sampled fraction.

        Measuring runs are admitted apart from the sample, one per (SDS, shape) at a time: a shape's
        verdict needs ``SDSStats.SHAPE_MIN_RUNS`` of them, and until it has them the summary answers
        that shape whether or not it is slower than raw. Sharing the sample's small bound let the
        shadow runs of a dashboard's heavy panels (tens to hundreds of ms each on the one worker)
        crowd out a cheap panel's probes load after load, so a plan slower than raw on that panel
        kept serving it."""
        st = served.sds.stats
        shape = shape_of(served.func, served.range_ms, len(served.ends))
        probe = (served.sds.id, shape) if st.shadow_runs < self.SHADOW_FIRST or st.needs_probe(shape) else None
        if probe is None and (self.fraction <= 0 or self.rng.random() >= self.fraction):
            return
        with self.lock:
            if probe is not None:
                if probe in self.probing or len(self.probing) >= self.MAX_PROBING:
                    return
                self.probing.add(probe)
            else:
                if self.pending >= self.MAX_PENDING:
                    return
                self.pending += 1
        st.shadow_runs += 1
        self.pool.submit(self._quietly, self._check, served, ectx, True, probe)

    def trial(self, rule: Rule, d: Decision, node: Any, ectx: Any, raw: Any, raw_wall: float, raw_cpu: float) -> None:
        """Measure the summary path of a sub-tree the rewrite just answered raw because its shape of use
        has no verdict yet (``SDSStats.measuring``): the same rule serves the same node and steps on
        the canary's worker, timed as the hook times a served answer, and the pair (summary, the raw
        answer the reader got) is recorded and checked like a shadow run. Admitted as measuring runs
        are (one per (SDS, shape) in flight); a load that finds its shape's run still going is raw
        and unmeasured."""
        probe = (d.sds.id, shape_of(d.func, d.range_ms, len(d.ends)))
        with self.lock:
            if probe in self.probing or len(self.probing) >= self.MAX_PROBING:
                return
            self.probing.add(probe)
        self.pool.submit(self._quietly, self._trial, rule, d, node, ectx, (raw, raw_wall, raw_cpu), probe)

    def busy(self, sds_id: str, shape: tuple) -> bool:
        """Whether ``trial`` would turn away a measuring run of ``shape`` on that SDS now."""
        with self.lock:
            return (sds_id, shape) in self.probing or len(self.probing) >= self.MAX_PROBING

    def _quietly(self, fn: Any, *args: Any) -> Any:
        self.foreground.wait_quiet()
        return fn(*args)

    def _trial(self, rule: Rule, d: Decision, node: Any, ectx: Any, raw_run: tuple[Any, float, float],
               probe: tuple[str, tuple]) -> None:
        try:
            ctx = _fresh(ectx)
            served = timed(lambda: rule.serve(d, node, ctx))
            if isinstance(served, Served):
                d.sds.stats.shadow_runs += 1
                self._check(served, ctx, count_pending=False, raw_run=raw_run)
        except Exception:  # noqa: BLE001
            log.exception("measuring the summary path failed")
        finally:
            with self.lock:
                self.probing.discard(probe)

    def in_flight(self) -> int:
        """Shadow runs queued or running (sampled checks and measuring runs)."""
        with self.lock:
            return self.pending + len(self.probing)

    def check_now(self, served: Served, ectx: Any) -> dict[str, Any]:
        return self._check(served, ectx, count_pending=False)

    def _check(self, served: Served, ectx: Any, count_pending: bool = True,
               probe: tuple[str, tuple] | None = None,
               raw_run: tuple[Any, float, float] | None = None) -> dict[str, Any]:
        """Re-evaluate ``served`` on raw data (or take ``raw_run``: the raw answer and its wall and CPU
        seconds, when the reader got the raw answer), record the pair's times and check the error."""
        try:
            ctx = _fresh(ectx)
            rw = None
            if raw_run is not None:
                raw, raw_wall, raw_cpu = raw_run
            else:
                w0, c0 = time.perf_counter(), time.thread_time()
                if type(served.node).__name__ == "AggregateExpr":  # group SDS: the whole aggregate, raw
                    raw = Evaluator().eval(served.node, ctx)
                else:
                    rw = eval_matrix_selector(ctx, served.node.args[-1])
                    fctx = FunctionContext(step_times=ctx.step_times, annotations=ctx.annotations, node=served.node,
                                           lookback_delta_ms=ctx.lookback_delta_ms, query_start_ms=ctx.query_start_ms,
                                           query_end_ms=ctx.query_end_ms, query_step_ms=ctx.query_step_ms)
                    args = [Scalar(np.full(len(ctx.step_times), served.phi)), rw] if served.phi is not None else [rw]
                    raw = FUNCTIONS[served.func](fctx, args)
                raw_wall, raw_cpu = time.perf_counter() - w0, time.thread_time() - c0
            served.sds.stats.record(shape_of(served.func, served.range_ms, len(served.ends)),
                                    served.wall_s, served.cpu_s, raw_wall, raw_cpu)
            # align series by labels
            pos = {l: i for i, l in enumerate(raw.labels)}
            sv, sp = served.value.values, served.value.present
            rv = np.zeros_like(sv)
            rp = np.zeros_like(sp)
            missing = False
            for i, l in enumerate(served.value.labels):
                k = pos.get(l)
                if k is None:
                    missing = missing or bool(sp[i].any())
                    continue
                rv[i], rp[i] = raw.values[k], raw.present[k]
            extra = len(set(pos) - set(served.value.labels)) > 0 and any(
                raw.present[pos[l]].any() for l in set(pos) - set(served.value.labels))
            alg = served.sds.spec.algorithm  # the metrics' label
            check = served.sds.algorithm.canary
            extra_rec: dict[str, Any] = {}
            if check == "exact":
                err = float("inf") if (missing or extra) else exact_error(sv, sp, rv, rp)
                bound = 1e-9
                errs = [err]
            elif check == "relative":  # relative error per point against the stated bound
                bound = served.sds.relative_bound()
                errs = []
                if missing or extra or (sp != rp).any():
                    errs = [float("inf")]
                else:
                    with np.errstate(all="ignore"):
                        rel = np.abs(sv[sp] - rv[sp]) / np.maximum(np.abs(rv[sp]), 1.0)
                    errs = [float(e) for e in rel]
                err = max(errs) if errs else 0.0
            else:
                # rank errors need the raw windows of the served series, in served order
                if rw is None:
                    rw = eval_matrix_selector(ctx, served.node.args[-1])
                tol = None
                rounding = served.sds.algorithm.payload_rounding
                if rounding:  # values stored rounded around their series' shift c: |v - c| * rounding
                    shift = served.sds.store.series_shift()
                    ids = [served.sds.registry.index.get(l, -1) for l in served.value.labels]
                    c = np.array([shift[i] if 0 <= i < len(shift) else 0.0 for i in ids])
                    c = np.nan_to_num(c, nan=0.0)
                    tol = np.nanmax(np.abs(np.where(sp, sv, c[:, None]) - c[:, None]), axis=1) * rounding if sv.size else None
                rank_errs = kll_rank_errors(sv, sp & rp, _reorder_windows(rw, served.value.labels), served.phi or 0.0,
                                            tol=tol)
                # what the reader sees: Prometheus's exact value inside the stated [low, high] interval
                errs = value_interval_misses(served.scan.info.get("lo"), served.scan.info.get("hi"), rv, sp & rp)
                err = max(errs) if errs else 0.0
                bound = 0.0  # a miss is a raw value outside the stated interval (its distance from it, in units)
                rank_bound = served.sds.rank_bound(served.phi if served.phi is not None else 0.5)
                extra_rec = {"rank_bound": rank_bound, "max_rank_error": max(rank_errs) if rank_errs else 0.0,
                             "rank_checked": len(rank_errs),
                             "rank_within_bound": sum(1 for e in rank_errs if e <= rank_bound)}
            for e in errs:
                CANARY_ERROR.labels(alg).observe(e if np.isfinite(e) else float("inf"))
            within = sum(1 for e in errs if e <= bound)
            CANARY_CHECKS.labels(alg, "within_bound").inc(within)
            CANARY_CHECKS.labels(alg, "exceeded").inc(len(errs) - within)
            prev = CANARY_MAX.labels(served.sds.id)._value.get()  # noqa: SLF001 - read back our own gauge
            CANARY_MAX.labels(served.sds.id).set(max(prev, err))
            rec = {"sds": served.sds.id, "algorithm": alg, "function": served.func, "max_error": err,
                   "bound": bound, "checked": len(errs), "within_bound": within, "time": time.time(),
                   "served_wall_s": served.wall_s, "served_cpu_s": served.cpu_s, "raw_wall_s": raw_wall,
                   "raw_cpu_s": raw_cpu, **extra_rec}
            with self.lock:
                self.results.append(rec)
                del self.results[:-200]
            return rec
        except Exception:  # noqa: BLE001
            log.exception("canary check failed")
            return {}
        finally:
            if count_pending:
                with self.lock:
                    if probe is not None:
                        self.probing.discard(probe)
                    else:
                        self.pending -= 1

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    stop = close


def _fresh(ectx: Any) -> Any:
    """``ectx`` for a run on the canary's worker: its own stats and annotations, no hooks, and a budget
    of its own (the query's deadline has passed or will)."""
    return replace(ectx, stats=QueryStats(), annotations=Annotations(), hooks=(),
                   budget=QueryBudget(max_samples=ectx.budget.max_samples, deadline=time.monotonic() + 300,
                                      timeout_s=300))


def _reorder_windows(rw: Any, labels: list) -> Any:
    """RangeWindows rows reordered to ``labels`` order (rows of missing series are empty)."""
    pos = {l: i for i, l in enumerate(rw.labels)}
    S, T = len(labels), rw.lo.shape[1]
    lo = np.zeros((S, T), np.int64)
    hi = np.zeros((S, T), np.int64)
    for i, l in enumerate(labels):
        k = pos.get(l)
        if k is not None:
            lo[i], hi[i] = rw.lo[k], rw.hi[k]
    return replace(rw, labels=list(labels), lo=lo, hi=hi)
