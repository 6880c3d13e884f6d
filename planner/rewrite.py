"""The rewrite: a node hook for the engine that answers eligible sub-trees from summaries.

The hook offers each call and aggregate node to the rules of its kind (``planner/rewrite_rules.py``,
one table, in order); the first rule whose decision is "served" and whose scan answers wins, and the
engine takes that value instead of evaluating the node. When none serves, the engine evaluates the
node on raw data unchanged (and where the exact rule chose raw on cost alone, the raw answer's sealed
steps fill that SDS's step cache). ``exact=true`` (``eval_ctx.extra["exact"]``) disables every rule.
Approximate algorithms (``planner/algorithm_registry.py``) answer only when the query allows
approximation (``eval_ctx.extra["approx"]``, set per query by ``with_policy``: the operator's
``planner.approximate`` or the request's ``approx=true``); by default every answer equals the raw path.

Honesty: every summary-served sub-tree appends ``summary:<sds id>`` to ``stats.paths`` and an info
annotation naming the SDS, its algorithm and error bound.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np

from planner.rewrite_rules import RULES, Decision, RewriteContext, Rule, Served, rules_for
from planner.sds import read_fold_seconds, shape_of
from planner.summary_scan import ScanResult
from promql.types import VectorSteps

log = logging.getLogger("turboprom.planner")

_COUNTER_SUFFIXES = ("_total", "_sum", "_count", "_bucket")


def with_policy(hook: Callable[[Any, Any], Any], approximate: bool) -> Callable[[Any, Any], Any]:
    """``hook`` for one query: approximate algorithms may answer only when ``approximate``."""
    def bound(node: Any, ectx: Any) -> Any:
        ectx.extra.setdefault("approx", approximate)
        return hook(node, ectx)
    return bound


def timed(answer: Callable[[], Any]) -> Any:
    """``answer()``, with what serving it from the summary cost (wall and CPU seconds) set on the result:
    the shadow runs weigh this against the raw path. Folds of samples that arrived before the read
    (``read_fold_seconds``) are summarization, already counted as the plan's ingest CPU: left out."""
    (fw0, fc0), w0, c0 = read_fold_seconds(), time.perf_counter(), time.thread_time()
    served = answer()
    if isinstance(served, Served):
        fw1, fc1 = read_fold_seconds()
        served.wall_s = max(time.perf_counter() - w0 - (fw1 - fw0), 0.0)
        served.cpu_s = max(time.thread_time() - c0 - (fc1 - fc0), 0.0)
    return served


class RewriteHook:
    """``hook(node, eval_ctx) -> Value | None`` for ``Engine.*_query(node_hooks=[...])``."""

    def __init__(self, rctx: RewriteContext, rules: tuple[Rule, ...] = RULES):
        self.rctx = rctx
        self.by_kind = {kind: rules_for(kind, rules) for kind in ("Call", "AggregateExpr")}

    def __call__(self, node: Any, ectx: Any) -> Any:
        if ectx.extra.get("exact"):
            return None
        rules = self.by_kind.get(type(node).__name__)
        if not rules:
            return None
        fill: Decision | None = None
        for rule in rules:
            try:
                served = timed(lambda: self._answer(rule, node, ectx))
            except Exception:  # noqa: BLE001 - a summary problem must never fail the query: go raw
                log.exception("summary rewrite (%s) failed; evaluating raw", rule.name)
                return None
            if isinstance(served, Decision):
                if served.trial:  # raw, and the summary path measured beside it
                    return self._measure(rule, served, node, ectx)
                fill = fill or served  # raw, and this raw answer may fill the step cache
                continue
            if served is not None:
                self._report(served, ectx)
                return served.value
        if fill is not None:
            return raw_and_fill(node, ectx, fill)
        return None

    def _answer(self, rule: Rule, node: Any, ectx: Any) -> Served | Decision | None:
        d = rule.decide(node, ectx, self.rctx)
        if d is None:
            return None
        if not d.served:
            return d if (d.fill or d.trial) else None
        return rule.serve(d, node, ectx)

    def _measure(self, rule: Rule, d: Decision, node: Any, ectx: Any) -> Any:
        """A shape of use still being measured (``SDSStats.measuring``): the reader gets the raw answer,
        timed here, and the summary path of the same sub-tree and steps is run and timed beside it
        (``rctx.on_trial``, the canary's worker), so a summary slower than raw in this shape is never
        what a reader waits for. The raw answer does not fill the step cache: the summary run fills
        it with what it computes, and is measured against the cache as a served refresh would find it."""
        w0, c0 = time.perf_counter(), time.thread_time()
        val = eval_raw(node, ectx)
        raw_wall, raw_cpu = time.perf_counter() - w0, time.thread_time() - c0
        if self.rctx.on_trial is not None and isinstance(val, VectorSteps):
            try:
                self.rctx.on_trial(rule, d, node, ectx, val, raw_wall, raw_cpu)
            except Exception:  # noqa: BLE001 - measuring must never fail the query
                log.exception("queueing the summary path's measuring run failed")
        return val

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


def eval_raw(node: Any, ectx: Any) -> Any:
    """``node`` evaluated on raw data, exactly as the engine would (no hooks below it), with the
    engine's annotation positions (the first occurrence of the call in the query text)."""
    from dataclasses import replace

    from promql.evaluator import Evaluator

    try:
        from promql.eval_positions import locate_all

        positions = locate_all(node, ectx.query) if ectx.query else {}
    except Exception:  # noqa: BLE001 - positions are best effort, as in the engine
        positions = {}
    return Evaluator(positions).eval(node, replace(ectx, hooks=()))


def raw_and_fill(node: Any, ectx: Any, d: Decision) -> Any:
    """Evaluate ``node`` on raw data (exactly what the engine would do) and keep the answers of its
    sealed steps in the exact SDS's step cache (``d``: the rule's decision, raw on cost), so the next
    refresh of this panel computes only its new steps from the summary. The query itself is reported
    as raw. Range queries only (a refresh repeats steps)."""
    if len(ectx.step_times) < 2 or ectx.subquery_depth:
        return None
    from planner.summary_scan import arm, fill_from_raw

    sds = d.sds
    armed = arm(sds)  # before the raw read: later writes invalidate
    val = eval_raw(node, ectx)
    try:
        if isinstance(val, VectorSteps):
            fill_from_raw(sds, d.matchers, d.func, d.ends, d.range_ms, val, armed, ectx.series_scope)
    except Exception:  # noqa: BLE001 - filling a cache must never fail the query
        log.exception("step cache fill from the raw path failed")
    return val
