"""An ingester's partition reads, over the project's HTTP stack (aiohttp), for queriers.

HTTP rather than Arrow Flight: the ingester already serves HTTP with the server's timeouts, body
limits and auth middleware on one port, and the body is the same Arrow IPC stream Flight would
carry (columns_codec), so a second server framework and port would add nothing but moving parts.

- ``POST /internal/cluster/v1/select`` ``{"matchers": [[name, op, value], ...], "mint", "maxt",
  "partitions": [...]}`` -> Arrow IPC (columns_codec.encode_series_set) of the matching series of
  exactly those partitions (series of other partitions this node also holds are filtered out);
- ``POST /internal/cluster/v1/series`` / ``labels`` / ``label_values`` -> JSON (unions, so the
  querier needs no per-partition filtering for them);
- ``POST /internal/cluster/v1/metadata`` ``{"metric", "limit_per_metric", "tenant"}`` -> JSON, the
  node's metric metadata of that tenant (what its applied log messages carried);
- ``POST /internal/cluster/v1/head_range`` ``{"matchers"}`` -> JSON ``{"numSeries", "minTime",
  "maxTime"}`` of the node's head samples of the matching series (for the status pages);
- ``POST /internal/cluster/v1/aggregate`` (partition_eval.PartialRequest: the query text, the
  aggregation's position in it, tenant, partitions, steps and the query's bounds and limits) ->
  Arrow IPC (columns_codec.encode_partial) of the aggregation's partial state over exactly those
  partitions, for the querier to merge (pushdown_hook.py); a PromQL error is answered 422 in the
  API's error envelope and the querier evaluates that aggregation itself;
- ``POST /internal/cluster/v1/frontier`` ``{"since": seq}`` -> JSON ``{"epoch", "seq", "sealed",
  "oldest"}``: this process's write log (planner/step_answers.py ``WriteFrontier``): its sequence,
  the time up to which every live sample has arrived, and the oldest timestamp written at or below
  that since ``since``; a querier's reused step answers rely on it (cluster_frontier.py);
- ``GET /internal/cluster/v1/status`` -> the node's owned, caught-up and applied sequences; with
  ``?lag=1`` also each owned partition's messages on the log not yet applied.
"""
from __future__ import annotations

import uuid
from typing import Any, Sequence

import orjson
from aiohttp import web

from prometheus_client import Counter

from planner.step_answers import EVERYTHING
from promql.errors import PromQLError
from storage.matchers import Matcher
from turboprom.api_common import run_off_loop
from turboprom.api_errors import error_response
from turboprom.cluster import columns_codec
from turboprom.cluster.partition_eval import PartialRequest, PartitionIndex, evaluate_partial, only_partitions
from turboprom.context import ServerContext
from turboprom.tenancy import validate_tenant

PREFIX = "/internal/cluster/v1"
PUSHDOWN = Counter("turboprom_cluster_pushdown_requests", "Pushed-down aggregations asked of this ingester by queriers: "
                   "answered with a partial state, or refused (a PromQL error; the querier then evaluates raw).", ["outcome"])
ARROW_STREAM = "application/vnd.apache.arrow.stream"


def matchers_json(ms: Sequence[Matcher]) -> list[list[str]]:
    return [[m.name, m.op, m.value] for m in ms]


def matchers_from_json(items: Any) -> list[Matcher]:
    return [Matcher(str(n), str(op), str(v)) for n, op, v in items]


