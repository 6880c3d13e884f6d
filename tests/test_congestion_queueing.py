"""The queueing surrogate against closed forms and a FIFO simulation (Lindley recursion)."""
from __future__ import annotations

import numpy as np
import pytest

from scheduler_metrics.congestion.queueing import (SurrogateParams, congestion_price, ewma_alpha, kingman_wait,
                                                   utilization)

MM1 = SurrogateParams()


def lindley(lam: float, n: int, deterministic_service: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Waits of n FIFO customers (service rate 1), and for each how many later customers share its busy period."""
    rng = np.random.default_rng(seed)
    a = rng.exponential(1 / lam, n)
    s = np.ones(n) if deterministic_service else rng.exponential(1.0, n)
    x = (s[:-1] - a[1:]).tolist()
    w = [0.0] * n
    cur = 0.0
    for i in range(1, n):  # sequential by nature; test-only
        cur = max(cur + x[i - 1], 0.0)
        w[i] = cur
    warr = np.array(w)
    bp = np.cumsum(warr == 0)
    size = np.bincount(bp)
    start = np.r_[0, np.flatnonzero(np.diff(bp)) + 1]
    pos = np.arange(n) - start[bp - 1]
    return warr, size[bp] - 1 - pos


def test_utilization_unknown_mu_is_nan() -> None:
    out = utilization(np.array([1.0, 2.0, 3.0]), np.array([2.0, 0.0, np.nan]))
    assert out[0] == 0.5 and np.isnan(out[1]) and np.isnan(out[2])


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.8, 0.95])
def test_mm1_wait_closed_form(rho: float) -> None:
    # M/M/1 with mean service S: Wq = rho/(1-rho) * S
    assert kingman_wait(rho, 2.0, MM1) == pytest.approx(rho / (1 - rho) * 2.0)


def test_md1_is_half_of_mm1() -> None:
    md1 = SurrogateParams(ca2=1.0, cs2=0.0)
    assert md1.name.startswith("M/G/1")
    assert kingman_wait(0.7, 1.0, md1) == pytest.approx(0.5 * 0.7 / 0.3)


@pytest.mark.parametrize("rho,det", [(0.5, False), (0.8, False), (0.7, True)])
def test_wait_matches_fifo_simulation(rho: float, det: bool) -> None:
    w, _ = lindley(rho, 200_000, det, seed=7)
    p = SurrogateParams(ca2=1.0, cs2=0.0 if det else 1.0)
    assert float(kingman_wait(rho, 1.0, p)) == pytest.approx(w.mean(), rel=0.08)


@pytest.mark.parametrize("rho", [0.5, 0.7, 0.85])
def test_price_matches_simulated_externality(rho: float) -> None:
    """Adding d seconds of work to customer k delays each later customer of k's busy period by d;
    the simulated count per unit work must match lam (Wq + S) / (mu (1 - rho)) with mu = 1."""
    w, later = lindley(rho, 200_000, False, seed=11)
    expected = congestion_price(rho, 1.0, rho, kingman_wait(rho, 1.0, MM1), 1.0, MM1)
    assert float(expected) == pytest.approx(later.mean(), rel=0.12)
    # same with the observed per-customer wait plugged in as V
    per_customer = congestion_price(rho, 1.0, rho, w, 1.0, MM1)
    assert float(per_customer.mean()) == pytest.approx(later.mean(), rel=0.12)


def test_price_empty_queue_closed_form_and_units() -> None:
    # V = 0: price = rho / (mu (1 - rho)) seconds per token; mu in tokens/s
    mu, tpr, rho = 2000.0, 500.0, 0.6
    lam_req = rho * mu / tpr
    price = congestion_price(lam_req, mu, rho, 0.0, tpr / mu, MM1)
    assert float(price) == pytest.approx(rho / (mu * (1 - rho)))


def test_price_small_with_spare_capacity_and_steep_near_saturation() -> None:
    rhos = np.array([0.05, 0.3, 0.5, 0.7, 0.9, 0.95])
    mu, S = 1000.0, 0.5
    lam_req = rhos / S
    price = congestion_price(lam_req, mu, rhos, kingman_wait(rhos, S, MM1), S, MM1)
    assert np.all(np.diff(price) > 0)
    assert price[0] < 0.01 * price[-1]
    assert price[-1] / price[2] > 20  # rho 0.5 -> 0.95: (1/(1-rho))^2 grows 100x


def test_price_bounded_by_rho_max() -> None:
    p = SurrogateParams(rho_max=0.9)
    at_max = congestion_price(1.0, 1.0, 0.9, 0.0, 1.0, p)
    beyond = congestion_price(1.0, 1.0, 3.0, 0.0, 1.0, p)
    assert np.isfinite(beyond) and float(beyond) == pytest.approx(float(at_max))
    assert float(kingman_wait(5.0, 1.0, p)) == pytest.approx(9.0)


def test_price_unknown_mu_is_nan() -> None:
    assert np.isnan(congestion_price(1.0, np.nan, 0.5, 0.0, 1.0, MM1))
    assert np.isnan(congestion_price(1.0, 0.0, 0.5, 0.0, 1.0, MM1))


def test_params_validation() -> None:
    with pytest.raises(ValueError):
        SurrogateParams(rho_max=1.0)
    with pytest.raises(ValueError):
        SurrogateParams(ca2=-1)


def test_ewma_alpha() -> None:
    assert float(ewma_alpha(0.0, 5.0)) == 0.0
    assert float(ewma_alpha(5.0, 5.0)) == pytest.approx(1 - np.exp(-1))
    assert float(ewma_alpha(1e9, 5.0)) == pytest.approx(1.0)
