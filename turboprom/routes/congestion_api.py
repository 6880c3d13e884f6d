"""The congestion API: polls, server-sent events, pushed load, and prefix-aware placement.

  GET  /api/v1/congestion          the tracker's ready-made snapshot (JSON poll); ``ETag`` per snapshot,
                                   ``If-None-Match`` with it answers 304 while nothing changed
  GET  /api/v1/congestion/stream   server-sent events: a full ``congestion`` event, then one per new
                                   snapshot, or with ``delta=true`` ``delta`` events holding only the
                                   entries that changed and the keys that went away; ``interval``
                                   (default ``congestion.stream_interval``) paces them
  POST /api/v1/congestion/push     engines that report their own load: a text-exposition body of the
                                   tracker's families, fed to the tracker only (not stored: the normal
                                   scrape or remote write stores at its interval)
  POST /api/v1/congestion/prefix   ``{"token_ids": [...]}`` -> per instance, how many leading blocks of
                                   that prompt it holds (from vLLM KV events) and how loaded it is

Polls and streams read the tracker's snapshot (ctx.components.congestion); nothing here touches
storage, so polls stay fast while ingestion and heavy queries run. Documented in docs/openapi.yaml.

Tenancy: the tracker consumes the default tenant's samples only (turboprom/tenancy.py restrict_sinks),
so a caller acting as another tenant (X-Scope-OrgID) gets an empty view of the same shape (no
instances, no clusters, version 0), and its stream never wakes on the default tenant's updates (their
timing would tell that tenant's ingest activity).
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from ingest.errors import IngestError
from ingest.text_import import TextImporter
from turboprom.api_errors import ParamError, error_response
from turboprom.context import ServerContext
from turboprom.tenancy import DEFAULT_TENANT, request_tenant

FILTERS = ("cluster", "model_name", "instance")
# ``model`` was the filter's name before entries were labelled ``model_name`` (vLLM's label); still accepted.
FILTER_ALIASES = {"model": "model_name"}
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
HEARTBEAT_S = 15.0


def _bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ParamError(f"invalid parameter {name!r}: expected true or false, got {raw!r}")


def _number(request: web.Request, name: str, lo: float, hi: float) -> float | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ParamError(f"invalid parameter {name!r}: cannot parse {raw!r} to a number") from None
    if not math.isfinite(v) or not lo <= v <= hi:
        raise ParamError(f"invalid parameter {name!r}: must be between {lo:g} and {hi:g}, got {raw!r}")
    return v


def _filters(request: web.Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in FILTERS:
        vals = request.query.getall(name, [])
        if any(v == "" for v in vals):
            raise ParamError(f"invalid parameter {name!r}: empty value")
        out[name] = vals
    for alias, name in FILTER_ALIASES.items():
        vals = request.query.getall(alias, [])
        if any(v == "" for v in vals):
            raise ParamError(f"invalid parameter {alias!r}: empty value")
        out[name] = out[name] + vals
    out["include_stale"] = _bool(request, "include_stale", True)
    out["tenant"] = request_tenant(request)
    return out


def _entry_key(d: dict[str, Any]) -> tuple[str, str, str]:
    return (d["cluster"], d["model_name"], d.get("instance", ""))


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Equal but for ``age_seconds``, which moves with every snapshot (a client derives it from
    ``generated_at`` and the entry's ``newest_sample_ms``)."""
    return a is not None and len(a) == len(b) and all(k == "age_seconds" or a.get(k) == v for k, v in b.items())


