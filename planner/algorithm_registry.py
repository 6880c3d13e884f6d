"""The summary algorithms: one table entry each (``ALGORITHMS``); their stores implement ``PaneStore``
(``planner/pane_store.py``).

An entry says everything the rest of the planner asks of an algorithm, so no module compares
algorithm names or probes a store with ``hasattr``:

* ``exact``: answers equal the raw path within 1e-9 relative. Only exact algorithms serve by default;
  the others serve only when approximation is allowed (``planner.approximate`` or ``approx=true``).
* ``scope``: ``"metric"`` -- one SDS per metric serves every matcher subset (a payload per series); or
  ``"fixed"`` -- the SDS holds one payload per group / item of a fixed scope and grouping, so a selector
  must match its scope exactly.
* ``order_independent``: a late sample folds into its pane as it is (sketches, group sums); otherwise
  the panes it touches are rebuilt from raw storage (``planner/late_samples.py``).
* ``make_store(spec)``: the pane store; ``bound(sds, phi)``: the stated error, in words, for infos and
  ``plan list``; ``bytes_per_pane`` / ``window_cost_s``: the cost model's a-priori figures until measured;
  ``canary``: how the canary compares a served answer with raw (``exact`` within 1e-9, quantile ``rank``
  error / value interval, ``relative`` count error); ``min_series``: the ``PlannerConfig`` field with the
  scope size from which the planner adopts it; ``serves(store, func)``: whether a store of it can answer
  ``func`` (an exact store keeps only the pane fields of the functions its plan was adopted for);
``rank_error`` / ``relative_error``: the stated error the canary checks (sketches); ``adopt_params``:
the parameters a plan of it is adopted with; ``payload_rounding``: the relative rounding of stored
values around their series' shift (REQ keeps float32: 2^-24, stated as 2^-23 for safety);
``serves_phi(sds, phi)``: a quantile sketch's literal phi range (REQ: its tail); ``selects_fields``: the
store keeps only the pane fields of its plan's functions (exact panes); ``may_decline``: its scan may
decline a query (frequent items prove top-k sets only), so inner sub-trees keep their own plans;
``window_sums``: the store keeps running sums over its panes (``planner/pane_prefix.py``), so a
window's cost does not grow with the panes in it, and a plan may take finer panes (smaller raw edges).

A new algorithm is one store module plus one entry here (and its rule in ``planner/rewrite_rules.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


from planner.distinct_store import DEFAULT_LG_K, CPCPaneStore, rse
from planner.exact_store import ExactPaneStore
from planner.group_store import GroupPaneStore
from planner.pane_prefix import bytes_per_pane as prefix_bytes_per_pane
from planner.pane_store import PaneStore
from planner.kll_store import DEFAULT_K, REQ_DEFAULT_K, KLLPaneStore, rank_error, req_rank_error
from planner.served_functions import SERVED
from planner.topk_store import DEFAULT_LG_MAX, TopKPaneStore, epsilon_for


@dataclass(frozen=True)
class Algorithm:
    name: str
    exact: bool
    scope: str  # "metric" | "fixed"
    order_independent: bool
    make_store: Callable[[Any], PaneStore]
    bound: Callable[[Any, float | None], str]
    bytes_per_pane: int
    window_cost_s: float
    canary: str  # how the canary compares with raw: "exact" (1e-9), "rank" (rank error), "relative" (count error)
    min_series: str | None = None
    serves: Callable[[Any, str], bool] = lambda store, func: True
    rank_error: Callable[[Any, float], float] | None = None  # (store, phi): stated normalized rank error (quantile sketches)
    relative_error: Callable[[Any], float] | None = None  # (store): stated relative count error (cpc, fi)
    adopt_params: Callable[[Any], tuple] = lambda config: ()  # (PlannerConfig): the spec's params when adopted
    payload_rounding: float = 0.0  # relative rounding of stored values around their series' shift (REQ: float32)
    serves_phi: Callable[[Any, float], bool] = lambda sds, phi: True  # quantile sketches: which literal phi it answers
    selects_fields: bool = False  # the store keeps only the pane fields of the functions its plan serves
    may_decline: bool = False  # its scan may decline a query (raw then): the inner sub-trees keep their own plans
    window_sums: bool = False  # running sums over the panes: a window costs the same whatever panes it holds


def exact_fields(spec: Any) -> tuple[str, ...] | None:
    """The pane fields an exact SDS keeps (its ``fields`` parameter, comma-separated), or None for all
    (pinned plans and plans persisted before fields were chosen)."""
    f = spec.param("fields", None)
    return None if not f else tuple(x for x in str(f).split(",") if x)


def _exact_serves(store: Any, func: str) -> bool:
    f = SERVED.get(func)
    return f is not None and f.family == "exact" and store.covers(f.needs)


def _grouping(spec: Any, what: str) -> tuple[str, ...]:
    if not spec.grouping:
        raise ValueError(f"a {spec.algorithm} SDS needs the labels {what}")
    return spec.grouping


def _kll_bound(sds: Any, phi: float | None) -> str:
    return f"rank error <= {rank_error(sds.store.k):.4f} (99% confidence)"


def _req_bound(sds: Any, phi: float | None) -> str:
    p = sds.min_phi if phi is None else phi
    k = sds.store.k
    return (f"rank error <= {req_rank_error(k, p):.2e} for phi >= {p:g} (REQ k={k}, high-rank accuracy, 3 sd ~ 99.7%; "
            f"{req_rank_error(k, 0.5) * 2:.4f}*(1-phi) for phi >= 0.5); value within |v - c| * 2^-24 of a sample (float32)")


def _fi_bound(sds: Any, phi: float | None) -> str:
    return (f"top-k set proven from the frequent-items bounds (else raw); counts exact while every item is tracked, "
            f"else within +-offset <= {epsilon_for(sds.store.lg_max):.2%} of the window's samples (lg_max={sds.store.lg_max})")


def _cpc_bound(sds: Any, phi: float | None) -> str:
    r = rse(sds.store.lg_k)
    return f"distinct count relative error <= {2 * r:.2%} (95%), <= {3 * r:.2%} (99.7%) (CPC lg_k={sds.store.lg_k}, RSE {r:.2%})"


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("exact", exact=True, scope="metric", order_independent=False,
              make_store=lambda spec: ExactPaneStore(spec.pane_ms, exact_fields(spec)), bound=lambda sds, phi: "exact",
              bytes_per_pane=15 * 8 + 3 * 8 + prefix_bytes_per_pane(None), window_cost_s=0.2e-6, canary="exact", serves=_exact_serves,
              selects_fields=True, window_sums=True),
    Algorithm("group", exact=True, scope="fixed", order_independent=True,
              make_store=lambda spec: GroupPaneStore(spec.pane_ms, spec.grouping),
              bound=lambda sds, phi: f"exact (cross-series panes per group of {', '.join(sds.spec.grouping)})",
              bytes_per_pane=7 * 8, window_cost_s=0.2e-6, canary="exact", min_series="group_min_series"),
    Algorithm("kll", exact=False, scope="metric", order_independent=True,
              make_store=lambda spec: KLLPaneStore(spec.pane_ms, int(spec.param("k", DEFAULT_K))),
              bound=_kll_bound, bytes_per_pane=600, window_cost_s=25e-6, canary="rank",
              rank_error=lambda store, phi: rank_error(store.k), adopt_params=lambda config: (("k", DEFAULT_K),)),
    Algorithm("req", exact=False, scope="metric", order_independent=True,
              make_store=lambda spec: KLLPaneStore(spec.pane_ms, int(spec.param("k", REQ_DEFAULT_K)), kind="req"),
              bound=_req_bound, bytes_per_pane=400, window_cost_s=25e-6, canary="rank",
              rank_error=lambda store, phi: req_rank_error(store.k, phi), payload_rounding=2.0 ** -23,
              serves_phi=lambda sds, phi: sds.min_phi <= phi <= 1.0,
              adopt_params=lambda config: (("k", REQ_DEFAULT_K), ("min_phi", config.req_min_phi))),
    Algorithm("cpc", exact=False, scope="fixed", order_independent=True,
              make_store=lambda spec: CPCPaneStore(spec.pane_ms, _grouping(spec, "whose distinct values it counts"),
                                                   int(spec.param("lg_k", DEFAULT_LG_K))),
              bound=_cpc_bound, bytes_per_pane=1200, window_cost_s=20e-6, canary="relative", min_series="cpc_min_series",
              relative_error=lambda store: 3 * rse(store.lg_k)),
    Algorithm("fi", exact=False, scope="fixed", order_independent=True,
              make_store=lambda spec: TopKPaneStore(spec.pane_ms, _grouping(spec, "whose tuples it ranks"),
                                                    int(spec.param("lg_max", DEFAULT_LG_MAX))),
              bound=_fi_bound, bytes_per_pane=4000, window_cost_s=30e-6, canary="relative", min_series="fi_min_series",
              relative_error=lambda store: epsilon_for(store.lg_max), may_decline=True),
)}


def algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown SDS algorithm {name!r} (known: {', '.join(ALGORITHMS)})") from None


def is_exact(name: str) -> bool:
    return algorithm(name).exact


def allowed(name: str, approximate: bool) -> bool:
    """May an SDS of this algorithm answer a query? Exact ones always; the others only when
    approximation is allowed for the query (operator config or ``approx=true``)."""
    a = ALGORITHMS.get(name)
    return a is not None and (a.exact or approximate)
