"""The rewrite's rules: one table (``RULES``), each rule a pure decision plus the scan that serves it.

A rule looks at one AST node. ``decide(node, ectx, rctx)`` returns ``None`` when the node is not of
its shape, else a ``Decision``: served from a summary, or raw with the reason why (approximation off,
no plan covers it, the shadow runs measured this shape slower, this shape is still being
measured (answered raw while the summary path runs beside it), no whole covered pane in any window,
the cost check). Deciding reads the catalog and the SDS's coverage and measurements; it changes no
answer and no measurement (a coverage read may fold the summarizer's queued samples, as every read
does, and the window plan is kept for the scan that follows). ``serve(decision, node, ectx)`` then
scans the summary; it may still decline (a top-k set that the frequent-items bounds do not prove)
and the node is evaluated raw.

The hook (``planner/rewrite.py``) offers a node to the rules of its kind in table order and serves the
first served decision; ``Planner.explain`` calls the same ``decide`` for every node of a query, so
what it prints is what the hook does. An evaluation context whose ``step_times`` is None (``plan
explain`` without a time) asks only whether a summary may and can serve the node, not whether it pays
for particular windows.

Each rule also names the sub-trees the planner may adopt a plan for (``candidate``: the node as an
SDS key, or None), so ``candidates(query)`` -- what the planner learns from the query log -- and the
rewrite agree on which shapes an algorithm serves.

Order matters only between rules of the same node kind: ``req`` before ``kll`` (a tail quantile from
the more accurate sketch when both exist); ``topk`` before ``group`` before ``distinct``. A new
algorithm's rule is one entry here (its store and scan in their own modules, its properties in
``planner/algorithm_registry.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from planner.algorithm_registry import ALGORITHMS, allowed
from planner.group_scan import scan_group
from planner.normalize import Candidate, distinct_shape, group_shape, literal_number, servable_call, topk_shape
from planner.sds import SDS, shape_of
from planner.served_functions import REQ_MIN_PHI, SERVED, algorithm_for
from planner.sketch_scans import scan_distinct, scan_topk
from planner.summary_scan import ScanResult, cached_mask, scan_exact, scan_kll, window_plan
from planner.window import WindowPlan, plan_windows
from promql.ast_walk import children
from promql.eval_context import SeriesScope
from promql.eval_selectors import duration_ms, effective_times, to_matchers
from promql.query_guard import parse as guarded_parse
from promql.types import VectorSteps
from storage.matchers import Matcher

MAX_EDGE_FRACTION = 0.35  # the summary path pays when its raw edges are at most this share of raw's span


class RewriteContext:
    """What rules read: the catalog lookups (per-series SDSs; fixed-scope ones by scope and grouping),
    the served-answer callback (the canary) and the policy."""

    def __init__(self, find_sds: Callable[..., SDS | None], on_served: Callable[[Any, Any], None] | None = None,
                 cost_based: bool = True, approximate: bool = False,
                 find_group: Callable[..., SDS | None] | None = None,
                 on_trial: Callable[..., None] | None = None, measure_first: bool | None = None,
                 trial_busy: Callable[[str, tuple], bool] | None = None):
        self.find_sds = find_sds  # (metric, algorithm, matchers, func) -> SDS
        self.find_group = find_group  # (metric, matchers, labels, algorithm) -> SDS of a fixed scope
        self.on_served = on_served
        self.cost_based = cost_based  # False: serve from the summary whenever it covers (tests)
        self.approximate = approximate  # for queries that do not say (``with_policy`` sets it per query)
        # (rule, decision, node, ectx, raw value, raw wall s, raw CPU s): measure the summary path of a
        # sub-tree just answered raw (the canary's ``trial``)
        self.on_trial = on_trial
        # (sds id, shape) -> whether ``on_trial`` would turn a new measuring run away now (one is in
        # flight for that shape, or as many as it runs at once): the canary's ``busy``
        self.trial_busy = trial_busy
        # shapes of use without a verdict are answered raw while the summary is measured beside them
        # (``SDSStats.measuring``); None: whenever there is someone to measure (``on_trial``)
        self.measure_first = (on_trial is not None) if measure_first is None else measure_first

    def may_use(self, algorithm: str, ectx: Any) -> bool:
        """Whether ``algorithm`` may answer in this query (exact ones always, others when approximation
        is allowed for it)."""
        return allowed(algorithm, bool(ectx.extra.get("approx", self.approximate)))


@dataclass
class Decision:
    """A rule's verdict on one node. ``served`` False carries ``why``; ``fill``: raw, and the raw
    answer's sealed steps may fill the exact SDS's step cache (the cost check chose raw)."""

    rule: str
    algorithm: str
    func: str
    metric: str
    range_ms: int
    served: bool = False
    why: str = ""
    sds: SDS | None = None
    matchers: list[Matcher] = field(default_factory=list)
    ends: np.ndarray | None = None
    plan: WindowPlan | None = None
    phi: float | None = None
    shape: tuple = ()  # rule-specific: (op, by) of a group aggregate, (k, items) of top-k, items of distinct
    fill: bool = False
    trial: bool = False  # raw while the summary path of this shape of use is measured beside it

    def raw(self, why: str, **kw: Any) -> "Decision":
        self.served, self.why = False, why
        for k, v in kw.items():
            setattr(self, k, v)
        return self


@dataclass
class Served:
    sds: SDS
    func: str
    value: VectorSteps
    scan: ScanResult
    node: Any
    ends: np.ndarray
    range_ms: int
    phi: float | None
    wall_s: float = 0.0  # what answering the sub-tree from the summary cost (measured in the hook)
    cpu_s: float = 0.0


@dataclass(frozen=True)
class Rule:
    name: str
    node_kind: str  # "Call" | "AggregateExpr": the nodes the hook offers it
    algorithm: str
    decide: Callable[[Any, Any, RewriteContext], Decision | None]
    serve: Callable[[Decision, Any, Any], Served | None]  # (decision, node, ectx)
    candidate: Callable[[Any, float], Candidate | None]  # (node, req_min_phi): the SDS key it would use


# --- shared checks ------------------------------------------------------------------------------
WHY_APPROX = "approximation off: sketch answers need planner.approximate or approx=true"
WHY_NO_SDS = "no plan covers it"
WHY_SLOWER = "shadow runs of this shape measured the summary slower than the raw path"
WHY_IMPRECISE = ("the summary's moment sums could not answer this shape within the exactness bound lately "
                 "(values near the float range, or far from the series' first value for a variance)")
WHY_MEASURING = ("measuring: this shape of use is answered raw until the summary path, run beside it, has been "
                 "measured faster than raw")
WHY_NO_PANE = "no whole covered pane inside any window"
WHY_SCOPED = ("the evaluation sees only some of the stored series (a cluster ingester's asked partitions) and "
              "this summary holds one payload for all of them")


def edge_fraction(plan: WindowPlan) -> float:
    """Share of the raw path's time span that the summary path still reads raw (union of edges)."""
    span = int(plan.end.max() - plan.start.min()) if len(plan.end) else 0
    if span <= 0:
        return 1.0
    return plan.raw_span() / span


