"""Per-tenant limits and input limits, from the ``limits:`` section of the server config:

    limits:
      max_labels_per_series: 40          # input limits (all tenants)
      max_label_name_length: 1024
      max_label_value_length: 2048
      max_query_length: 16384            # characters of PromQL
      ingestion_rate_samples_per_second: 0   # per tenant; 0 = unlimited (token bucket, burst = 2 s)
      max_active_series: 0               # per tenant; series seen since start; 0 = unlimited
      max_samples_per_query: 0           # per tenant; 0 = the engine's --query.max-samples
      max_concurrent_queries: 0          # per tenant; 0 = unlimited
      tenants:                           # per-tenant overrides of the per-tenant settings
        team-a: {ingestion_rate_samples_per_second: 50000, max_active_series: 200000}

Refusals name the limit and the offending value. Ingest over a rate or series limit gets 429 with
Retry-After (the sender retries later); a series breaking an input limit gets 400 (retrying is useless).
"""
from __future__ import annotations

import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields, replace
from typing import Any, AsyncIterator

from ingest.errors import IngestError
from storage.batch import SampleBatch
from storage.labels import Labels, format_labels
from turboprom.tenancy import tenant_labels

PER_TENANT = ("ingestion_rate_samples_per_second", "max_active_series", "max_samples_per_query", "max_concurrent_queries")


@dataclass(frozen=True)
class LimitValues:
    max_labels_per_series: int = 40
    max_label_name_length: int = 1024
    max_label_value_length: int = 2048
    max_query_length: int = 16384
    ingestion_rate_samples_per_second: float = 0.0
    max_active_series: int = 0
    max_samples_per_query: int = 0
    max_concurrent_queries: int = 0


def _number(cls: Any, name: str, v: Any, where: str) -> Any:
    """A limit's value as its field's type; a string, a boolean or a fraction where an integer belongs is refused."""
    want = type(getattr(cls(), name))
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (want is int and not float(v).is_integer()):
        raise ValueError(f"{where}.{name}: expected {'an integer' if want is int else 'a number'}, got {v!r}")
    return want(v)


