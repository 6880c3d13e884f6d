"""The querier's metric metadata (TYPE/HELP/UNIT, for ``/api/v1/metadata`` and ``/federate``).

Metadata arrives with remote writes, travels in the ingest log's message headers, and is kept by
each ingester that applies a message of the tenant (ingest/metadata_store.py). A querier ingests
nothing, so its own store would always be empty: this one answers from the ingesters instead,
the union of what the owners covering every partition hold (FanoutStorage.metadata), in the
single node's order (metric names sorted, each metric's distinct entries in the order first seen).

A tenant's whole metadata is fetched at most once per ``SNAPSHOT_S`` and every ``get`` in that
time is answered from it: ``/federate`` asks for each metric family it emits, one at a time, and
500 families would otherwise be 500 fan-outs (bench/cluster_federate.py: 852 ms against the single
node's 11 ms; 58 ms with the snapshot, docs/cluster.md). Metadata written since shows up
within ``SNAPSHOT_S`` after the ingesters applied it.

Same interface as ``ingest.metadata_store.MetadataStore.get``; ``update`` keeps nothing. Called
from worker threads (the routes build their answers off the event loop), as the storage reads are.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable

from ingest.metadata_store import MAX_PER_METRIC
from storage.labels import DEFAULT_TENANT

SNAPSHOT_S = 1.0


def merge_metadata(answers: Iterable[dict[str, list[dict]]], limit_per_metric: int | None = None) -> dict[str, list[dict]]:
    """The union of several stores' answers: metric -> distinct entries, first seen first."""
    merged: dict[str, dict[tuple[str, str, str], None]] = {}
    for got in answers:
        for metric, entries in got.items():
            d = merged.setdefault(metric, {})
            for e in entries:
                d[(str(e.get("type", "unknown")), str(e.get("help", "")), str(e.get("unit", "")))] = None
    out: dict[str, list[dict]] = {}
    for metric in sorted(merged):
        entries = [{"type": t, "help": h, "unit": u} for t, h, u in merged[metric]][-MAX_PER_METRIC:]
        if limit_per_metric is not None and limit_per_metric > 0:
            entries = entries[:limit_per_metric]
        out[metric] = entries
    return out


class FanoutMetadata:
    def __init__(self, fanout: Any, snapshot_s: float = SNAPSHOT_S):
        self.fanout = fanout  # turboprom.cluster.fanout_storage.FanoutStorage
        self.snapshot_s = snapshot_s
        self._fetch = threading.Lock()  # concurrent askers wait for one fan-out, not one each
        self._snapshots: dict[str, tuple[float, dict[str, list[dict]]]] = {}  # tenant -> (taken at, metadata)

    def _snapshot(self, tenant: str) -> dict[str, list[dict]]:
        with self._fetch:
            now = time.monotonic()
            for t in [t for t, (at, _) in self._snapshots.items() if now - at > self.snapshot_s]:
                del self._snapshots[t]  # expired ones go: memory holds only tenants asked about just now
            got = self._snapshots.get(tenant)
            if got is not None:
                return got[1]
            data = self.fanout.metadata(None, None, tenant)
            self._snapshots[tenant] = (now, data)
            return data

    def get(self, metric: str | None = None, limit: int | None = None, limit_per_metric: int | None = None,
            tenant: str | None = None) -> dict[str, list[dict]]:
        snap = self._snapshot(tenant or DEFAULT_TENANT)
        if metric:
            out = {metric: snap[metric]} if metric in snap else {}
        else:
            out = snap
        if limit_per_metric is not None and limit_per_metric > 0:
            out = {k: v[:limit_per_metric] for k, v in out.items()}
        if limit is not None and limit >= 0:
            out = dict(list(out.items())[:limit])
        return out

    def update(self, items: Any, tenant: str | None = None) -> None:
        """A querier stores nothing; metadata is kept where it is ingested."""

    def __len__(self) -> int:
        return 0