def worth_it(func: str, plan: WindowPlan, range_ms: int, pane_ms: int) -> bool:
    """Cost-based choice between the summary and the raw path for one sub-tree: window-heavy functions
    over ranges of four panes or more, else raw edges at most ``MAX_EDGE_FRACTION`` of raw's span."""
    if SERVED[func].window_heavy and range_ms >= 4 * pane_ms:
        return True
    return edge_fraction(plan) <= MAX_EDGE_FRACTION


def worth_it_cached(sds: SDS, matchers: list[Matcher], func: str, ends: np.ndarray, range_ms: int,
                    plan: WindowPlan, scope: SeriesScope | None, coverage: tuple[int, int]) -> bool:
    """The cost check for a refresh: only the steps the exact SDS's step cache does not hold are
    computed, so compare their raw edges (not the whole query's) with the raw path's span."""
    if len(ends) < 2 or not sds.algorithm.exact or sds.algorithm.scope != "metric":
        return False
    lo, hi = coverage
    hit = cached_mask(sds, matchers, func, ends, range_ms, scope, cov_lo=lo)
    if not hit.any():
        return False
    rest = window_plan(sds, matchers, ends[~hit], range_ms, lo, hi, scope)
    span = int(plan.end.max() - plan.start.min()) if len(plan.end) else 0
    return rest.raw_span() <= MAX_EDGE_FRACTION * max(span, 1)


