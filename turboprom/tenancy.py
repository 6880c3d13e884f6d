"""Multi-tenancy by the ``X-Scope-OrgID`` header (Mimir's convention).

Series of a tenant other than the default carry a reserved label ``__tenant__`` in storage; the
default tenant's series carry none. Every read goes through a ``TenantView``, which adds the
tenant's matcher to each selection and removes the label from what it returns, so no endpoint built
on it can see another tenant's series. The PromQL engine reads through the same view (one engine
per tenant), so queries cannot either. Storage resolves the tenant matcher first, inside a
per-tenant partition of its index (storage/index.py), so value matchers only ever see the caller's
own tenant's label values: no timing oracle on another tenant's values.

Who sees what (docs/reliability.md, "Tenant isolation"): data-bearing routes answer for the
caller's tenant (``X-Scope-OrgID``, checked against the user's ``tenants:`` by the auth middleware).
What only the default tenant has (rules, alerts, scrape targets, summaries/planner state, congestion
signals; ingest sinks see the default tenant only) is empty for every other tenant. Operator views
that cover every tenant at once (``/metrics``, ``/api/v1/status/config``) need an *operator*: a
caller who may act as any tenant (no auth configured, or a user without a ``tenants:`` entry).
"""
from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any, Callable, Sequence


from storage.batch import SampleBatch
from storage.labels import DEFAULT_TENANT, TENANT_LABEL, Labels  # storage partitions its index by the label
from storage.matchers import Matcher
from storage.series_set import SeriesSet

MAX_TENANT_LEN = 150


def validate_tenant(tenant: str) -> str:
    """Mimir's rules: 1-150 chars of [A-Za-z0-9!-_.*'()]; not '.' or '..'."""
    if not tenant or len(tenant) > MAX_TENANT_LEN or tenant in (".", ".."):
        raise ValueError(f"invalid tenant ID {tenant!r}: must be 1-{MAX_TENANT_LEN} characters and not '.' or '..'")
    ok = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!-_.*'()")
    bad = sorted(set(tenant) - ok)
    if bad:
        raise ValueError(f"invalid tenant ID {tenant!r}: character(s) {''.join(bad)!r} not allowed")
    return tenant


def tenant_of(headers: Any) -> str:
    t = headers.get("X-Scope-OrgID") if headers is not None else None
    return validate_tenant(t.strip()) if t else DEFAULT_TENANT


def tenant_matcher(tenant: str) -> Matcher:
    # The default tenant's series have no tenant label: `= ""` selects exactly those.
    return Matcher(TENANT_LABEL, "=", "" if tenant == DEFAULT_TENANT else tenant)


def _strip(lbl: Labels) -> Labels:
    return tuple(p for p in lbl if p[0] != TENANT_LABEL)


_TENANT_KEY = (TENANT_LABEL,)


def _has_tenant_label(lbl: Labels) -> bool:
    # Labels are sorted by name: a binary search (C comparisons) instead of a scan of every pair.
    i = bisect_left(lbl, _TENANT_KEY)
    return i < len(lbl) and lbl[i][0] == TENANT_LABEL


def tenant_labels(lbl: Labels, tenant: str) -> Labels:
    """A series' labels as stored for ``tenant``: a non-default tenant's label stamped on, any
    ``__tenant__`` label a client sent replaced (a tenant cannot write into another)."""
    if tenant == DEFAULT_TENANT:
        return _strip(lbl) if _has_tenant_label(lbl) else lbl
    return tuple(sorted(_strip(lbl) + ((TENANT_LABEL, tenant),)))


def label_batch(batch: SampleBatch, tenant: str) -> SampleBatch:
    """``tenant_labels`` on every series of an ingest batch (per series, not per sample). Remote write
    does this once per new series instead (turboprom.limits.SeriesAdmission)."""
    if tenant == DEFAULT_TENANT:
        if any(map(_has_tenant_label, batch.series)):
            batch.series = [_strip(lbl) for lbl in batch.series]
        return batch
    batch.series = [tenant_labels(lbl, tenant) for lbl in batch.series]
    batch.tenant = tenant
    return batch


