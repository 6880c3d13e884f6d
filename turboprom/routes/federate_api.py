"""GET /federate?match[]=...: the latest sample of every matching series, as text exposition 0.0.4.

As Prometheus's federation: a series is exposed when it has a sample within the lookback delta
before now (``--query.lookback-delta``, 5 m by default) and that latest sample is not a stale
marker; its timestamp is written in ms, and a series without an ``instance`` label gets
``instance=""`` (a scraper with ``honor_labels: true`` then adds none). Unlike Prometheus, at least
one ``match[]`` is required (400 otherwise; Prometheus 2.42 answers an empty body), and families
carry their ``# TYPE`` from the metadata store where known (turboprom/exposition.py).

Reads go through the caller's tenant view like ``/api/v1/series``: a tenant federates only its own
series, and the role needed is ``read`` (turboprom/auth.py). Selection and encoding run off the
event loop.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
from aiohttp import web

from storage.stale import is_stale
from turboprom import exposition
from turboprom.api_errors import APIError
from turboprom.api_common import api_handler, run_off_loop
from turboprom.api_params import Params, invalid_param, parse_matchers_param
from turboprom.context import ServerContext
from turboprom.remote_read import visible_matchers
from turboprom.tenancy import tenant_storage


def latest_samples(view: Any, matcher_sets: list, mint: int, maxt: int) -> tuple[list, np.ndarray, np.ndarray]:
    """(labels, timestamps, values) of the newest sample in [mint, maxt] of every series matching any
    of the sets, stale ones dropped, sorted by labels."""
    found: set = set()
    labels_out: list = []
    ts_parts, v_parts = [], []
    for ms in matcher_sets:
        ms = visible_matchers(ms)  # the tenant label is never visible: matchers read it as ""
        if ms is None:
            continue
        ss = view.select(ms, mint, maxt)
        if len(ss) == 0:
            continue
        counts = np.diff(ss.offsets)
        nonempty = np.flatnonzero(counts > 0)
        last = ss.offsets[1:][nonempty] - 1
        t, v = ss.timestamps[last], ss.values[last]
        keep = ~is_stale(v)
        idx = nonempty[keep]
        t, v = t[keep], v[keep]
        for j, s in enumerate(idx.tolist()):  # per series (one sample each): dedupe across match[] sets
            lbl = ss.labels[s]
            if lbl not in found:
                found.add(lbl)
                labels_out.append(lbl)
                ts_parts.append(t[j:j + 1])
                v_parts.append(v[j:j + 1])
    if not labels_out:
        return [], np.empty(0, np.int64), np.empty(0, np.float64)
    ts = np.concatenate(ts_parts)
    vs = np.concatenate(v_parts)
    order = sorted(range(len(labels_out)), key=labels_out.__getitem__)
    return [labels_out[i] for i in order], ts[order], vs[order]


def metadata_types(store: Any, tenant: str):
    """A ``name -> type or None`` lookup over the ingest metadata store for one tenant (memoized)."""
    cache: dict[str, str | None] = {}

    def type_of(name: str) -> str | None:
        if name not in cache:
            got = store.get(name, None, None, tenant=tenant) if store is not None and hasattr(store, "get") else {}
            entries = got.get(name) or []
            cache[name] = str(entries[-1].get("type", "unknown")) if entries else None
        return cache[name]

    return type_of


def setup(app: web.Application, ctx: ServerContext) -> None:

    @api_handler
    async def federate(request: web.Request, params: Params) -> web.StreamResponse:
        view = tenant_storage(ctx, request)  # the caller's tenant only, as /api/v1/series
        matches = params.getall("match[]")
        if not matches:
            raise APIError("bad_data", "no match[] parameter provided")
        try:
            sets = await run_off_loop(ctx, parse_matchers_param, matches)  # regexes compile off the loop
        except ValueError as e:
            raise invalid_param("match[]", str(e)) from None
        maxt = int(time.time() * 1000)
        mint = maxt - int(ctx.config.lookback_delta_ms)
        type_of = metadata_types(ctx.components.metadata, view.tenant)

        def job() -> bytes:
            labels, ts, vs = latest_samples(view, sets, mint, maxt)
            return exposition.encode(labels, ts, vs, type_of)

        body = await run_off_loop(ctx, job)
        return web.Response(body=body, headers={"Content-Type": exposition.CONTENT_TYPE})

    app.router.add_get("/federate", federate)