def cost_why(d: Decision) -> str:
    pct = edge_fraction(d.plan) if d.plan is not None else 1.0
    return f"cost check: raw edges would cover {pct:.0%} of the raw path's span and {d.func} is cheap on raw"


def _judge_windows(d: Decision, ectx: Any, rctx: RewriteContext, vs: Any, *, per_series: bool,
                   cost_check: bool) -> Decision:
    """The window part of a decision: measured verdict, whole covered panes, and (``cost_check``) the
    raw edges' share. Skipped (served as far as coverage goes) when ``ectx.step_times`` is None."""
    if ectx.step_times is None:
        d.served = True
        return d
    sds = d.sds
    d.ends = effective_times(vs, ectx)
    shape = shape_of(d.func, d.range_ms, len(d.ends))
    if sds.stats.refused(shape):
        return d.raw(WHY_IMPRECISE)
    if rctx.cost_based and sds.stats.verdict(shape) == "slower":
        return d.raw(WHY_SLOWER)
    measuring = rctx.measure_first and rctx.cost_based and sds.stats.measuring(shape)
    if measuring and rctx.trial_busy is not None and rctx.trial_busy(sds.id, shape):
        # that shape's measuring run is in flight: a query of it now is plain raw, before the windows are
        # planned. The hook's own timed raw evaluation would be turned away by the canary anyway, and a
        # client repeating the query back to back (a poller, a one-off grid per request) paid both on
        # every query (+0.5-1.4 ms on 1-5 ms queries, bench/planner_overhead.py --defaults)
        return d.raw(WHY_MEASURING)
    lo, hi = sds.coverage()
    d.plan = window_plan(sds, d.matchers, d.ends, d.range_ms, lo, hi, ectx.series_scope) if per_series else \
        plan_windows(d.ends, d.range_ms, sds.spec.pane_ms, lo, hi)
    if d.plan.summary_panes == 0:
        return d.raw(WHY_NO_PANE)  # no whole covered pane in any window: raw is as cheap
    if cost_check and rctx.cost_based and not worth_it(d.func, d.plan, d.range_ms, sds.spec.pane_ms):
        # a refresh whose steps mostly come from the step cache pays even when the edges are wide
        if not (per_series and worth_it_cached(sds, d.matchers, d.func, d.ends, d.range_ms, d.plan, ectx.series_scope,
                                               (lo, hi))):
            return d.raw(cost_why(d), fill=per_series and sds.algorithm.exact)
    if measuring:
        return d.raw(WHY_MEASURING, trial=True)
    d.served = True
    return d


def _vector(func: str, r: ScanResult) -> VectorSteps:
    vals = np.where(r.present, r.values, 0.0)
    dn = np.zeros(len(r.labels), bool) if SERVED[func].keeps_name else np.ones(len(r.labels), bool)
    return VectorSteps(r.labels, vals, r.present, drop_name=dn)


# --- per-series rules (calls) -------------------------------------------------------------------
def _decide_call(rule: str, algorithm: str, family: str) -> Callable[[Any, Any, RewriteContext], Decision | None]:
    def decide(node: Any, ectx: Any, rctx: RewriteContext) -> Decision | None:
        hit = servable_call(node)
        if hit is None:
            return None
        func, ms, param = hit
        if SERVED[func].family != family:
            return None
        phi = None
        if family == "quantile":
            phi = literal_number(param)
            if phi is None:
                return None  # a computed phi: no sketch answers it
        vs = ms.vector_selector
        d = Decision(rule, algorithm, func, vs.name, duration_ms(ms.range), phi=phi, matchers=to_matchers(vs)[0])
        if not rctx.may_use(algorithm, ectx):
            return d.raw(WHY_APPROX)
        d.sds = rctx.find_sds(vs.name, algorithm, d.matchers, func)
        if d.sds is None:
            return d.raw(WHY_NO_SDS)
        if not d.sds.algorithm.serves_phi(d.sds, phi):
            return d.raw(f"phi {phi:g} is outside the phi range of {d.sds.id}")
        if d.range_ms <= 0:
            return d.raw("the range is not positive")
        return _judge_windows(d, ectx, rctx, vs, per_series=True, cost_check=True)
    return decide