class TenantView:
    """A storage read view restricted to one tenant (implements the read side of storage.interface).

    It has nothing else: appending goes through the ingest pipeline with ``label_batch``, and
    what reports on the whole store (close, blocks, ...) is read from the storage itself."""

    def __init__(self, storage: Any, tenant: str):
        self.storage = storage
        self.tenant = tenant
        self._m = tenant_matcher(tenant)

    def _sets(self, matcher_sets: Sequence[Sequence[Matcher]]) -> list[list[Matcher]]:
        return [[*ms, self._m] for ms in matcher_sets] if matcher_sets else [[self._m]]

    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        ss = self.storage.select([*matchers, self._m], mint, maxt)
        if self.tenant != DEFAULT_TENANT:
            ss = SeriesSet([_strip(lbl) for lbl in ss.labels], ss.offsets, ss.timestamps, ss.values)
        return ss

    def series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> list[Labels]:
        return [_strip(lbl) for lbl in self.storage.series(self._sets(matcher_sets), mint, maxt)]

    def label_names(self, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]:
        return [n for n in self.storage.label_names(mint, maxt, self._sets(matcher_sets)) if n != TENANT_LABEL]

    def label_values(self, name: str, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]:
        if name == TENANT_LABEL:
            return []
        return self.storage.label_values(name, mint, maxt, self._sets(matcher_sets))

    def delete_series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> Any:
        return self.storage.delete_series(self._sets(matcher_sets), mint, maxt)

    def tsdb_status(self, limit: int = 10) -> dict[str, Any]:
        """Prometheus's /api/v1/status/tsdb data over this tenant's series only: series, label pairs
        and min/max time are never store-wide (another tenant's newest timestamp is theirs)."""
        return self.storage.tsdb_status([self._m], limit)

    def stats(self, limit: int = 10) -> dict[str, Any]:
        """``tsdb_status`` plus this tenant's head samples and share of block bytes (the cost report's
        storage figures)."""
        out = self.tsdb_status(limit)
        own = self.storage.head_stats_of([self._m])
        out["headStats"]["numSamples"] = int(own["numSamples"])
        out["numSeriesTotal"] = out["headStats"]["numSeries"]
        out["blockBytes"] = own["blockBytes"]
        return out


class TenantEngines:
    """One PromQL engine per tenant, each reading through that tenant's view (created on first use)."""

    def __init__(self, storage: Any, make_engine: Callable[[Any], Any], default_engine: Any | None = None):
        self.storage = storage
        self.make_engine = make_engine
        self._engines: dict[str, Any] = {}
        if default_engine is not None:
            self._engines[DEFAULT_TENANT] = default_engine
        self._lock = threading.Lock()

    def get(self, tenant: str) -> Any:
        with self._lock:
            eng = self._engines.get(tenant)
            if eng is None:
                eng = self._engines[tenant] = self.make_engine(TenantView(self.storage, tenant))
            return eng


# ---------------------------------------------------------------- request plumbing for route modules
def request_tenant(request: Any) -> str:
    """The caller's tenant; an invalid X-Scope-OrgID is the caller's fault (400 bad_data)."""
    from turboprom.api_errors import ParamError

    try:
        return tenant_of(request.headers)
    except ValueError as e:
        raise ParamError(str(e)) from None


def tenant_storage(ctx: Any, request: Any) -> TenantView:
    return TenantView(ctx.storage, request_tenant(request))


def caller_tenants(request: Any, ctx: Any) -> frozenset[str] | None:
    """The tenants the authenticated caller may act as (web config ``tenants:``); None: any tenant
    (no auth configured, or a user without a ``tenants:`` entry)."""
    auth = ctx.components.auth
    if auth is None:
        return None
    principal = request.get("principal") if hasattr(request, "get") else None
    if principal is None:
        principal = auth.principal(request)
    allowed = auth.cfg.tenants.get(principal.name)
    return None if allowed is None else frozenset(allowed)


def is_operator(request: Any, ctx: Any) -> bool:
    """May the caller see views that cover every tenant at once (self-metrics, the configuration)?
    Only a caller who may act as any tenant: one restricted to some tenants, whatever its roles,
    must not learn the others' names, counts or targets."""
    return caller_tenants(request, ctx) is None


OPERATOR_ONLY = ("this view covers every tenant: it needs a user not restricted to tenants "
                 "(no 'tenants:' entry in the web config)")


def require_operator(request: Any, ctx: Any) -> None:
    """403 (errorType forbidden) unless ``is_operator``."""
    if not is_operator(request, ctx):
        from turboprom.api_errors import APIError

        raise APIError("forbidden", OPERATOR_ONLY, 403)


def sees_default_only_state(request: Any) -> bool:
    """Does the caller act as the default tenant? Rules, alerts, scrape targets, planner state and
    congestion signals are built from the default tenant's data only (ingest sinks see no other
    tenant), so every other tenant's view of them is empty."""
    return request_tenant(request) == DEFAULT_TENANT


def restrict_sinks(pipeline: Any) -> None:
    """Only the default tenant's samples reach the ingest sinks (summarizer, congestion tracker), also
    sinks attached later: summaries and congestion signals are the operator's, never mixed across tenants."""
    if pipeline is not None:
        pipeline.sink_tenants = frozenset({DEFAULT_TENANT})


def forget_deleted_summaries(ctx: Any, tenant: str, matcher_sets: list) -> None:
    """After a series deletion: summaries hold only the default tenant's data, so only its deletions
    retire the plans that could contain the deleted series (planner.Planner.forget_deleted)."""
    planner = ctx.components.planner
    if tenant == DEFAULT_TENANT and planner is not None and hasattr(planner, "forget_deleted"):
        planner.forget_deleted(matcher_sets)
