"""Rewrite rules beyond ``planner/rewrite.py``'s: REQ tail quantiles (a call rule appended to
``planner.rewrite.RULES``) and the aggregate rules for group panes, CPC and frequent items.

* ``rule_req``: ``quantile_over_time(φ, sel[r])`` with a literal ``φ`` in [min_phi, 1] (default 0.9)
  from a REQ SDS (high-rank-accuracy relative-error quantiles): its rank error shrinks with ``1 - φ``,
  e.g. k=20: <= 2.0e-3 at φ=0.9 and 2.0e-4 at φ=0.99 (3 sd), against KLL k=200's 0.0133 everywhere.

* ``rule_group`` (an *aggregate* rule, see ``SketchRewriteHook``): ``sum/max/min by (L)
  (sum/count/max/min_over_time(x{scope}[r]))`` from a ``group`` SDS whose scope equals the selector's
  matchers and whose grouping contains L (``planner/group_store.py``): exact, G groups instead of S series.

* ``rule_distinct`` (aggregate rule): ``count(count by (L) (f(x{scope}[r])))`` and ``count(f(x{scope}[r]))``
  (f = count/present/last_over_time) from a ``cpc`` SDS counting distinct L tuples / series
  (``planner/distinct_store.py``), with the CPC relative error stated.

* ``rule_topk`` (aggregate rule): ``topk(k, sum by (L) (count_over_time(x{scope}[r])))`` from an ``fi`` SDS
  (``planner/topk_store.py``), only when every step's top-k set is provable from the sketch bounds.

``ordered_rules()`` is the rule list the stack uses: the more accurate REQ rule is tried before KLL,
so a metric with both SDSs answers tail quantiles from REQ. ``SketchRewriteHook`` is ``RewriteHook``
plus rules for ``AggregateExpr`` nodes (``RewriteHook`` itself only looks at calls).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import numpy as np

from planner.distinct_store import cpc_sketch, cpc_union
from planner.group_scan import scan_group
from planner.normalize import distinct_shape, group_shape, topk_shape
from planner.raw_segments import RawPrefix
from planner.rewrite import RULES, RewriteContext, RewriteHook, Rule, Served, _number, _prepare, _vector, rule_kll, timed, worth_it
from planner.sds import SDS, shape_of
from planner.summary_scan import RawSource, ScanResult, _read_raw, scan_kll
from planner.topk_store import frequent_strings_sketch, provable_topk
from planner.window import plan_windows
from promql.eval_selectors import duration_ms, effective_times, to_matchers
from promql.types import VectorSteps
from storage.matchers import Matcher

log = logging.getLogger("turboprom.planner")


def rule_req(node: Any, ectx: Any, rctx: RewriteContext) -> Served | None:
    """quantile_over_time(φ, sel[r]) with a literal φ in [min_phi, 1], from a REQ SDS."""
    prep = _prepare(node, ectx, rctx, "req")
    if prep is None or prep[0] != "quantile_over_time":
        return None
    func, ms, param, matchers, sds, range_ms, ends = prep
    phi = _number(param)
    if phi is None or not (sds.min_phi <= phi <= 1.0):
        return None
    scan = scan_kll(sds, ectx.source, matchers, phi, ends, range_ms)
    return Served(sds, func, _vector(func, scan), scan, node, ends, range_ms, phi)


SKETCH_RULES: list[Rule] = [rule_req]
for _r in SKETCH_RULES:
    if _r not in RULES:
        RULES.append(_r)


def ordered_rules() -> list[Rule]:
    """``RULES`` with the more accurate REQ rule ahead of KLL (same φ, smaller rank error)."""
    rules = [r for r in RULES if r is not rule_req]
    pos = rules.index(rule_kll) if rule_kll in rules else len(rules)
    return rules[:pos] + [rule_req] + rules[pos:]


GroupFinder = Callable[..., "SDS | None"]  # (metric, matchers, by[, algorithm]) -> SDS


def _locate(ms: Any, ectx: Any, rctx: RewriteContext, find: Callable[[str, list], SDS | None],
            algorithm: str) -> tuple | None:
    """(matchers, sds, range_ms, ends, plan) for the matrix selector ``ms`` when the query may use
    ``algorithm``, ``find`` names an SDS for it and some window holds a whole covered pane; None
    otherwise (raw is as cheap, or approximation is off)."""
    if not rctx.may_use(algorithm, ectx):
        return None
    vs = ms.vector_selector
    matchers = to_matchers(vs)[0]
    sds = find(vs.name, matchers)
    if sds is None:
        return None
    range_ms = duration_ms(ms.range)
    if range_ms <= 0:
        return None
    ends = effective_times(vs, ectx)
    lo, hi = sds.coverage()
    plan = plan_windows(ends, range_ms, sds.spec.pane_ms, lo, hi)
    if plan.summary_panes == 0:
        return None
    return matchers, sds, range_ms, ends, plan


def rule_group(node: Any, ectx: Any, rctx: RewriteContext, find_group: GroupFinder) -> Served | None:
    shape = group_shape(node)
    if shape is None:
        return None
    op, by, func, ms = shape
    loc = _locate(ms, ectx, rctx, lambda name, matchers: find_group(name, matchers, by), "group")
    if loc is None:
        return None
    matchers, sds, range_ms, ends, plan = loc
    if rctx.cost_based and (not worth_it(func, plan, range_ms, sds.spec.pane_ms)
                            or sds.stats.verdict(shape_of(func, range_ms, len(ends))) == "slower"):
        return None
    scan = scan_group(sds, ectx.source, matchers, op, func, by, ends, range_ms)
    val = VectorSteps(scan.labels, np.where(scan.present, scan.values, 0.0), scan.present,
                      drop_name=np.zeros(len(scan.labels), bool))
    return Served(sds, func, val, scan, node, ends, range_ms, None)


def scan_distinct(sds: SDS, source: RawSource, matchers: Sequence[Matcher], ends: np.ndarray, range_ms: int) -> ScanResult:
    """Distinct items (label tuples / series) with a sample in each window: union of the cached dyadic
    pane sketches and the items of the series in the raw edges (per step x item Python: bounded by
    the number of distinct items in the edges, never per sample)."""
    store = sds.store
    cov_lo, cov_hi = sds.coverage()
    ends = np.asarray(ends, np.int64)
    T = len(ends)
    # sealed steps are reused across refreshes while the store epoch, coverage start and series hold
    stamp = (store.epoch, cov_lo, len(sds.registry.labels))
    base = (int(range_ms), tuple(sorted(str(m) for m in matchers)))
    vals = np.zeros((1, T))
    present = np.zeros((1, T), bool)
    need = []
    with store.lock:
        for j, e in enumerate(ends.tolist()):
            hit = store.answers.get((base, e))
            if hit is not None and hit[0] == stamp:
                if hit[1] is not None:
                    vals[0, j], present[0, j] = hit[1], True
            else:
                need.append(j)
    need_a = np.asarray(need, np.int64)
    plan = plan_windows(ends[need_a], range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    if not len(need_a):
        return ScanResult([()], vals, present, info={"cached_steps": T})
    sel, raw = _read_raw(sds, source, matchers, plan)
    S = len(sel)
    pre = RawPrefix(raw, np.zeros(S), frozenset({"count"}))
    llo, lhi = pre.bounds(*plan.left)
    rlo, rhi = pre.bounds(*plan.right)
    edge = (lhi > llo) | (rhi > rlo)  # (S, len(need)) series with a raw edge sample in the window
    with store.lock:
        item_of = store.item_of[sel] if S else np.zeros(0, np.int64)
        hashes = np.asarray(store.items, dtype=np.int64)
    klo, khi = plan.klo.tolist(), plan.khi.tolist()
    sealed_ms = cov_hi * sds.spec.pane_ms
    done = []
    for jj, j in enumerate(need):
        parts = store.range_parts(klo[jj], khi[jj]) if khi[jj] > klo[jj] else []
        its = np.unique(item_of[edge[:, jj]]) if S else np.zeros(0, np.int64)
        its = its[its >= 0]
        est = None
        if parts or len(its):
            u = cpc_union(store.lg_k)
            for p in parts:
                u.update(p)
            if len(its):
                e = cpc_sketch(store.lg_k)
                for h in hashes[its].tolist():
                    e.update(h)
                u.update(e)
            res = u.get_result()
            if not res.is_empty():
                est = float(round(res.get_estimate()))  # a count: the estimate rounded to an integer
                present[0, j], vals[0, j] = True, est
        if int(ends[j]) < sealed_ms:
            done.append((int(ends[j]), est))
    with store.lock:
        for e, est in done:
            store.answers[(base, e)] = (stamp, est)
            store.answers.move_to_end((base, e))
        while len(store.answers) > 50_000:
            store.answers.popitem(last=False)
    return ScanResult([()], vals, present, raw_samples=len(raw.ts), summary_panes=plan.summary_panes,
                      info={"cached_steps": T - len(need)})


def rule_distinct(node: Any, ectx: Any, rctx: RewriteContext, find_agg: GroupFinder) -> Served | None:
    shape = distinct_shape(node)
    if shape is None:
        return None
    items, func, ms = shape
    loc = _locate(ms, ectx, rctx, lambda name, matchers: find_agg(name, matchers, items, "cpc"), "cpc")
    if loc is None:
        return None
    matchers, sds, range_ms, ends, _ = loc
    scan = scan_distinct(sds, ectx.source, matchers, ends, range_ms)
    val = VectorSteps(scan.labels, np.where(scan.present, scan.values, 0.0), scan.present, drop_name=np.zeros(1, bool))
    if not scan.present.any():
        val = VectorSteps.empty(len(ends))
    return Served(sds, func, val, scan, node, ends, range_ms, None)


def scan_topk(sds: SDS, source: RawSource, matchers: Sequence[Matcher], k: int, ends: np.ndarray,
              range_ms: int) -> ScanResult | None:
    """Top-k items by samples in each window (merged pane sketches + raw edge counts per item); None
    when some step's top-k set is not provable from the sketch's bounds (the caller goes raw)."""
    store = sds.store
    cov_lo, cov_hi = sds.coverage()
    plan = plan_windows(ends, range_ms, sds.spec.pane_ms, cov_lo, cov_hi)
    sel, raw = _read_raw(sds, source, matchers, plan)
    S, T = len(sel), len(ends)
    pre = RawPrefix(raw, np.zeros(S), frozenset({"count"}))
    llo, lhi = pre.bounds(*plan.left)
    rlo, rhi = pre.bounds(*plan.right)
    edge = (lhi - llo) + (rhi - rlo)  # (S, T) raw edge samples per series and step
    with store.lock:
        item_of = store.item_of[sel] if S else np.zeros(0, np.int64)
        texts = list(store.items)
    rows: dict[str, int] = {}
    vals: list[np.ndarray] = []
    present: list[np.ndarray] = []
    klo, khi = plan.klo.tolist(), plan.khi.tolist()
    for j in range(T):
        sk = frequent_strings_sketch(store.lg_max)
        for p in (store.range_parts(klo[j], khi[j]) if khi[j] > klo[j] else []):
            sk.merge(p)
        m = (edge[:, j] > 0) & (item_of >= 0) if S else np.zeros(0, bool)
        if m.any():
            per_item = np.bincount(item_of[m], weights=edge[m, j])
            for it in np.nonzero(per_item)[0].tolist():  # per distinct item in the edges
                sk.update(texts[it], int(per_item[it]))
        if sk.is_empty():
            continue
        top = provable_topk(sk, k)
        if top is None:
            return None
        for text, est in top:
            r = rows.get(text)
            if r is None:
                r = rows[text] = len(vals)
                vals.append(np.zeros(T))
                present.append(np.zeros(T, bool))
            vals[r][j] = est
            present[r][j] = True
    labels = [store.item_labels(t) for t in rows]
    return ScanResult(labels, np.array(vals).reshape(len(labels), T), np.array(present, bool).reshape(len(labels), T),
                      raw_samples=len(raw.ts), summary_panes=plan.summary_panes)


def rule_topk(node: Any, ectx: Any, rctx: RewriteContext, find_agg: GroupFinder) -> Served | None:
    shape = topk_shape(node)
    if shape is None:
        return None
    k, items, func, ms = shape
    loc = _locate(ms, ectx, rctx, lambda name, matchers: find_agg(name, matchers, items, "fi"), "fi")
    if loc is None:
        return None
    matchers, sds, range_ms, ends, _ = loc
    scan = scan_topk(sds, ectx.source, matchers, k, ends, range_ms)
    if scan is None:
        return None
    val = VectorSteps(scan.labels, np.where(scan.present, scan.values, 0.0), scan.present,
                      drop_name=np.zeros(len(scan.labels), bool))
    return Served(sds, "topk", val, scan, node, ends, range_ms, None)


AGGREGATE_RULES = [rule_topk, rule_group, rule_distinct]


class SketchRewriteHook(RewriteHook):
    """``RewriteHook`` plus aggregate rules: ``AggregateExpr`` nodes are offered to ``rule_group``
    first; every other node goes through the call rules unchanged."""

    def __init__(self, rctx: RewriteContext, rules: list[Rule] | None = None, find_group: GroupFinder | None = None):
        super().__init__(rctx, rules)
        self.find_group = find_group

    def __call__(self, node: Any, ectx: Any) -> Any:
        if self.find_group is not None and type(node).__name__ == "AggregateExpr" and not ectx.extra.get("exact"):
            def first_answer() -> Served | None:
                for rule in AGGREGATE_RULES:
                    served = rule(node, ectx, self.rctx, self.find_group)
                    if served is not None:
                        return served
                return None

            try:
                served = timed(first_answer)
            except Exception:  # noqa: BLE001 - a summary problem must never fail the query: go raw
                log.exception("aggregate summary rewrite failed; evaluating raw")
                return None
            if served is not None:
                self._report(served, ectx)
                return served.value
            return None
        return super().__call__(node, ectx)