class LimitExceeded(Exception):
    def __init__(self, message: str, status: int = 429, retry_after_s: int = 1):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class _Bucket:
    def __init__(self, rate: float):
        self.rate, self.capacity = rate, rate * 2.0
        self.tokens, self.t = self.capacity, time.monotonic()

    def take(self, n: float) -> float:
        """Take n tokens; returns 0 if granted, else seconds until they would be available."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if n <= self.tokens or (n > self.capacity and self.tokens >= self.capacity):
            self.tokens -= n  # a batch bigger than the burst passes when the bucket is full
            return 0.0
        return (n - self.tokens) / self.rate


class Limits:
    def __init__(self, base: LimitValues | None = None, overrides: dict[str, LimitValues] | None = None):
        self.base = base or LimitValues()
        self.overrides = overrides or {}
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}
        self._series: dict[str, set] = {}
        self._running: dict[str, int] = {}

    @classmethod
    def from_config(cls, raw: dict[str, Any] | None) -> "Limits":
        raw = dict(raw or {})
        names = {f.name for f in fields(LimitValues)}
        tenants = raw.pop("tenants", {}) or {}
        unknown = set(raw) - names
        if unknown:
            raise ValueError(f"limits: unknown setting(s) {sorted(unknown)} (known: {', '.join(sorted(names))})")
        base = LimitValues(**{k: _number(LimitValues, k, v, "limits") for k, v in raw.items()})
        over = {}
        if not isinstance(tenants, dict):
            raise ValueError("limits.tenants must map tenant names to their limits")
        for t, vals in tenants.items():
            if not isinstance(vals, dict):
                raise ValueError(f"limits.tenants.{t} must be a mapping of limits")
            bad = set(vals) - set(PER_TENANT)
            if bad:
                raise ValueError(f"limits.tenants.{t}: only per-tenant settings may be overridden ({', '.join(PER_TENANT)}), not {sorted(bad)}")
            over[str(t)] = replace(base, **{k: _number(LimitValues, k, v, f"limits.tenants.{t}") for k, v in vals.items()})
        return cls(base, over)

    def carry_state(self, old: "Limits") -> None:
        """Take over what ``old`` counts (active series seen, queries running, rate buckets), for a
        config reload: the new values apply from the next request, nothing counted is forgotten.
        The state is shared, not copied, so queries admitted under ``old`` release their slot here."""
        self._lock, self._series, self._running, self._buckets = old._lock, old._series, old._running, old._buckets

    def of(self, tenant: str) -> LimitValues:
        return self.overrides.get(tenant, self.base)

    # ------------------------------------------------------------------ ingest
    def check_series(self, lbl: Labels, tenant: str, samples: int = 0) -> None:
        """The input limits of one series (label count, name and value lengths): 400 when broken."""
        lim = self.of(tenant)
        if len(lbl) > lim.max_labels_per_series:
            raise IngestError("too_many_labels", f"series {format_labels(lbl)[:200]} has {len(lbl)} labels, more than the "
                              f"limit of {lim.max_labels_per_series} (limits.max_labels_per_series)", 400, samples)
        for n, v in lbl:
            if len(n) > lim.max_label_name_length:
                raise IngestError("label_name_too_long", f"label name {n[:64]!r}... is {len(n)} characters, more than the limit of "
                                  f"{lim.max_label_name_length} (limits.max_label_name_length)", 400, samples)
            if len(v) > lim.max_label_value_length:
                raise IngestError("label_value_too_long", f"value of label {n!r} is {len(v)} characters, more than the limit of "
                                  f"{lim.max_label_value_length} (limits.max_label_value_length)", 400, samples)

    def check_batch(self, batch: SampleBatch, tenant: str, new_series: list[Labels] | None = None) -> SampleBatch:
        """Input limits per series, then the tenant's active-series and rate limits. ``new_series``:
        the caller already checked every series with ``check_series`` when it first saw it, and
        these are the batch's series it had not seen before (the only ones that can be new here)."""
        lim = self.of(tenant)
        if new_series is None:
            for lbl in batch.series:  # per series, not per sample
                self.check_series(lbl, tenant, len(batch))
        with self._lock:
            # Series limit first, so a refused batch does not also spend rate budget.
            new: list = []
            if lim.max_active_series > 0:
                seen = self._series.setdefault(tenant, set())
                new = [lbl for lbl in (batch.series if new_series is None else new_series) if lbl not in seen]
                if len(seen) + len(new) > lim.max_active_series:
                    raise IngestError("series_limit", f"tenant {tenant!r} would exceed its limit of {lim.max_active_series} "
                                      f"active series ({len(seen)} + {len(new)} new)", 429, len(batch))
            if lim.ingestion_rate_samples_per_second > 0:
                b = self._buckets.get(tenant)
                if b is None or b.rate != lim.ingestion_rate_samples_per_second:
                    b = self._buckets[tenant] = _Bucket(lim.ingestion_rate_samples_per_second)
                wait = b.take(len(batch))
                if wait > 0:
                    raise IngestError("rate_limited", f"tenant {tenant!r} is over its ingestion rate limit of "
                                      f"{lim.ingestion_rate_samples_per_second:g} samples/s; retry in {wait:.1f}s", 429, len(batch))
            if new:
                self._series[tenant].update(new)
        return batch


    # ------------------------------------------------------------------ queries
    def check_query(self, query: str, tenant: str) -> None:
        lim = self.of(tenant)
        if len(query) > lim.max_query_length:
            raise LimitExceeded(f"query is {len(query)} characters, more than the limit of {lim.max_query_length} "
                                f"(limits.max_query_length)", status=400)

    def max_samples(self, tenant: str) -> int | None:
        v = self.of(tenant).max_samples_per_query
        return v if v > 0 else None

    @asynccontextmanager
    async def query_slot(self, tenant: str) -> AsyncIterator[None]:
        lim = self.of(tenant).max_concurrent_queries
        if lim > 0:
            with self._lock:
                if self._running.get(tenant, 0) >= lim:
                    raise LimitExceeded(f"tenant {tenant!r} has {lim} queries running, its limit "
                                        f"(limits.max_concurrent_queries); retry later", status=429)
                self._running[tenant] = self._running.get(tenant, 0) + 1
        try:
            yield
        finally:
            if lim > 0:
                with self._lock:
                    self._running[tenant] -= 1


class SeriesAdmission:
    """What remote write checks for one tenant (ingest.remote_write.Admission): the tenant label
    and the input limits once per series the decoder has not seen, the active-series and rate
    limits once per request. One per (tenant, Limits): a reloaded Limits gets new admissions, so
    the decoder re-checks every series under the new limits."""

    def __init__(self, tenant: str, limits: Limits | None):
        self.tenant = tenant
        self.limits = limits

    def series(self, labels: Labels) -> Labels:
        lbl = tenant_labels(labels, self.tenant)
        if self.limits is not None:
            self.limits.check_series(lbl, self.tenant)
        return lbl

    def batch(self, batch: SampleBatch, new_series: list[Labels]) -> None:
        batch.tenant = self.tenant
        if self.limits is not None:
            self.limits.check_batch(batch, self.tenant, new_series)