def delta(prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
    """What changed from one snapshot's data to the next: changed or new instance and cluster entries
    (whole entries), and the keys of those that went away. Applying it to ``prev`` gives ``cur`` (ages
    aside: an entry not resent is ``generated_at - newest_sample_ms / 1000`` seconds old)."""
    out: dict[str, Any] = {"generated_at": cur["generated_at"], "version": cur["version"]}
    for part, gone in (("instances", "removed_instances"), ("clusters", "removed_clusters")):
        before = {_entry_key(d): d for d in prev[part]}
        now = {_entry_key(d): d for d in cur[part]}
        out[part] = [d for k, d in now.items() if not _same(before.get(k), d)]
        out[gone] = [list(k) if part == "instances" else list(k[:2]) for k in before.keys() - now.keys()]
    return out


def snapshot_etag(epoch: int, version: int) -> str:
    """The ``ETag`` of a snapshot's bodies: unchanged while the snapshot is (a poller sending it back
    in ``If-None-Match`` gets 304 and no body)."""
    return f'"{epoch:x}-{version}"'


def not_modified(request: web.Request, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag`` (or ``*``); weak tags compare equal, as for GET."""
    raw = request.headers.get("If-None-Match")
    if not raw:
        return False
    for tag in raw.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


def _tenant_snapshot(snap: Any) -> Any:
    """What a tenant other than the default sees: the same shape with nothing in it."""
    from scheduler_metrics.congestion.tracker import CongestionSnapshot

    return CongestionSnapshot(0, time.time(), [], [], snap.model)


def setup(app: web.Application, ctx: ServerContext) -> None:
    def tracker_or_error() -> Any:
        return ctx.components.congestion

    no_tracker = "congestion tracker is not configured on this server"

    async def tracker_view(request: web.Request) -> tuple[Any, dict[str, Any]] | web.Response:
        """(snapshot the caller's tenant sees, filters), or the error answer."""
        tracker = tracker_or_error()
        if tracker is None:
            return error_response("unavailable", no_tracker)
        try:
            f = _filters(request)
        except ParamError as e:
            return error_response("bad_data", str(e))
        if f["tenant"] != DEFAULT_TENANT:
            return _tenant_snapshot(tracker.snapshot()), f
        return await fresh_snapshot(tracker), f

    async def congestion(request: web.Request) -> web.StreamResponse:
        view = await tracker_view(request)
        if isinstance(view, web.Response):
            return view
        snap, f = view
        if f["tenant"] != DEFAULT_TENANT:  # the empty view: nothing to revalidate
            return web.Response(body=snap.body_for(), content_type="application/json")
        etag = snapshot_etag(tracker_or_error().epoch, snap.version)
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if not_modified(request, etag):
            return web.Response(status=304, headers=headers)
        body = snap.body_for(f["cluster"], f["model_name"], f["instance"], f["include_stale"])
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def stream(request: web.Request) -> web.StreamResponse:
        tracker = tracker_or_error()
        if tracker is None:
            return error_response("unavailable", no_tracker)
        try:
            f = _filters(request)
            interval_q = _number(request, "interval", 0.0, 3600.0)
            limit_f = _number(request, "limit", 1, 1_000_000)
            as_delta = _bool(request, "delta", False)
        except ParamError as e:
            return error_response("bad_data", str(e))
        if limit_f is not None and limit_f != int(limit_f):
            return error_response("bad_data", f"invalid parameter 'limit': must be an integer, got {limit_f:g}")
        limit = int(limit_f) if limit_f is not None else None
        interval = tracker.config.stream_interval_s if interval_q is None else interval_q
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_snapshot(_: Any) -> None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # loop closed during shutdown
                pass

        own = f["tenant"] == DEFAULT_TENANT
        unsubscribe = tracker.subscribe(on_snapshot) if own else (lambda: None)
        sent = 0
        last_version = -1
        last_data: dict[str, Any] | None = None
        try:
            await resp.write(b"retry: 1000\n\n")
            if own:
                await fresh_snapshot(tracker)  # the first event is as fresh as a busy tracker's
            while True:
                wake.clear()
                snap = tracker.snapshot() if own else _tenant_snapshot(tracker.snapshot())
                if snap.version != last_version:
                    last_version = snap.version
                    data = snap.filtered(f["cluster"], f["model_name"], f["instance"], f["include_stale"])
                    if as_delta and last_data is not None:
                        d = delta(last_data, data)
                        last_data = data
                        if not d["instances"] and not d["clusters"] and not d["removed_instances"] \
                                and not d["removed_clusters"]:
                            continue  # nothing this client sees changed
                        await resp.write(b"event: delta\nid: %d\ndata: %s\n\n" % (snap.version, orjson.dumps(d)))
                    else:
                        last_data = data
                        await resp.write(b"event: congestion\nid: %d\ndata: %s\n\n" % (snap.version, orjson.dumps(data)))
                    sent += 1
                    if limit is not None and sent >= limit:
                        break
                    if interval > 0:
                        await asyncio.sleep(interval)
                        continue
                try:
                    await asyncio.wait_for(wake.wait(), timeout=HEARTBEAT_S)
                except asyncio.TimeoutError:
                    await resp.write(b": keepalive\n\n")
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            unsubscribe()
        try:
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    importer = TextImporter()

    async def push(request: web.Request) -> web.StreamResponse:
        tracker = tracker_or_error()
        if tracker is None:
            return error_response("unavailable", no_tracker)
        try:
            tenant = request_tenant(request)
        except ParamError as e:
            return error_response("bad_data", str(e))
        if tenant != DEFAULT_TENANT:
            return error_response("bad_data", "pushed load feeds the operator's congestion view: send it without "
                                              "X-Scope-OrgID (the default tenant)")
        if request.content_length is not None and request.content_length > MAX_PUSH_BYTES:
            return error_response("bad_data", f"push body over {MAX_PUSH_BYTES} bytes: send only the tracker's families",
                                  413)
        body = await request.read()
        if len(body) > MAX_PUSH_BYTES:
            return error_response("bad_data", f"push body over {MAX_PUSH_BYTES} bytes: send only the tracker's families",
                                  413)
        openmetrics = "openmetrics" in (request.content_type or "").lower() or None

        def work() -> int:
            batch = importer.to_batch(body, default_ts_ms=int(time.time() * 1000), openmetrics=openmetrics)
            tracker.consume_now(batch)
            return len(batch)

        try:
            n = await asyncio.get_running_loop().run_in_executor(ctx.executor, work)
        except IngestError as e:
            return error_response("bad_data", e.message)
        return web.Response(content_type="application/json",
                            body=orjson.dumps({"status": "success", "data": {"samples": n}}))

    async def prefix(request: web.Request) -> web.StreamResponse:
        tracker = tracker_or_error()
        index = ctx.components.prefix_index
        if tracker is None or index is None:
            return error_response("unavailable", "no KV event view on this server (configure congestion.kv_events)")
        return await prefix_response(request, index, tracker.snapshot, ctx.executor)

    async def model_server_metrics(request: web.Request) -> web.StreamResponse:
        view = await tracker_view(request)
        if isinstance(view, web.Response):
            return view
        snap, f = view
        inst = request.match_info["instance"]
        rows = [d for d in snap.instances if d["instance"] == inst
                and (not f["cluster"] or d["cluster"] in f["cluster"])
                and (not f["model_name"] or d["model_name"] in f["model_name"])]
        if not rows:
            return error_response("not_found", f"no instance {inst!r} in the congestion view (with these filters)")
        index = ctx.components.prefix_index
        sizes = index.block_sizes() if index is not None else {}
        return web.Response(body=model_server_text(rows, sizes), content_type="text/plain",
                            charset="utf-8", headers={"Cache-Control": "no-store"})

    app.router.add_get("/api/v1/congestion", congestion)
    app.router.add_get("/api/v1/congestion/model_server/{instance}/metrics", model_server_metrics)
    app.router.add_get("/api/v1/congestion/stream", stream)
    app.router.add_post("/api/v1/congestion/push", push)
    app.router.add_post("/api/v1/congestion/prefix", prefix)


# The Gateway API Inference Extension's model-server protocol (what llm-d's endpoint picker scrapes
# from each model server): its metric -> the vLLM name the picker reads -> the tracker's field.
MODEL_SERVER_METRICS = (
    ("TotalQueuedRequests", "vllm:num_requests_waiting", "queue_length"),
    ("TotalRunningRequests", "vllm:num_requests_running", "running"),
    ("KVCacheUtilization", "vllm:kv_cache_usage_perc", "kv_usage"),
)


def _label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def model_server_text(rows: list[dict[str, Any]], block_sizes: dict[tuple[str, str, str], list[int]]) -> bytes:
    """One instance's load as the model-server metrics a picker reads, in the text exposition format
    (vLLM's names, ``model_name`` label), plus the data age so a picker can refuse stale numbers."""
    out: list[str] = []
    for proto, name, fieldname in MODEL_SERVER_METRICS + (("", "turboprom_congestion_age_seconds", "age_seconds"),):
        out.append(f"# HELP {name} {proto + ' (Gateway API Inference Extension model-server protocol)' if proto else 'Age of the newest sample behind these values.'}")
        out.append(f"# TYPE {name} gauge")
        for d in rows:
            v = d.get(fieldname)
            if v is not None:
                out.append(f'{name}{{model_name="{_label_value(d["model_name"])}"}} {float(v)!r}')
    loras = [(d["model_name"], d["lora"]) for d in rows if d.get("lora")]
    if loras:  # the protocol's LoRA adapters, as vLLM exports them (the value is the update time)
        out.append("# HELP vllm:lora_requests_info Running stats on lora requests.")
        out.append("# TYPE vllm:lora_requests_info gauge")
        for model, lo in loras:
            max_lora = "" if lo["max_lora"] is None else str(lo["max_lora"])
            out.append(f'vllm:lora_requests_info{{max_lora="{max_lora}",model_name="{_label_value(model)}",'
                       f'running_lora_adapters="{_label_value(",".join(lo["running"]))}",'
                       f'waiting_lora_adapters="{_label_value(",".join(lo["waiting"]))}"}} {float(lo["updated_at"])!r}')
    sizes = sorted({bs for d in rows for bs in block_sizes.get(_entry_key(d), [])})
    if sizes:  # the protocol's optional BlockSize, as vLLM labels it
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.extend(f'vllm:cache_config_info{{block_size="{bs}"}} 1.0' for bs in sizes)
    return ("\n".join(out) + "\n").encode()


MAX_PUSH_BYTES = 4 * 1024 * 1024
MAX_PROMPT_TOKENS = 1_000_000
# Load fields of an instance entry returned beside its prefix match.
PREFIX_LOAD_FIELDS = ("queue_length", "running", "kv_usage", "backlog_seconds", "utilization",
                      "congestion_price_seconds_per_token", "age_seconds", "stale")


CATCH_UP_S = 1.0  # longest a read after an idle spell waits for the rebuild it starts


async def fresh_snapshot(tracker: Any) -> Any:
    """The tracker's snapshot for a read on the event loop: after an idle spell (no reader for
    ``congestion.idle_after``) the read wakes the refresher and waits, off the loop, for that rebuild."""
    version = tracker.catch_up()
    if version is not None:
        await asyncio.get_running_loop().run_in_executor(None, tracker.wait_newer, version, CATCH_UP_S)
    return tracker.snapshot()


# A prompt this size or smaller is parsed and hashed on the event loop (tens of microseconds): a hop
# to a worker thread would queue it behind ingest and query work for longer than the work itself.
INLINE_PREFIX_BYTES = 16 * 1024


async def prefix_response(request: web.Request, index: Any, snapshot: Any, executor: Any) -> web.Response:
    """``POST /api/v1/congestion/prefix`` against ``index`` (a PrefixIndex) with the load of
    ``snapshot()`` (the tracker's, or the poll process's copy): the main server and the poll process
    answer it alike."""
    body = await request.read()
    try:
        f = _filters(request)
    except ParamError as e:
        return error_response("bad_data", str(e))
    own = f["tenant"] == DEFAULT_TENANT

    def work() -> tuple[int, Any]:
        q = _prefix_query(body)
        return len(q["token_ids"]), (index.match(q["token_ids"], q["lora_id"]) if own else None)

    try:
        if len(body) <= INLINE_PREFIX_BYTES:
            n_tokens, matches = work()
        else:  # a prompt is up to MAX_PROMPT_TOKENS: parsed and hashed off the loop
            n_tokens, matches = await asyncio.get_running_loop().run_in_executor(executor, work)
    except ParamError as e:
        return error_response("bad_data", str(e))
    if not own:
        return web.Response(content_type="application/json", body=orjson.dumps(
            {"status": "success", "data": {"prompt_tokens": n_tokens, "instances": []}}))
    snap = snapshot()
    load = {_entry_key(d): d for d in snap.instances}
    cs, ms, ins = set(f["cluster"]), set(f["model_name"]), set(f["instance"])
    rows = []
    for key, m in matches.items():
        c, mdl, inst = key
        if (cs and c not in cs) or (ms and mdl not in ms) or (ins and inst not in ins):
            continue
        d = load.get(key)
        if d is not None and d["stale"] and not f["include_stale"]:
            continue
        rows.append({"cluster": c, "model_name": mdl, "instance": inst, **m,
                     **{k: (d or {}).get(k) for k in PREFIX_LOAD_FIELDS}, "load_known": d is not None})
    rows.sort(key=lambda r: (-r["matched_blocks"], r["congestion_price_seconds_per_token"] is None,
                             r["congestion_price_seconds_per_token"] or 0.0, r["instance"]))
    return web.Response(content_type="application/json", body=orjson.dumps(
        {"status": "success", "data": {"prompt_tokens": n_tokens, "snapshot_version": snap.version,
                                       "generated_at": snap.generated_at, "instances": rows}}))


def _prefix_query(body: bytes) -> dict[str, Any]:
    try:
        q = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ParamError(f"body is not JSON: {e}") from None
    if not isinstance(q, dict):
        raise ParamError('body must be a JSON object like {"token_ids": [1, 2, 3]}')
    unknown = sorted(set(q) - {"token_ids", "lora_id"})
    if unknown:
        raise ParamError(f"unknown field(s) {', '.join(unknown)} (known: token_ids, lora_id)")
    toks = q.get("token_ids")
    bad = "token_ids must be a list of non-negative integers (the prompt's token ids)"
    if not isinstance(toks, list):
        raise ParamError(bad)
    if len(toks) > MAX_PROMPT_TOKENS:
        raise ParamError(f"token_ids: at most {MAX_PROMPT_TOKENS} tokens, got {len(toks)}")
    try:  # checked in bulk: an object array (bools, floats, strings, nested lists) or a negative id is refused
        arr = np.asarray(toks)
    except (ValueError, OverflowError):
        raise ParamError(bad) from None
    if toks and (arr.dtype.kind != "i" or arr.ndim != 1 or bool((arr < 0).any())):
        raise ParamError(bad)
    lora = q.get("lora_id")
    if lora is not None and (not isinstance(lora, int) or isinstance(lora, bool) or not 0 <= lora < 2**63):
        raise ParamError(f"lora_id must be a non-negative integer or null, got {lora!r}")
    return {"token_ids": toks, "lora_id": lora}
