"""The querier's aggregation pushdown: an engine node hook (promql/evaluator.py) that answers a
pushable aggregation (pushdown_decision.decide) from the ingesters' partial states instead of
pulling every selected raw sample.

For such an aggregation the querier asks the owners chosen to cover every partition once (as a
``select`` does, with the same failover to the other owner) to evaluate what it aggregates over
their partitions at this evaluation's steps and to reduce it to partial states
(``/internal/cluster/v1/aggregate``, partition_eval.py), merges them (promql/partial_aggregate.py),
and adds the ingesters' annotations and sample statistics to the query's. An ingester that refuses
(a PromQL error such as too many samples; an ingester without the route) makes the querier
evaluate that aggregation itself, raw, so errors read exactly as a single node's; so does a topk /
bottomk whose ties at the k-th place a single evaluation would break by replaying Prometheus's heap
over all of a group's series (partial_aggregate.NotMergeable).
"""
from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from prometheus_client import Counter
from promql import parser as pp

from promql.eval_context import EvalContext
from promql.eval_positions import line_col
from promql.evaluator import Evaluator
from promql.partial_aggregate import NotMergeable, merge
from promql.types import Scalar, Value
from turboprom.cluster import columns_codec
from turboprom.cluster.fanout_storage import FanoutStorage, Refused
from turboprom.cluster.pushdown_decision import decide
from turboprom.tenancy import TenantView

log = logging.getLogger("turboprom.cluster")
DECISIONS = Counter("turboprom_cluster_pushdown_decisions", "Aggregations a querier evaluated: pushed down to the "
                    "ingesters, raw (not pushable), or fallback (pushable, refused by an ingester, evaluated raw).",
                    ["decision"])


class PushdownHook:
    def __init__(self, fanout: FanoutStorage, enabled: bool = True):
        self.fanout = fanout
        self.enabled = enabled

    def __call__(self, node: Any, ctx: EvalContext) -> Value | None:
        if not self.enabled or not isinstance(node, pp.AggregateExpr):
            return None
        src = ctx.source
        if not isinstance(src, TenantView) or src.storage is not self.fanout or ctx.num_steps == 0:
            return None
        d = decide(node)
        if not d.pushed:
            DECISIONS.labels("raw").inc()
            return None
        op = str(node.op).lower()
        budget = ctx.budget
        body = {"query": ctx.query, "agg_pos": list(node.pos), "tenant": src.tenant, "steps": ctx.step_times.tolist(),
                "query_start_ms": ctx.query_start_ms, "query_end_ms": ctx.query_end_ms,
                "query_step_ms": ctx.query_step_ms, "lookback_delta_ms": ctx.lookback_delta_ms,
                "subquery_depth": ctx.subquery_depth, "max_samples": budget.max_samples, "max_bytes": budget.max_bytes,
                "timeout_s": max(0.001, budget.deadline - time.monotonic()), "exact": bool(ctx.extra.get("exact"))}
        try:
            raw = self.fanout.partials(body)
        except Refused as e:
            DECISIONS.labels("fallback").inc()
            log.debug("pushdown of %s refused, evaluated raw: %s", op, e)
            return None
        budget.check()
        decoded = [columns_codec.decode_partial(r) for r in raw]
        param = None
        pos = ""
        if node.param is not None:
            held = budget.current_samples, budget.current_bytes
            param = Evaluator().eval(node.param, ctx)  # a constant: held by the aggregation, not beside it
            budget.current_samples, budget.current_bytes = held
            lc = line_col(ctx.query, node.param.pos[0])
            pos = f" ({lc[0]}:{lc[1]})"
        names: list[str] = []
        without = False
        if node.modifier is not None:
            without = str(node.modifier.type).rsplit(".", 1)[-1] == "Without"
            names = sorted(node.modifier.labels)
        try:
            with np.errstate(all="ignore"):
                out = merge(op, [p for p, _ in decoded], ctx.num_steps, names, without,
                            param if isinstance(param, Scalar) else None, ctx.annotations, pos)
        except NotMergeable as e:
            DECISIONS.labels("fallback").inc()
            log.debug("pushdown of %s not mergeable, evaluated raw: %s", op, e)
            return None
        self._account(ctx, [h for _, h in decoded])
        DECISIONS.labels("pushed").inc()
        ctx.stats.paths.append(f"pushdown:{op}")
        return out

    @staticmethod
    def _account(ctx: EvalContext, headers: list[dict]) -> None:
        """The ingesters' annotations and sample statistics, as if evaluated here: their selections
        are disjoint, so their samples add up, and so do the samples they held at once."""
        st = ctx.stats
        peak = 0
        for h in headers:
            for w in h.get("warnings", ()):
                ctx.annotations.warn(w)
            for i in h.get("infos", ()):
                ctx.annotations.info(i)
            s = h.get("stats") or {}
            st.samples_scanned += int(s.get("samples_scanned", 0))
            st.series_touched += int(s.get("series_touched", 0))
            st.total_queryable_samples += int(s.get("total_queryable_samples", 0))
            st.remote_cpu_seconds += float(s.get("cpu_seconds", 0.0))
            # summaries that answered an ingester's share: the step answers keep such steps only a seal
            # delay later, as for a summary answer on a single node (planner/step_answers.py)
            st.paths.extend(p for p in s.get("paths", ()) if p not in st.paths)
            peak += int(s.get("peak_samples", 0))
            per_step = s.get("samples_per_step")
            if per_step is not None and ctx.subquery_depth == 0:
                counts = np.asarray(per_step, np.int64)
                if st.samples_per_step is None:
                    st.samples_per_step = (ctx.step_times.copy(), counts)
                elif len(st.samples_per_step[1]) == len(counts):
                    st.samples_per_step[1][:] += counts
        ctx.budget.charge(peak, st)  # Prometheus's max-samples: what the selection held at once
        ctx.budget.release(peak)


__all__ = ["PushdownHook", "DECISIONS"]
