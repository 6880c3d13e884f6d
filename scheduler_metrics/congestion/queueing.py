"""The queueing surrogate behind the congestion signals (vectorized over instances).

Model. Each serving instance is treated as one FIFO M/G/1-like server whose *work* is prefill
tokens: work arrives at ``lam`` tokens/s, the server drains it at ``mu`` tokens/s, a request carries
on average ``S`` seconds of service (its computed prompt tokens / ``mu``). Utilization
``rho = lam / mu``.

* Mean wait (Kingman / Pollaczek-Khinchine approximation for G/G/1)::

      Wq = ((ca2 + cs2) / 2) * rho / (1 - rho) * S

  ``ca2``/``cs2`` are the squared coefficients of variation of inter-arrival and service times.
  ``ca2 = cs2 = 1`` gives M/M/1 exactly; ``ca2 = 1`` gives M/G/1 (P-K) exactly; otherwise it is
  Kingman's heavy-traffic approximation.

* Congestion price (the externality of one more token of work). Appending ``d`` tokens to the tail
  of a FIFO queue holding ``V`` seconds of unfinished work delays, by ``d / mu``, every request that
  arrives before the (extended) busy period ends. A busy period started by work ``w`` lasts
  ``w / (1 - rho)`` on average, and ``lam_req`` requests/s arrive meanwhile; with ``w = V + S``
  (what is queued plus the request that carries the token)::

      price = lam_req * (V + S) / (mu * (1 - rho))     # seconds of others' delay per added token

  With an empty queue (``V = 0``) this is ``rho / (mu * (1 - rho))``: near zero with spare capacity,
  rising as ``1/(1-rho)`` toward saturation. ``V`` is the *observed* backlog in seconds where the
  worker reports its backlog, else the steady-state ``Wq`` (equal to the mean unfinished work a
  Poisson arrival sees, by PASTA).

Assumptions and bounds (it is a surrogate, not a latency prediction): one FIFO server per
instance; work-conserving; Poisson-ish arrivals unless ``ca2`` says otherwise; prefill dominates the
wait (decode interference is folded into ``mu``). ``rho`` is clipped to ``rho_max`` (default 0.98)
inside the formulas so the price stays finite and bounded (at most ``1/(1-rho_max)`` = 50x the
light-load value); the unclipped ``rho`` is still reported, and ``rho >= 1`` is flagged saturated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SurrogateParams:
    ca2: float = 1.0  # squared CV of inter-arrival times (1 = Poisson)
    cs2: float = 1.0  # squared CV of service times (1 = exponential)
    rho_max: float = 0.98  # clip for the 1/(1-rho) terms

    def __post_init__(self) -> None:
        if self.ca2 < 0 or self.cs2 < 0:
            raise ValueError("ca2 and cs2 must be >= 0")
        if not 0.0 < self.rho_max < 1.0:
            raise ValueError("rho_max must be in (0, 1)")

    @property
    def name(self) -> str:
        if self.ca2 == 1.0 and self.cs2 == 1.0:
            return "M/M/1"
        if self.ca2 == 1.0:
            return "M/G/1 (Pollaczek-Khinchine)"
        return "G/G/1 (Kingman)"


def _f(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def utilization(lam: np.ndarray | float, mu: np.ndarray | float) -> np.ndarray:
    """``lam / mu``; NaN where ``mu`` is unknown or not positive."""
    lam, mu = _f(lam), _f(mu)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mu > 0, lam / mu, np.nan)


def clipped(rho: np.ndarray | float, p: SurrogateParams) -> np.ndarray:
    return np.clip(_f(rho), 0.0, p.rho_max)


def kingman_wait(rho: np.ndarray | float, mean_service_s: np.ndarray | float, p: SurrogateParams) -> np.ndarray:
    """Mean queueing delay ``((ca2+cs2)/2) * rho/(1-rho) * S`` (seconds), rho clipped to ``rho_max``."""
    r = clipped(rho, p)
    return ((p.ca2 + p.cs2) / 2.0) * r / (1.0 - r) * _f(mean_service_s)


def congestion_price(req_rate: np.ndarray | float, mu: np.ndarray | float, rho: np.ndarray | float,
                     unfinished_s: np.ndarray | float, mean_service_s: np.ndarray | float,
                     p: SurrogateParams) -> np.ndarray:
    """Seconds of delay imposed on later requests per added token: ``lam_req (V + S) / (mu (1 - rho))``."""
    r = clipped(rho, p)
    mu = _f(mu)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = _f(req_rate) * (_f(unfinished_s) + _f(mean_service_s)) / (mu * (1.0 - r))
    return np.where(mu > 0, out, np.nan)


def ewma_alpha(dt_s: np.ndarray | float, tau_s: float) -> np.ndarray:
    """Weight of a new observation after ``dt_s`` seconds for an EWMA with time constant ``tau_s``."""
    return 1.0 - np.exp(-np.maximum(_f(dt_s), 0.0) / tau_s)