def _serve_exact(d: Decision, node: Any, ectx: Any) -> Served | None:
    scan = scan_exact(d.sds, ectx.source, d.matchers, d.func, d.ends, d.range_ms, ectx.series_scope)
    if scan is None:  # not within the exactness bound: raw, and raw for this shape a while
        d.sds.stats.refuse(shape_of(d.func, d.range_ms, len(d.ends)))
        return None
    return Served(d.sds, d.func, _vector(d.func, scan), scan, node, d.ends, d.range_ms, None)


def _serve_quantile(d: Decision, node: Any, ectx: Any) -> Served:
    scan = scan_kll(d.sds, ectx.source, d.matchers, d.phi, d.ends, d.range_ms, ectx.series_scope)
    return Served(d.sds, d.func, _vector(d.func, scan), scan, node, d.ends, d.range_ms, d.phi)


# --- fixed-scope rules (aggregates) -------------------------------------------------------------
def _decide_fixed(rule: str, algorithm: str, shape_of_node: Callable[[Any], tuple | None],
                  labels_of: Callable[[tuple], tuple[str, ...]], *,
                  cost_check: bool) -> Callable[[Any, Any, RewriteContext], Decision | None]:
    """An aggregate of ``func(sel[r])`` answered by an SDS whose scope is the selector's matchers
    (``cost_check``: weigh the raw edges' share as for per-series panes; the distinct and top-k rules
    skip it: their plans exist only for scopes of ``cpc_min_series`` / ``fi_min_series`` series and
    more, and the shadow runs' verdict still sends a shape measured slower to raw)."""
    def decide(node: Any, ectx: Any, rctx: RewriteContext) -> Decision | None:
        if rctx.find_group is None:
            return None
        shape = shape_of_node(node)
        if shape is None:
            return None
        func, ms = shape[-2], shape[-1]
        vs = ms.vector_selector
        d = Decision(rule, algorithm, func, vs.name, duration_ms(ms.range), matchers=to_matchers(vs)[0],
                     shape=tuple(shape[:-2]))
        if not rctx.may_use(algorithm, ectx):
            return d.raw(WHY_APPROX)
        if ectx.series_scope is not None:
            return d.raw(WHY_SCOPED)
        labels = labels_of(shape)
        d.sds = rctx.find_group(vs.name, d.matchers, labels, algorithm)
        if d.sds is None:
            return d.raw(WHY_NO_SDS)
        if d.range_ms <= 0:
            return d.raw("the range is not positive")
        return _judge_windows(d, ectx, rctx, vs, per_series=False, cost_check=cost_check)
    return decide


def _serve_group(d: Decision, node: Any, ectx: Any) -> Served | None:
    op, by = d.shape
    scan = scan_group(d.sds, ectx.source, d.matchers, op, d.func, by, d.ends, d.range_ms)
    if scan is None:  # not within the exactness bound: raw, and raw for this shape a while
        d.sds.stats.refuse(shape_of(d.func, d.range_ms, len(d.ends)))
        return None
    val = VectorSteps(scan.labels, np.where(scan.present, scan.values, 0.0), scan.present, drop_name=np.zeros(len(scan.labels), bool))
    return Served(d.sds, d.func, val, scan, node, d.ends, d.range_ms, None)


def _serve_distinct(d: Decision, node: Any, ectx: Any) -> Served:
    scan = scan_distinct(d.sds, ectx.source, d.matchers, d.ends, d.range_ms)
    val = VectorSteps(scan.labels, np.where(scan.present, scan.values, 0.0), scan.present, drop_name=np.zeros(1, bool))
    if not scan.present.any():
        val = VectorSteps.empty(len(d.ends))
    return Served(d.sds, d.func, val, scan, node, d.ends, d.range_ms, None)


def _serve_topk(d: Decision, node: Any, ectx: Any) -> Served | None:
    k, _ = d.shape
    scan = scan_topk(d.sds, ectx.source, d.matchers, k, d.ends, d.range_ms)
    if scan is None:
        return None  # some step's top-k set is not provable from the sketch bounds: raw
    val = VectorSteps(scan.labels, np.where(scan.present, scan.values, 0.0), scan.present, drop_name=np.zeros(len(scan.labels), bool))
    return Served(d.sds, "topk", val, scan, node, d.ends, d.range_ms, None)


