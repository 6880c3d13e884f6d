"""The congestion model on its own (scheduler_metrics/congestion/model.py): pure functions of the slot
table's columns, checked against hand-computed values of the surrogate in queueing.py."""
from __future__ import annotations

import numpy as np
import pytest

from scheduler_metrics.congestion.config import CongestionConfig
from scheduler_metrics.congestion.model import (MU_SOURCES, SignalMatrices, cluster_signals, congestion_model,
                                                signal_matrices)
from scheduler_metrics.congestion.queueing import SurrogateParams, congestion_price, kingman_wait
from scheduler_metrics.congestion.slot_table import NSIG, SIG_INDEX, SlotColumns
from scheduler_metrics.schema import Signal

CFG = CongestionConfig()
P = SurrogateParams()
NOW = 1_000.0


def _m(n: int, levels: dict | None = None, rates: dict | None = None, slow: dict | None = None) -> SignalMatrices:
    """Instance x signal matrices with the given (signal -> per-instance values); NaN elsewhere."""
    out = []
    for d in (levels or {}, rates or {}, slow or {}):
        a = np.full((n, NSIG), np.nan)
        for sig, v in d.items():
            a[:, SIG_INDEX[sig]] = v
        out.append(a)
    count = (~np.isnan(out[0])).astype(np.int64)
    return SignalMatrices(level=out[0], rate=out[1], rate_slow=out[2], count=count)


def _run(m: SignalMatrices, mu_busy=None, peak=None, newest=None, dt_build=1.0):
    n = m.level.shape[0]
    mu_busy = np.full(n, np.nan) if mu_busy is None else mu_busy
    peak = np.zeros(n) if peak is None else peak
    newest = np.full(n, (NOW - 1.0) * 1000.0) if newest is None else newest
    return congestion_model(m, newest, mu_busy, peak, now=NOW, dt_build=dt_build, config=CFG, params=P)


def test_service_rate_sources_in_order_of_preference():
    # 0: capacity gauge; 1: busy (queue > 0) with throughput; 2: idle, only a peak seen; 3: nothing
    m = _m(4, levels={Signal.QUEUE_LENGTH: [0, 3, 0, 0], Signal.CAPACITY_TPS: [9000, np.nan, np.nan, np.nan]},
           rates={Signal.PREFILL_COMPUTED: [100.0, 400.0, 0.0, np.nan]})
    s = _run(m, peak=np.array([0.0, 0.0, 250.0, 0.0]))
    assert list(MU_SOURCES[s.mu_source]) == ["capacity", "busy_throughput", "peak_bound", "none"]
    assert s.mu[0] == 9000 and s.mu[1] == 400.0 and s.mu[2] == 500.0 and np.isnan(s.mu[3])


def test_carried_state_comes_back_new_and_inputs_stay():
    m = _m(2, levels={Signal.QUEUE_LENGTH: [2, 0]}, rates={Signal.PREFILL_COMPUTED: [300.0, 120.0]})
    mu_busy, peak = np.array([200.0, np.nan]), np.array([0.0, 500.0])
    s = _run(m, mu_busy=mu_busy, peak=peak, dt_build=CFG.rate_window_s)
    assert np.array_equal(mu_busy, [200.0, np.nan], equal_nan=True) and np.array_equal(peak, [0.0, 500.0])
    a = 1.0 - np.exp(-1.0)  # one EWMA time constant
    assert s.mu_busy[0] == pytest.approx(200.0 + a * (300.0 - 200.0)) and np.isnan(s.mu_busy[1])  # idle: not busy
    assert list(s.peak) == [300.0, 500.0]


