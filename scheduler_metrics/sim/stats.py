"""Confidence intervals for the simulator's reports (Student t over seeds: runs have 3-10 seeds, and
scipy is not a dependency for one table of quantiles)."""
from __future__ import annotations

import numpy as np

# Student t quantile t(0.975, df) for df = 1..10 (standard tables).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def ci95(x) -> tuple[float, float]:
    """Mean and half-width of the 95% t interval (NaN half-width for fewer than two values)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return float(x.mean()) if len(x) else float("nan"), float("nan")
    if len(x) > len(T975) + 1:
        raise ValueError(f"ci95 has t quantiles for up to {len(T975) + 1} values, got {len(x)}")
    return float(x.mean()), float(T975[len(x) - 2] * x.std(ddof=1) / np.sqrt(len(x)))
