"""The congestion model: per-instance and per-cluster signals from the slot table's columns.

Pure functions of arrays (no tracker state, no clock, no locks), so they are tested on their own:

* ``signal_matrices``: the slots' newest values and rates summed (or averaged, per the schema) into
  instance x signal matrices of levels, fast rates and slow rates;
* ``congestion_model``: per instance, queue, running, backlog (reported, else queue x tokens per
  request from the slow rates), throughput, arrival rate (throughput + backlog growth), service rate
  (capacity gauge, else the busy-time EWMA of throughput, else twice the peak: ``mu_source``), and the
  queueing surrogate of ``queueing.py`` on top (utilization, Kingman wait, congestion price); the
  model state carried between builds (busy-time service rate, peak throughput) comes in and goes out
  as new arrays;
* ``cluster_signals``: per (cluster, model) aggregates over fresh instances, the cluster priced as one
  pooled server.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler_metrics.congestion.config import CongestionConfig
from scheduler_metrics.congestion.queueing import (SurrogateParams, congestion_price, ewma_alpha, kingman_wait,
                                                   utilization)
from scheduler_metrics.congestion.slot_table import IS_MEAN, LORA, NSIG, SIG_INDEX, SlotColumns
from scheduler_metrics.schema import Signal

MU_SOURCES = np.array(["none", "capacity", "busy_throughput", "peak_bound"], dtype=object)


@dataclass
class SignalMatrices:
    level: np.ndarray  # (n, NSIG) newest values, summed or averaged per signal; NaN where none
    rate: np.ndarray  # (n, NSIG) fast EWMA rates, summed; NaN where none
    rate_slow: np.ndarray  # (n, NSIG) slow EWMA rates, summed; NaN where none
    count: np.ndarray  # (n, NSIG) valid slots behind each level


@dataclass
class InstanceSignals:
    queue: np.ndarray
    running: np.ndarray
    kv: np.ndarray
    throughput: np.ndarray
    backlog: np.ndarray
    backlog_reported: np.ndarray  # bool
    backlog_s: np.ndarray
    arrival: np.ndarray  # tokens/s
    mu: np.ndarray  # service rate, tokens/s
    mu_source: np.ndarray  # index into MU_SOURCES
    req_rate: np.ndarray
    tokens_per_request: np.ndarray
    rho: np.ndarray
    wait: np.ndarray  # Kingman queueing delay, s
    price: np.ndarray  # s of others' delay per added token
    age: np.ndarray  # s since the newest sample
    stale: np.ndarray  # bool
    load_count: np.ndarray  # slots of load signals (LoRA info aside) behind the instance
    mu_busy: np.ndarray  # model state for the next build
    peak: np.ndarray


def signal_matrices(c: SlotColumns) -> SignalMatrices:
    n = c.n
    flat = c.inst * NSIG + c.sig
    size = max(n, 1) * NSIG
    valid, rv = c.valid, c.rate_ok & c.valid

    def by_cell(mask: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        w = None if weights is None else weights[mask]
        return np.bincount(flat[mask], weights=w, minlength=size)[:size].reshape(-1, NSIG)

    lvl_sum, lvl_cnt = by_cell(valid, c.val * c.scale), by_cell(valid, None)
    rate_sum, rate_cnt = by_cell(rv, c.rate * c.scale), by_cell(rv, None)
    slow_sum = by_cell(rv, c.rate_slow * c.scale)
    with np.errstate(invalid="ignore", divide="ignore"):
        level = np.where(IS_MEAN, lvl_sum / np.maximum(lvl_cnt, 1), lvl_sum)
    return SignalMatrices(level=np.where(lvl_cnt > 0, level, np.nan)[:n], rate=np.where(rate_cnt > 0, rate_sum, np.nan)[:n],
                          rate_slow=np.where(rate_cnt > 0, slow_sum, np.nan)[:n], count=lvl_cnt[:n])


def congestion_model(m: SignalMatrices, newest: np.ndarray, mu_busy: np.ndarray, peak: np.ndarray, *, now: float,
                     dt_build: float, config: CongestionConfig, params: SurrogateParams) -> InstanceSignals:
    """Per-instance signals; ``newest`` in ms (-1: no sample), ``now`` in s, ``dt_build``: seconds
    since the previous build (the busy-time service rate's EWMA step)."""
    def L(s: Signal) -> np.ndarray:
        return m.level[:, SIG_INDEX[s]]

    def R(s: Signal) -> np.ndarray:
        return m.rate[:, SIG_INDEX[s]]

    def S(s: Signal) -> np.ndarray:
        return m.rate_slow[:, SIG_INDEX[s]]

    queue, running, kv = L(Signal.QUEUE_LENGTH), L(Signal.RUNNING), L(Signal.KV_USAGE)
    # Throughput of computed prefill tokens (departures), best source first.
    thr = R(Signal.PREFILL_COMPUTED)
    derived = np.maximum(R(Signal.PROMPT_TOKENS) - np.nan_to_num(R(Signal.PREFIX_HITS)), 0.0)
    thr = np.where(np.isnan(thr), derived, thr)
    thr = np.where(np.isnan(thr), L(Signal.PREFILL_TPS_GAUGE), thr)
    thr = np.maximum(thr, 0.0)
    # Tokens per request is a workload-mix property: ratio of the slow (6x window) rates, which
    # quantized request counters (0 or 1 finish per scrape) would otherwise make noisy.
    slow_thr = S(Signal.PREFILL_COMPUTED)
    slow_derived = np.maximum(S(Signal.PROMPT_TOKENS) - np.nan_to_num(S(Signal.PREFIX_HITS)), 0.0)
    slow_thr = np.where(np.isnan(slow_thr), slow_derived, slow_thr)
    req_done = S(Signal.REQUESTS_DONE)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpr = np.where((req_done > 0) & (slow_thr > 0), slow_thr / req_done, np.nan)
    tpr = np.where(np.isfinite(tpr), tpr, config.default_tokens_per_request)
    # Backlog: reported, else queued requests x tokens per request.
    backlog_rep = L(Signal.BACKLOG_TOKENS)
    has_backlog = ~np.isnan(backlog_rep)
    backlog = np.where(has_backlog, backlog_rep, queue * tpr)
    growth = np.where(has_backlog, R(Signal.BACKLOG_TOKENS), R(Signal.QUEUE_LENGTH) * tpr)
    lam = np.maximum(np.nan_to_num(thr) + np.nan_to_num(growth), 0.0)
    lam = np.where(np.isnan(thr) & np.isnan(growth), np.nan, lam)
    # Service rate mu: the capacity gauge, else the busy-time EWMA of throughput, else twice the peak.
    cap = L(Signal.CAPACITY_TPS)
    busy = (np.nan_to_num(backlog) > 0) | (np.nan_to_num(queue) > 0)
    thr0 = np.nan_to_num(thr)
    a = ewma_alpha(dt_build, config.rate_window_s)
    mu_busy = mu_busy.copy()
    upd = busy & (thr0 > 0)
    mu_busy[upd] = np.where(np.isnan(mu_busy[upd]), thr0[upd], mu_busy[upd] + a * (thr0[upd] - mu_busy[upd]))
    peak = np.maximum(peak, thr0)
    mu = np.where(cap > 0, cap, np.nan)
    src = np.where(cap > 0, 1, 0)
    mb = np.maximum(mu_busy, thr0)
    use_busy = np.isnan(mu) & (mb > 0)
    mu = np.where(use_busy, mb, mu)
    src = np.where(use_busy, 2, src)
    use_peak = np.isnan(mu) & (peak > 0)
    mu = np.where(use_peak, 2.0 * peak, mu)
    src = np.where(use_peak, 3, src)
    rho = utilization(lam, mu)
    with np.errstate(invalid="ignore", divide="ignore"):
        backlog_s = np.where(mu > 0, backlog / mu, np.nan)
        mean_service = np.where(mu > 0, tpr / mu, np.nan)
        req_rate = lam / tpr
    wq = kingman_wait(rho, mean_service, params)
    unfinished = np.where(np.isnan(backlog_s), wq, backlog_s)
    price = congestion_price(req_rate, mu, rho, unfinished, mean_service, params)
    price = np.where(np.isnan(rho), np.nan, price)
    age = np.where(newest >= 0, now - newest / 1000.0, np.inf)
    load_cnt = m.count.sum(axis=1) - m.count[:, LORA]
    stale = (age > config.stale_after_s) | (load_cnt == 0)
    return InstanceSignals(queue=queue, running=running, kv=kv, throughput=thr, backlog=backlog,
                           backlog_reported=has_backlog, backlog_s=backlog_s, arrival=lam, mu=mu, mu_source=src,
                           req_rate=req_rate, tokens_per_request=tpr, rho=rho, wait=wq, price=price, age=age,
                           stale=stale, load_count=load_cnt, mu_busy=mu_busy, peak=peak)


def jsonable(a: np.ndarray) -> list[float | None]:
    """Python floats with NaN/inf as None (JSON null)."""
    a = np.asarray(a, dtype=np.float64)
    out: list[float | None] = a.tolist()
    for i in np.flatnonzero(~np.isfinite(a)).tolist():
        out[i] = None
    return out


def cluster_signals(gid: np.ndarray, names: list[tuple[str, str]], s: InstanceSignals, idx: np.ndarray,
                    params: SurrogateParams, default_tokens_per_request: float) -> list[dict[str, Any]]:
    """Per (cluster, model) aggregates over the fresh instances among ``idx`` (instance ids; ``gid``: the
    group of each, named by ``names``), vectorized with bincount. The cluster is priced as one server of
    rate sum(mu) (optimistic for an M/G/c)."""
    if not len(gid):
        return []
    g = len(names)
    fresh = ~s.stale[idx]

    def tot(a: np.ndarray) -> np.ndarray:
        return np.bincount(gid[fresh], weights=np.nan_to_num(a[idx][fresh], nan=0.0, posinf=0.0), minlength=g)

    n_fresh = np.bincount(gid[fresh], minlength=g)
    n_all = np.bincount(gid, minlength=g)
    q_t, r_t, b_t, mu_t, lam_t, req_t = tot(s.queue), tot(s.running), tot(s.backlog), tot(s.mu), tot(s.arrival), tot(s.req_rate)
    kv, price = s.kv[idx], s.price[idx]
    kv_ok = fresh & np.isfinite(kv)
    kv_n = np.bincount(gid[kv_ok], minlength=g)
    kv_s = np.bincount(gid[kv_ok], weights=kv[kv_ok], minlength=g)
    p_ok = fresh & np.isfinite(price)
    pmin = np.full(g, np.inf)
    pmax = np.full(g, -np.inf)
    np.minimum.at(pmin, gid[p_ok], price[p_ok])
    np.maximum.at(pmax, gid[p_ok], price[p_ok])
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = utilization(lam_t, mu_t)
        tpr = np.where(req_t > 0, lam_t / req_t, default_tokens_per_request)
        backlog_s = np.where(mu_t > 0, b_t / mu_t, np.nan)
        mean_s = np.where(mu_t > 0, tpr / mu_t, np.nan)
        kv_mean = np.where(kv_n > 0, kv_s / np.maximum(kv_n, 1), np.nan)
    cprice = congestion_price(req_t, mu_t, rho, backlog_s, mean_s, params)
    spare = np.where(mu_t > 0, mu_t - lam_t, np.nan)
    cols = [jsonable(a) for a in (backlog_s, kv_mean, spare, rho, cprice, pmin, pmax)]
    out = []
    for k, (c, mdl) in enumerate(names):
        bs, kvm, sp, rh, cp, lo, hi = (col[k] for col in cols)
        out.append({
            "cluster": c, "model_name": mdl, "instances": int(n_fresh[k]), "stale_instances": int(n_all[k] - n_fresh[k]),
            "queue_length": float(q_t[k]), "running": float(r_t[k]), "backlog_tokens": float(b_t[k]),
            "backlog_seconds": bs, "kv_usage_mean": kvm,
            "service_rate_tokens_per_second": float(mu_t[k]), "arrival_rate_tokens_per_second": float(lam_t[k]),
            "spare_capacity_tokens_per_second": sp, "utilization": rh, "congestion_price_seconds_per_token": cp,
            "min_instance_price": lo, "max_instance_price": hi,
        })
    out.sort(key=lambda d: (d["cluster"], d["model_name"]))
    return out