def _scope(vs: Any) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((m.name, m.op, m.value) for m in to_matchers(vs)[0] if m.name != "__name__"))


def _call_candidate(algorithm: str) -> Callable[[Any, float], Candidate | None]:
    """A servable call whose function (and literal phi, for quantiles: REQ at or above req_min_phi,
    KLL otherwise) the planner would give ``algorithm``."""
    def candidate(node: Any, req_min_phi: float) -> Candidate | None:
        hit = servable_call(node)
        if hit is None:
            return None
        func, ms, param = hit
        phi = literal_number(param) if param is not None else None
        if algorithm_for(func, phi, req_min_phi) != algorithm:
            return None
        vs = ms.vector_selector
        return Candidate(vs.name, _scope(vs), algorithm, func, duration_ms(ms.range))
    return candidate


def _fixed_candidate(algorithm: str, shape_of_node: Callable[[Any], tuple | None],
                     labels_of: Callable[[tuple], tuple[str, ...]]) -> Callable[[Any, float], Candidate | None]:
    """An aggregate of ``func(sel[r])`` a fixed-scope SDS of ``algorithm`` would answer (the inner call
    stays a candidate of its own: per-series panes serve it exactly, and the planner prefers the
    fixed scope only at high cardinality, ``planner.*_min_series``)."""
    def candidate(node: Any, req_min_phi: float) -> Candidate | None:
        shape = shape_of_node(node)
        if shape is None:
            return None
        func, ms = shape[-2], shape[-1]
        vs = ms.vector_selector
        labels = labels_of(shape)
        grouping = tuple(sorted(set(labels))) if ALGORITHMS[algorithm].exact else tuple(labels)
        return Candidate(vs.name, _scope(vs), algorithm, func, duration_ms(ms.range), grouping)
    return candidate


RULES: tuple[Rule, ...] = (
    Rule("exact", "Call", "exact", _decide_call("exact", "exact", "exact"), _serve_exact, _call_candidate("exact")),
    Rule("req", "Call", "req", _decide_call("req", "req", "quantile"), _serve_quantile, _call_candidate("req")),
    Rule("kll", "Call", "kll", _decide_call("kll", "kll", "quantile"), _serve_quantile, _call_candidate("kll")),
    Rule("topk", "AggregateExpr", "fi", _decide_fixed("topk", "fi", topk_shape, lambda s: s[1], cost_check=False),
         _serve_topk, _fixed_candidate("fi", topk_shape, lambda s: s[1])),
    Rule("group", "AggregateExpr", "group", _decide_fixed("group", "group", group_shape, lambda s: s[1], cost_check=True),
         _serve_group, _fixed_candidate("group", group_shape, lambda s: s[1])),
    Rule("distinct", "AggregateExpr", "cpc", _decide_fixed("distinct", "cpc", distinct_shape, lambda s: s[0], cost_check=False),
         _serve_distinct, _fixed_candidate("cpc", distinct_shape, lambda s: s[0])),
)


def candidates(query_or_node: Any, req_min_phi: float = REQ_MIN_PHI) -> list[Candidate]:
    """The sub-trees of a query a plan could serve, in pre-order, as SDS keys: each node offered to the
    rules of its kind; a servable call's own arguments are not searched further."""
    root = guarded_parse(query_or_node) if isinstance(query_or_node, str) else query_or_node
    out: list[Candidate] = []
    stack = [root]
    while stack:
        node = stack.pop()
        found = [c for c in (r.candidate(node, req_min_phi) for r in _BY_KIND.get(type(node).__name__, ())) if c is not None]
        out.extend(found)
        if found and type(node).__name__ == "Call":
            continue
        stack.extend(reversed(children(node)))
    return out


def rules_for(kind: str, rules: tuple[Rule, ...] = RULES) -> tuple[Rule, ...]:
    return tuple(r for r in rules if r.node_kind == kind)


_BY_KIND = {kind: rules_for(kind) for kind in ("Call", "AggregateExpr")}