def setup(app: web.Application, ctx: ServerContext) -> None:
    ingester = ctx.components.partition_ingester
    storage = ctx.storage
    total = ingester.settings.partitions
    planned = ctx.components.planned_engine  # pushed sub-trees are learnt and answered from exact summaries
    index = PartitionIndex(total)

    async def body(request: web.Request) -> dict:
        return orjson.loads(await request.read())

    async def select(request: web.Request) -> web.Response:
        try:
            q = await body(request)
            ms = matchers_from_json(q["matchers"])
            mint, maxt, wanted = int(q["mint"]), int(q["maxt"]), set(map(int, q["partitions"]))
        except (KeyError, TypeError, ValueError) as e:
            return error_response("bad_data", f"select: {e}")

        def job() -> bytes:
            ss = storage.select(ms, mint, maxt)
            if not ingester.held <= wanted:
                ss = only_partitions(ss, wanted, total)
            return columns_codec.encode_series_set(ss)

        return web.Response(body=await run_off_loop(ctx, job), content_type=ARROW_STREAM)

    async def aggregate(request: web.Request) -> web.Response:
        try:
            req = PartialRequest.from_json(await body(request))
            out = await run_off_loop(ctx, evaluate_partial, storage, req, set(ingester.held), total, planned, index)
        except PromQLError as e:
            PUSHDOWN.labels("refused").inc()
            return error_response(e.error_type, str(e), 422)
        except (KeyError, TypeError, ValueError) as e:
            PUSHDOWN.labels("refused").inc()
            return error_response("bad_data", f"aggregate: {e}", 400)
        PUSHDOWN.labels("answered").inc()
        return web.Response(body=out, content_type=ARROW_STREAM)

    async def series(request: web.Request) -> web.Response:
        try:
            q = await body(request)
            sets = [matchers_from_json(s) for s in q["matcher_sets"]]
            mint, maxt = int(q["mint"]), int(q["maxt"])
        except (KeyError, TypeError, ValueError) as e:
            return error_response("bad_data", f"series: {e}")
        out = await run_off_loop(ctx, storage.series, sets, mint, maxt)
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def labels(request: web.Request) -> web.Response:
        try:
            q = await body(request)
            sets = [matchers_from_json(s) for s in q.get("matcher_sets", [])]
            mint, maxt, name = int(q["mint"]), int(q["maxt"]), q.get("name")
        except (KeyError, TypeError, ValueError) as e:
            return error_response("bad_data", f"labels: {e}")
        if name is None:
            out = await run_off_loop(ctx, storage.label_names, mint, maxt, sets)
        else:
            out = await run_off_loop(ctx, storage.label_values, str(name), mint, maxt, sets)
        return web.Response(body=orjson.dumps(list(out)), content_type="application/json")

    async def metadata(request: web.Request) -> web.Response:
        try:
            q = await body(request)
            metric, per, tenant = q.get("metric"), q.get("limit_per_metric"), validate_tenant(str(q["tenant"]))
            per = int(per) if per is not None else None
        except (KeyError, TypeError, ValueError) as e:
            return error_response("bad_data", f"metadata: {e}")
        store = ctx.components.metadata
        out = {} if store is None else await run_off_loop(ctx, store.get, metric or None, None, per, tenant)
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def head_range(request: web.Request) -> web.Response:
        try:
            ms = matchers_from_json((await body(request))["matchers"])
        except (KeyError, TypeError, ValueError) as e:
            return error_response("bad_data", f"head_range: {e}")
        st = await run_off_loop(ctx, storage.head_stats_of, ms)
        return web.json_response({k: int(st[k]) for k in ("numSeries", "minTime", "maxTime")})

    async def status(request: web.Request) -> web.Response:
        st = ingester.status()
        if request.query.get("lag") == "1":  # asks the log for each partition's last sequence
            try:
                st["lag"] = {str(p): n for p, n in (await ingester.lag()).items()}
            except Exception as e:  # noqa: BLE001 - the log unreachable: say so, the rest stands
                st["lag_error"] = repr(e)
        return web.json_response(st)

    epoch = uuid.uuid4().hex  # this process's write log: a querier seeing a new one forgets what it kept

    async def frontier(request: web.Request) -> web.Response:
        try:
            since = int((await body(request))["since"])
        except (KeyError, TypeError, ValueError) as e:
            return error_response("bad_data", f"frontier: {e}")
        summ = ctx.components.summarizer
        if summ is None:  # no write log here: nothing a querier kept can be trusted
            return web.json_response({"epoch": epoch, "seq": 0, "sealed": int(EVERYTHING), "oldest": int(EVERYTHING)})
        seq, sealed = summ.frontier.arm()  # first: a write logged in between is reported again, never lost
        oldest = summ.frontier.oldest_since(since)
        return web.json_response({"epoch": epoch, "seq": int(seq), "sealed": int(sealed), "oldest": int(oldest)})

    app.router.add_post(PREFIX + "/frontier", frontier)
    app.router.add_post(PREFIX + "/select", select)
    app.router.add_post(PREFIX + "/aggregate", aggregate)
    app.router.add_post(PREFIX + "/series", series)
    app.router.add_post(PREFIX + "/labels", labels)
    app.router.add_post(PREFIX + "/metadata", metadata)
    app.router.add_post(PREFIX + "/head_range", head_range)
    app.router.add_get(PREFIX + "/status", status)
