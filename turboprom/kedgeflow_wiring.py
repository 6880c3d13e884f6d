"""Connects KedgeFlow to the server: congestion signals for the policy, and the built-in targets."""
from __future__ import annotations

import math
from typing import Any

from scheduler_metrics.kedgeflow.action import Action
from scheduler_metrics.kedgeflow.service import KedgeFlowService
from scheduler_metrics.kedgeflow.targets import FunctionTarget, HTTPTarget, IdempotencyStore
from turboprom.api_params import parse_matchers_param, parse_time
from turboprom.cluster.backend_clients import ledger_etcd_client
from turboprom.context import ServerContext
from turboprom.tenancy import TenantView, forget_deleted_summaries


def congestion_signals(ctx: ServerContext):
    """Policy signal source: the highest cluster congestion price (s/token) in the action's scope
    (params ``cluster``/``model`` narrow it), with the cluster rows used as the recorded snapshot."""

    def signals(action: Action) -> dict[str, Any]:
        tracker = ctx.components.congestion
        if tracker is None:
            return {}
        snap = tracker.fresh_snapshot()  # called off the event loop (the policy runs in a worker thread)
        clusters = [c for c in snap.clusters
                    if (not action.params.get("cluster") or c["cluster"] == action.params["cluster"])
                    and (not action.params.get("model") or c["model_name"] == action.params["model"])]
        prices = [c["congestion_price_seconds_per_token"] for c in clusters
                  if c.get("congestion_price_seconds_per_token") is not None and math.isfinite(c["congestion_price_seconds_per_token"])]
        return {"price": max(prices) if prices else None, "snapshot_version": snap.version,
                "clusters": [{k: c.get(k) for k in ("cluster", "model_name", "instances", "utilization", "congestion_price_seconds_per_token")} for c in clusters]}

    return signals


DELETE_SERIES_PARAMS = ("match[]", "match", "start", "end")


def _delete_args(action: Action) -> tuple[list, int, int]:
    unknown = sorted(set(action.params) - set(DELETE_SERIES_PARAMS))
    if unknown:
        raise ValueError(f"tsdb.delete_series: unknown parameter(s) {', '.join(repr(k[:64]) for k in unknown[:5])} "
                         f"(known: {', '.join(DELETE_SERIES_PARAMS)})")
    sel = action.params.get("match[]") or action.params.get("match")
    if isinstance(sel, str):
        sel = [sel]
    if not sel:
        raise ValueError("tsdb.delete_series needs params['match[]'] (one or more series selectors)")
    sets = parse_matchers_param(sel)
    start = parse_time(str(action.params["start"])) if "start" in action.params else -(2**62)
    end = parse_time(str(action.params["end"])) if "end" in action.params else 2**62
    return sets, start, end


def validate_delete_series(ctx: ServerContext, action: Action) -> None:
    """Checked at proposal, so a malformed action is refused (400) before any allowance exists."""
    from turboprom.routes.status_api import admin_enabled

    if not admin_enabled(ctx):
        raise ValueError("admin APIs disabled: start the server with --web.enable-admin-api to allow tsdb.* actions")
    _delete_args(action)


def delete_series_target(ctx: ServerContext, store: IdempotencyStore) -> FunctionTarget:
    """``tsdb.delete_series`` with params {"match[]": [...], "start"?: ..., "end"?: ...} (Prometheus's
    admin API parameters), within the action's tenant only; commits once per grant (idempotency key =
    allowance id)."""

    def apply(action: Action) -> dict[str, Any]:
        sets, start, end = _delete_args(action)
        deleted = TenantView(ctx.storage, action.tenant).delete_series(sets, start, end)
        forget_deleted_summaries(ctx, action.tenant, sets)
        return {"deleted_series": int(deleted) if deleted is not None else None}

    return FunctionTarget(store, apply)


def build_kedgeflow(ctx: ServerContext) -> KedgeFlowService:
    raw = ctx.config.raw.get("kedgeflow")
    svc = KedgeFlowService.open(ctx.config.data_dir, raw, signals=congestion_signals(ctx),
                                etcd_client=ledger_etcd_client(raw, ctx.config.config_dir))
    store = IdempotencyStore(f"{ctx.config.data_dir}/kedgeflow/targets.sqlite")
    svc.add_target("tsdb.delete_series", delete_series_target(ctx, store))
    svc.validators["tsdb.delete_series"] = lambda action: validate_delete_series(ctx, action)
    # Remote targets (e.g. a scheduler's control endpoint): kedgeflow.targets: {verb: url}
    for verb, url in ((ctx.config.raw.get("kedgeflow") or {}).get("targets") or {}).items():
        svc.add_target(str(verb), HTTPTarget(str(url)))
    return svc
