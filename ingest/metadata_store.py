"""Metric metadata (TYPE/HELP/UNIT) seen by ingest, for /api/v1/metadata.

API (read by turboprom/routes/metadata_api.py):
    store = ctx.components.metadata          # MetadataStore
    store.get(metric=None, limit=None, limit_per_metric=None, tenant="default") -> dict[str, list[dict]]
        {"http_requests_total": [{"type": "counter", "help": "...", "unit": ""}], ...}
        ``limit`` caps the number of metrics, ``limit_per_metric`` the entries per metric
        (both None/negative = no limit), matching Prometheus's /api/v1/metadata parameters.
    store.update(list[storage.batch.MetricMetadata], tenant="default") records entries (distinct per metric).
Kept per tenant (X-Scope-OrgID): one tenant's HELP/TYPE never shows up in, or evicts, another's.
Memory: in-memory only (rebuilt as scrapes and remote writes arrive, as in Prometheus).
"""
from __future__ import annotations

import threading
import time
from typing import Iterable

from storage.batch import MetricMetadata
from storage.labels import DEFAULT_TENANT

MAX_PER_METRIC = 16
RECORD_AGAIN_S = 60.0  # a list recorded this recently is skipped when it comes again (see update)


class MetadataStore:
    def __init__(self, max_metrics: int = 200_000):
        self._lock = threading.Lock()
        self._tenants: dict[str, dict[str, dict[tuple[str, str, str], None]]] = {}
        self.max_metrics = max_metrics  # per tenant
        # tenant -> (the list recorded last, when): senders repeat a body's comment block, and the
        # text walk (ingest/text_native.py) hands out the same, never mutated, list for it
        self._last: dict[str, tuple[object, float]] = {}

    def update(self, items: Iterable[MetricMetadata], tenant: str | None = None) -> None:
        tenant = tenant or DEFAULT_TENANT
        now = time.monotonic()
        last = self._last.get(tenant)
        if last is not None and last[0] is items and now - last[1] < RECORD_AGAIN_S:
            return
        with self._lock:
            self._last[tenant] = (items, now)
            data = self._tenants.setdefault(tenant, {})
            for m in items:
                if not m.metric_family:
                    continue
                entry = ((m.type or "unknown").lower(), m.help or "", m.unit or "")
                d = data.get(m.metric_family)
                if d is None:
                    if len(data) >= self.max_metrics:
                        continue
                    d = data[m.metric_family] = {}
                if entry in d:
                    continue
                if len(d) >= MAX_PER_METRIC:
                    d.pop(next(iter(d)))
                d[entry] = None

    def get(self, metric: str | None = None, limit: int | None = None,
            limit_per_metric: int | None = None, tenant: str | None = None) -> dict[str, list[dict]]:
        with self._lock:
            data = self._tenants.get(tenant or DEFAULT_TENANT, {})
            names = [metric] if metric else sorted(data)
            out: dict[str, list[dict]] = {}
            for name in names:
                if limit is not None and limit >= 0 and len(out) >= limit:
                    break
                d = data.get(name)
                if not d:
                    continue
                entries = [{"type": t, "help": h, "unit": u} for t, h, u in d]
                if limit_per_metric is not None and limit_per_metric > 0:
                    entries = entries[:limit_per_metric]
                out[name] = entries
            return out

    def __len__(self) -> int:
        return sum(len(d) for d in self._tenants.values())