def test_backlog_reported_or_queue_times_tokens_per_request_and_the_surrogate():
    # 0 reports its backlog; 1 has a queue and a measured workload mix (2,000 tokens per request)
    m = _m(2, levels={Signal.QUEUE_LENGTH: [1, 4], Signal.BACKLOG_TOKENS: [6000, np.nan], Signal.CAPACITY_TPS: [10000, 10000]},
           rates={Signal.PREFILL_COMPUTED: [5000.0, 5000.0], Signal.QUEUE_LENGTH: [np.nan, 0.0],
                  Signal.BACKLOG_TOKENS: [0.0, np.nan]},
           slow={Signal.PREFILL_COMPUTED: [5000.0, 5000.0], Signal.REQUESTS_DONE: [2.5, 2.5]})
    s = _run(m)
    assert list(s.backlog_reported) == [True, False]
    assert s.backlog[0] == 6000 and s.backlog[1] == 4 * 2000
    assert list(s.tokens_per_request) == [2000.0, 2000.0]
    assert list(s.rho) == [0.5, 0.5] and list(s.backlog_s) == [0.6, 0.8]
    mean_s = np.array([0.2, 0.2])
    wq = kingman_wait(np.array([0.5, 0.5]), mean_s, P)
    np.testing.assert_allclose(s.wait, wq)
    np.testing.assert_allclose(s.price, congestion_price(np.array([2.5, 2.5]), np.array([1e4, 1e4]), np.array([0.5, 0.5]),
                                                         np.array([0.6, 0.8]), mean_s, P))


def test_stale_when_old_or_without_load_signals():
    m = _m(3, levels={Signal.QUEUE_LENGTH: [1, 1, np.nan], Signal.LORA_INFO: [np.nan, np.nan, 1.7e9]})
    s = _run(m, newest=np.array([(NOW - 1) * 1000, (NOW - CFG.stale_after_s - 1) * 1000, (NOW - 1) * 1000]))
    assert list(s.stale) == [False, True, True]  # the third has only LoRA info: no load signal
    assert s.age[0] == pytest.approx(1.0)


def test_signal_matrices_sum_or_average_per_schema():
    # instance 0: two engines' queues (sum) and KV usage (mean); instance 1: one queue, rates not settled
    c = SlotColumns(n=2, slots=np.arange(5), sig=np.array([SIG_INDEX[Signal.QUEUE_LENGTH]] * 2 + [SIG_INDEX[Signal.KV_USAGE]] * 2
                                                          + [SIG_INDEX[Signal.QUEUE_LENGTH]]),
                    inst=np.array([0, 0, 0, 0, 1]), scale=np.ones(5), val=np.array([2.0, 3.0, 0.2, 0.6, 7.0]),
                    rate=np.array([1.0, 1.0, 0.0, 0.0, 9.0]), rate_slow=np.ones(5),
                    rate_ok=np.array([True, True, True, True, False]), valid=np.ones(5, bool),
                    newest=np.zeros(2, np.int64), keys=[("c", "m", "a"), ("c", "m", "b")], stacks=["vllm", "vllm"])
    m = signal_matrices(c)
    q, kv = SIG_INDEX[Signal.QUEUE_LENGTH], SIG_INDEX[Signal.KV_USAGE]
    assert m.level[0, q] == 5.0 and m.level[0, kv] == pytest.approx(0.4) and m.level[1, q] == 7.0
    assert m.rate[0, q] == 2.0 and np.isnan(m.rate[1, q])
    assert m.count[0, q] == 2 and m.count[1, kv] == 0


def test_cluster_rows_count_fresh_instances_only():
    m = _m(3, levels={Signal.QUEUE_LENGTH: [1, 2, 50], Signal.CAPACITY_TPS: [1000, 1000, 1000]},
           rates={Signal.PREFILL_COMPUTED: [100.0, 300.0, 900.0]})
    s = _run(m, newest=np.array([(NOW - 1) * 1000, (NOW - 1) * 1000, (NOW - 60) * 1000]))
    (row,) = cluster_signals(np.zeros(3, np.int64), [("c", "m")], s, np.arange(3), P, CFG.default_tokens_per_request)
    assert row["instances"] == 2 and row["stale_instances"] == 1
    assert row["queue_length"] == 3.0 and row["service_rate_tokens_per_second"] == 2000.0
    assert row["utilization"] == pytest.approx(s.arrival[:2].sum() / 2000.0)
    assert row["min_instance_price"] == pytest.approx(min(s.price[:2])) and row["max_instance_price"] == pytest.approx(max(s.price[:2]))
