"""Connects KedgeFlow to the server: congestion signals for the policy, and the built-in targets."""
from __future__ import annotations

import math
from typing import Any

from scheduler_metrics.kedgeflow.action import Action
from scheduler_metrics.kedgeflow.service import KedgeFlowService
from scheduler_metrics.kedgeflow.targets import FunctionTarget, HTTPTarget, IdempotencyStore
from turboprom.api_params import parse_matchers_param, parse_time
from turboprom.context import ServerContext


def congestion_signals(ctx: ServerContext):
    """Policy signal source: the highest cluster congestion price (s/token) in the action's scope
    (params ``cluster``/``model`` narrow it), with the cluster rows used as the recorded snapshot."""

    def signals(action: Action) -> dict[str, Any]:
        tracker = ctx.components.get("congestion")
        if tracker is None:
            return {}
        snap = tracker.snapshot()
        clusters = [c for c in snap.clusters
                    if (not action.params.get("cluster") or c["cluster"] == action.params["cluster"])
                    and (not action.params.get("model") or c["model"] == action.params["model"])]
        prices = [c["congestion_price_seconds_per_token"] for c in clusters
                  if c.get("congestion_price_seconds_per_token") is not None and math.isfinite(c["congestion_price_seconds_per_token"])]
        return {"price": max(prices) if prices else None, "snapshot_version": snap.version,
                "clusters": [{k: c.get(k) for k in ("cluster", "model", "instances", "utilization", "congestion_price_seconds_per_token")} for c in clusters]}

    return signals


def delete_series_target(ctx: ServerContext, store: IdempotencyStore) -> FunctionTarget:
    """``tsdb.delete_series`` with params {"match[]": [...], "start"?: ..., "end"?: ...} (Prometheus's
    admin API parameters); commits once per grant (idempotency key = allowance id)."""

    def apply(action: Action) -> dict[str, Any]:
        sel = action.params.get("match[]") or action.params.get("match")
        if isinstance(sel, str):
            sel = [sel]
        if not sel:
            raise ValueError("tsdb.delete_series needs params['match[]']")
        sets = parse_matchers_param(sel)
        start = parse_time(str(action.params["start"])) if "start" in action.params else -(2**62)
        end = parse_time(str(action.params["end"])) if "end" in action.params else 2**62
        deleted = ctx.storage.delete_series(sets, start, end)
        return {"deleted_series": int(deleted) if deleted is not None else None}

    return FunctionTarget(store, apply)


def build_kedgeflow(ctx: ServerContext) -> KedgeFlowService:
    svc = KedgeFlowService.open(ctx.config.data_dir, ctx.config.raw.get("kedgeflow"), signals=congestion_signals(ctx))
    store = IdempotencyStore(f"{ctx.config.data_dir}/kedgeflow/targets.sqlite")
    svc.add_target("tsdb.delete_series", delete_series_target(ctx, store))
    # Remote targets (e.g. a scheduler's control endpoint): kedgeflow.targets: {verb: url}
    for verb, url in ((ctx.config.raw.get("kedgeflow") or {}).get("targets") or {}).items():
        svc.add_target(str(verb), HTTPTarget(str(url)))
    return svc
