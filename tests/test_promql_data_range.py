"""promql/data_range.py: the stored time range a query reads, as Prometheus's FindMinMaxTime."""
from __future__ import annotations

import pytest

from promql import parser as pp
from promql.data_range import data_range
from promql.parser.durations import resolve

S, E, LB = 10_000_000, 20_000_000, 300_000


@pytest.mark.parametrize("q,want", [
    ("up", (S - LB, E)),
    ("rate(x[5m])", (S - 300_000, E)),
    ("rate(x[5m] offset 1h)", (S - 300_000 - 3_600_000, E - 3_600_000)),
    ("y offset -1m", (S - LB + 60_000, E + 60_000)),
    ("x @ 1000", (1_000_000 - LB, 1_000_000)),
    ("x @ start() + x @ end()", (S - LB, E)),
    ("max_over_time(rate(x[1m])[10m:1m])", (S - 600_000 - 60_000, E)),
    ("max_over_time(x[1h:5m] offset 1d)", (S - 3_600_000 - 86_400_000 - LB, E - 86_400_000)),
    ("max_over_time(x[1h:5m] @ 100)", (100_000 - 3_600_000 - LB, 100_000)),
    ("vector(1) + time()", None),
])
def test_data_range(q: str, want: tuple[int, int] | None) -> None:
    assert data_range(pp.parse(q), S, E, LB) == want


def test_duration_expressions_after_resolution() -> None:
    expr = pp.parse("rate(x[5m+step()])")
    resolve(expr, 60_000, E - S)
    assert data_range(expr, S, E, LB) == (S - 360_000, E)
