"""The rewrite: a node hook for the engine that answers eligible sub-trees from summaries.

The rewrite pass is a list of small rules (sqlglot style); each rule looks at one AST node and either
returns a summary-served ``Value`` or ``None`` (not mine). The first rule that answers wins; when none
does, the engine evaluates the node on raw data unchanged. ``exact=true`` (``eval_ctx.extra["exact"]``)
disables every rule. Approximate algorithms (``planner/algorithm_registry.py``) answer only when the query
allows approximation (``eval_ctx.extra["approx"]``, set per query by ``with_policy``: the operator's
``planner.approximate`` or the request's ``approx=true``); by default every answer equals the raw path.

Honesty: every summary-served sub-tree appends ``summary:<sds id>`` to ``stats.paths`` and an info
annotation naming the SDS, its algorithm and error bound.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from planner.algorithm_registry import allowed
from planner.normalize import servable_call
from planner.sds import SDS, read_fold_seconds, shape_of
from planner.served_functions import SERVED
from planner.summary_scan import ScanResult, scan_exact, scan_kll, window_plan
from promql.eval_selectors import duration_ms, effective_times, to_matchers
from promql.types import VectorSteps

log = logging.getLogger("turboprom.planner")

_COUNTER_SUFFIXES = ("_total", "_sum", "_count", "_bucket")


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


Rule = Callable[[Any, Any, "RewriteContext"], "Served | None"]


class RewriteContext:
    """What rules need: the catalog lookup and the canary."""

    def __init__(self, find_sds: Callable[[str, str, list, str], SDS | None], on_served: Callable[[Served, Any], None] | None = None,
                 cost_based: bool = True, approximate: bool = False):
        self.find_sds = find_sds
        self.on_served = on_served
        self.cost_based = cost_based  # False: serve from the summary whenever it covers (tests)
        self.approximate = approximate  # for queries that do not say (``with_policy`` sets it per query)

    def may_use(self, algorithm: str, ectx: Any) -> bool:
        """Whether ``algorithm`` may answer in this query (exact ones always, others when approximation
        is allowed for it)."""
        return allowed(algorithm, bool(ectx.extra.get("approx", self.approximate)))


def _number(node: Any) -> float | None:
    k = type(node).__name__
    if k == "NumberLiteral":
        return float(node.val)
    if k == "ParenExpr":
        return _number(node.expr)
    if k == "UnaryExpr":
        v = _number(node.expr)
        return None if v is None else -v
    return None


def _prepare(node: Any, ectx: Any, rctx: RewriteContext, algorithm: str) -> tuple | None:
    prep, _ = prepare_or_why(node, ectx, rctx, algorithm)
    return prep


def prepare_or_why(node: Any, ectx: Any, rctx: RewriteContext, algorithm: str) -> tuple[tuple | None, str]:
    """(func, ms, param, matchers, sds, range_ms, ends) when the summary path serves ``node``, else
    (None, why): the reason ``plan explain`` and the hook's fall-back see ("cost": the raw path was
    judged cheaper for these windows, and ``rule_exact`` then lets the raw answer fill the step cache)."""
    if not rctx.may_use(algorithm, ectx):
        return None, "approximation off"
    hit = servable_call(node)
    if hit is None:
        return None, "shape"
    func, ms, param = hit
    vs = ms.vector_selector
    matchers = to_matchers(vs)[0]
    sds = rctx.find_sds(vs.name, algorithm, matchers, func)
    if sds is None:
        return None, "no sds"
    range_ms = duration_ms(ms.range)
    if range_ms <= 0:
        return None, "range"
    ends = effective_times(vs, ectx)
    # first the cheap check: shadow runs of this shape found the raw path faster
    if rctx.cost_based and sds.stats.verdict(shape_of(func, range_ms, len(ends))) == "slower":
        return None, "measured slower"
    lo, hi = sds.coverage()
    plan = window_plan(sds, matchers, ends, range_ms, lo, hi)
    if plan.summary_panes == 0:
        return None, "no pane"  # no whole covered pane in any window: raw is as cheap
    if rctx.cost_based and not worth_it(func, plan, range_ms, sds.spec.pane_ms):
        # a refresh whose steps mostly come from the step cache pays even when the edges are wide
        if not worth_it_cached(sds, matchers, func, ends, range_ms, plan):
            return None, "cost"
    return (func, ms, param, matchers, sds, range_ms, ends), ""


def worth_it_cached(sds: SDS, matchers: list, func: str, ends: np.ndarray, range_ms: int, plan: Any) -> bool:
    """The cost check for a refresh: only the steps the step cache does not hold are computed, so
    compare their raw edges (not the whole query's) with the raw path's span."""
    if len(ends) < 2 or sds.spec.algorithm != "exact":
        return False
    from planner.summary_scan import cached_mask

    hit = cached_mask(sds, matchers, func, ends, range_ms)
    if not hit.any():
        return False
    lo, hi = sds.coverage()
    rest = window_plan(sds, matchers, ends[~hit], range_ms, lo, hi)
    span = int(plan.end.max() - plan.start.min()) if len(plan.end) else 0
    return edge_span(rest) <= MAX_EDGE_FRACTION * max(span, 1)


MAX_EDGE_FRACTION = 0.35


def edge_span(plan: Any) -> int:
    """Milliseconds of raw data the summary path reads for ``plan`` (union of its edges)."""
    iv = plan.raw_intervals()
    if len(iv) == 0:
        return 0
    from planner.window import merge_intervals

    return int(sum(b - a + 1 for a, b in merge_intervals(iv, max_reads=len(iv))))


def edge_fraction(plan: Any) -> float:
    """Share of the raw path's time span that the summary path still reads raw (union of edges)."""
    span = int(plan.end.max() - plan.start.min()) if len(plan.end) else 0
    if span <= 0:
        return 1.0
    return edge_span(plan) / span


def worth_it(func: str, plan: Any, range_ms: int, pane_ms: int) -> bool:
    """Cost-based choice between the summary and the raw path for one sub-tree."""
    if SERVED[func].window_heavy and range_ms >= 4 * pane_ms:
        return True
    return edge_fraction(plan) <= MAX_EDGE_FRACTION


def _vector(func: str, r: ScanResult) -> VectorSteps:
    vals = np.where(r.present, r.values, 0.0)
    dn = np.zeros(len(r.labels), bool) if SERVED[func].keeps_name else np.ones(len(r.labels), bool)
    return VectorSteps(r.labels, vals, r.present, drop_name=dn)


def rule_exact(node: Any, ectx: Any, rctx: RewriteContext) -> Served | None:
    """sum/count/avg/min/max/stddev/stdvar/last/first/present_over_time, rate/increase/delta/resets/changes."""
    prep, why = prepare_or_why(node, ectx, rctx, "exact")
    if why == "cost":
        ectx.extra[_FILL_KEY] = id(node)  # the hook may keep the raw answer's sealed steps
    if prep is None or prep[0] == "quantile_over_time":
        return None
    func, ms, _, matchers, sds, range_ms, ends = prep
    scan = scan_exact(sds, ectx.source, matchers, func, ends, range_ms)
    return Served(sds, func, _vector(func, scan), scan, node, ends, range_ms, None)


def rule_kll(node: Any, ectx: Any, rctx: RewriteContext) -> Served | None:
    """quantile_over_time(φ, sel[r]) with a literal φ."""
    prep = _prepare(node, ectx, rctx, "kll")
    if prep is None or prep[0] != "quantile_over_time":
        return None
    func, ms, param, matchers, sds, range_ms, ends = prep
    phi = _number(param)
    if phi is None:
        return None
    scan = scan_kll(sds, ectx.source, matchers, phi, ends, range_ms)
    return Served(sds, func, _vector(func, scan), scan, node, ends, range_ms, phi)


RULES: list[Rule] = [rule_exact, rule_kll]


def with_policy(hook: Callable[[Any, Any], Any], approximate: bool) -> Callable[[Any, Any], Any]:
    """``hook`` for one query: approximate algorithms may answer only when ``approximate``."""
    def bound(node: Any, ectx: Any) -> Any:
        ectx.extra.setdefault("approx", approximate)
        return hook(node, ectx)
    return bound


def timed(answer: Callable[[], "Served | None"]) -> "Served | None":
    """``answer()``, with what serving it from the summary cost (wall and CPU seconds) set on the result:
    the shadow runs weigh this against the raw path. Folds of samples that arrived before the read
    (``read_fold_seconds``) are summarization, already counted as the plan's ingest CPU: left out."""
    (fw0, fc0), w0, c0 = read_fold_seconds(), time.perf_counter(), time.thread_time()
    served = answer()
    if served is not None:
        fw1, fc1 = read_fold_seconds()
        served.wall_s = max(time.perf_counter() - w0 - (fw1 - fw0), 0.0)
        served.cpu_s = max(time.thread_time() - c0 - (fc1 - fc0), 0.0)
    return served


class RewriteHook:
    """``hook(node, eval_ctx) -> Value | None`` for ``Engine.*_query(node_hooks=[...])``."""

    def __init__(self, rctx: RewriteContext, rules: list[Rule] | None = None):
        self.rctx = rctx
        self.rules = list(rules if rules is not None else RULES)

    def __call__(self, node: Any, ectx: Any) -> Any:
        if ectx.extra.get("exact"):
            return None
        if type(node).__name__ != "Call":
            return None
        for rule in self.rules:
            try:
                served = timed(lambda: rule(node, ectx, self.rctx))
            except Exception:  # noqa: BLE001 - a summary problem must never fail the query: go raw
                log.exception("summary rewrite failed; evaluating raw")
                ectx.extra.pop(_FILL_KEY, None)
                return None
            if served is not None:
                ectx.extra.pop(_FILL_KEY, None)
                self._report(served, ectx)
                return served.value
        if ectx.extra.pop(_FILL_KEY, None) == id(node):
            return raw_and_fill(node, ectx, self.rctx)
        return None

    def _report(self, s: Served, ectx: Any) -> None:
        sds = s.sds
        sds.stats.hit(shape_of(s.func, s.range_ms, len(s.ends)))
        sds.stats.last_hit = time.time()
        sds.stats.windows_served += int(s.scan.present.size)
        sds.stats.raw_edge_samples += s.scan.raw_samples
        ectx.stats.samples_scanned += s.scan.raw_samples
        ectx.stats.series_touched += len(s.scan.labels)
        ectx.stats.paths.append(f"summary:{sds.id}")
        cached = s.scan.info.get("cached_steps", 0)
        reuse = (f"; {cached} of {s.scan.info.get('steps', cached)} steps reused from its step cache (sealed panes, "
                 f"unchanged since)") if cached else ""
        ectx.annotations.info(
            f"TurboProm info: {s.func}({sds.metric}[...]) served from summary {sds.id} "
            f"(algorithm {sds.spec.algorithm}, pane {sds.spec.pane_ms // 1000}s, {sds.error_bound(s.phi)}{reuse}"
            f"{value_bound_note(s.scan, s.value)}); pass exact=true for the raw path"
        )
        # an SDS holds one metric: its name decides the info (not a loop over the result's series)
        if s.func in ("rate", "increase") and len(s.value.labels) and not sds.metric.endswith(_COUNTER_SUFFIXES):
            ectx.annotations.info(
                'PromQL info: metric might not be a counter, name does not end in '
                f'_total/_sum/_count/_bucket: "{sds.metric}"'
            )
        if self.rctx.on_served is not None:
            self.rctx.on_served(s, ectx)


def value_bound_note(scan: ScanResult, value: VectorSteps) -> str:
    """The quantile interval in the value's own units: every answer lies in the interval of values its
    window's sketch holds at ranks phi -/+ the stated rank error (``scan_kll``); states the widest."""
    lo, hi = scan.info.get("lo"), scan.info.get("hi")
    if lo is None or hi is None:
        return ""
    p = scan.present & np.isfinite(lo) & np.isfinite(hi)
    if not p.any():
        return ""
    width = (hi - lo)[p]
    with np.errstate(all="ignore"):
        rel = width / np.maximum(np.abs(scan.values[p]), 1e-300)
    i = int(np.argmax(width))
    return (f"; value bound: each value lies in its window's [low, high] interval at ranks phi -/+ that error, "
            f"widest here {float(width[i]):.6g} wide ({float(np.nanmax(rel)):.2%} of its value at most)")


_FILL_KEY = "planner_fill_step_cache"  # rule_exact: cost check said raw; the hook may fill the step cache


def raw_and_fill(node: Any, ectx: Any, rctx: RewriteContext) -> Any:
    """Evaluate ``node`` on raw data (exactly what the engine would do) and keep the answers of its
    sealed steps in the SDS's step cache, so the next refresh of this panel computes only its new steps
    from the summary. The query itself is reported as raw. Range queries only (a refresh repeats steps)."""
    if len(ectx.step_times) < 2 or ectx.subquery_depth:
        return None
    from dataclasses import replace

    from promql.evaluator import Evaluator
    from planner.summary_scan import arm, fill_from_raw

    func, ms, _ = servable_call(node)
    vs = ms.vector_selector
    matchers = to_matchers(vs)[0]
    sds = rctx.find_sds(vs.name, "exact", matchers, func)
    armed = arm(sds) if sds is not None else None  # before the raw read: later writes invalidate
    try:  # annotation positions as the engine gives them (first occurrence of the call in the text)
        from promql.eval_positions import locate_all

        positions = locate_all(node, ectx.query) if ectx.query else {}
    except Exception:  # noqa: BLE001 - positions are best effort, as in the engine
        positions = {}
    val = Evaluator(positions).eval(node, replace(ectx, hooks=()))
    try:
        if armed is not None and isinstance(val, VectorSteps):
            fill_from_raw(sds, matchers, func, effective_times(vs, ectx), duration_ms(ms.range), val, armed)
    except Exception:  # noqa: BLE001 - filling a cache must never fail the query
        log.exception("step cache fill from the raw path failed")
    return val
