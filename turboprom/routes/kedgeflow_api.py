"""KedgeFlow over HTTP: propose (decide + grant), execute (gateway), revoke, and the audit log.

Every propose/execute/revoke writes audit entries, so what one request may cost the log is bounded
(server YAML, all optional):

  kedgeflow:
    max_body_bytes: 65536      # request body limit: 413 beyond it (checked before the body is read)
    max_params_bytes: 8192     # canonical JSON of an action's params: 413 beyond it
    max_name_chars: 256        # verb and target length: 400 beyond it
    rate_limit:                # audit-writing requests per principal (token bucket): 429 + Retry-After
      requests_per_second: 2
      burst: 20

Unknown fields in a request body are refused (400); unknown parameters of a verb with a known
parameter set (``tsdb.delete_series``) are refused at validation (400). Each audit entry's data is
bounded by ``kedgeflow.audit_max_entry_bytes`` (scheduler_metrics/kedgeflow/audit.py).
"""
from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from typing import Any

from aiohttp import web

from scheduler_metrics.kedgeflow.action import Action, canonical_json
from scheduler_metrics.kedgeflow.grant import Grant, GrantError
from turboprom.api_errors import error_response
from turboprom.api_common import ok, run_off_loop
from turboprom.api_errors import ParamError
from turboprom.api_params import parse_time
from turboprom.context import ServerContext
from turboprom.http_guard import BodyTimeout
from turboprom.principal import request_principal, request_tenant
from turboprom.tenancy import OPERATOR_ONLY, is_operator

SPEC_FIELDS = ("verb", "target", "params")


class TooLarge(Exception):
    pass


class RateLimiter:
    """Token bucket per key (bounded number of keys, least recently used dropped)."""

    def __init__(self, rate: float, burst: float, max_keys: int = 10_000):
        self.rate, self.burst, self.max_keys = float(rate), float(burst), max_keys
        self._b: OrderedDict[Any, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: Any, now: float | None = None) -> float:
        """0 when allowed, else the seconds until a request would be."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, when = self._b.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - when) * self.rate)
            if tokens >= 1.0:
                self._b[key] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._b[key] = (tokens, now)
                wait = (1.0 - tokens) / self.rate if self.rate > 0 else 3600.0
            self._b.move_to_end(key)
            while len(self._b) > self.max_keys:
                self._b.popitem(last=False)
            return wait


async def _read_capped(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge(f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes (kedgeflow.max_body_bytes)")
    buf = bytearray()
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise TooLarge(f"request body exceeds the limit of {limit} bytes (kedgeflow.max_body_bytes)")


async def _json_body(request: web.Request, limit: int, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    raw = await _read_capped(request, limit)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ParamError(f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ParamError("request body must be a JSON object")
    if allowed is not None:
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise ParamError(f"unknown field(s) {', '.join(repr(k[:64]) for k in unknown[:5])} (allowed: {', '.join(allowed)})")
    return body


def setup(app: web.Application, ctx: ServerContext) -> None:
    cfg = ctx.config.raw.get("kedgeflow") if isinstance(ctx.config.raw.get("kedgeflow"), dict) else {}
    max_body = int(cfg.get("max_body_bytes", 64 * 1024))
    max_params = int(cfg.get("max_params_bytes", 8 * 1024))
    max_name = int(cfg.get("max_name_chars", 256))
    rl = cfg.get("rate_limit") if isinstance(cfg.get("rate_limit"), dict) else {}
    limiter = RateLimiter(float(rl.get("requests_per_second", 2.0)), float(rl.get("burst", 20)))

    def service():
        svc = ctx.components.kedgeflow
        if svc is None:
            raise web.HTTPServiceUnavailable(text="kedgeflow is not configured")
        return svc

    def limited(request: web.Request) -> web.Response | None:
        """429 + Retry-After when the caller's audit-writing request budget is spent."""
        who = request_principal(request, ctx)
        key = (who.name, request.remote) if ctx.components.auth is None else who.name
        wait = limiter.take(key)
        if wait <= 0:
            return None
        resp = error_response("unavailable", f"too many KedgeFlow requests from {who.name!r} (kedgeflow.rate_limit: "
                                             f"{limiter.rate:g}/s, burst {limiter.burst:g}); retry later", 429)
        resp.headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return resp

    def body_error(e: Exception) -> web.Response:
        if isinstance(e, TooLarge):
            return error_response("bad_data", str(e), 413)
        if isinstance(e, BodyTimeout):
            raise e  # the server's body deadline answers 408
        return error_response("bad_data", str(e))

    async def propose(request: web.Request) -> web.Response:
        refused = limited(request)
        if refused is not None:
            return refused
        try:
            body = await _json_body(request, max_body, ("action", *SPEC_FIELDS))
            who = request_principal(request, ctx)
            spec = body.get("action", body)
            if not isinstance(spec, dict):
                raise ValueError("'action' must be a JSON object with verb, target and params")
            if "action" in body and len(body) > 1:
                raise ValueError("send either {'action': {...}} or the action's fields, not both")
            unknown = sorted(set(spec) - set(SPEC_FIELDS))
            if unknown:
                raise ValueError(f"unknown action field(s) {', '.join(repr(k[:64]) for k in unknown[:5])} (allowed: {', '.join(SPEC_FIELDS)})")
            params = spec.get("params") or {}
            if not isinstance(params, dict):
                raise ValueError("'params' must be a JSON object")
            for name in ("verb", "target"):
                if len(str(spec.get(name, ""))) > max_name:
                    raise ValueError(f"action {name} longer than {max_name} characters (kedgeflow.max_name_chars)")
            size = len(canonical_json(params))
            if size > max_params:
                raise TooLarge(f"action params of {size} bytes exceed the limit of {max_params} bytes (kedgeflow.max_params_bytes)")
            action = Action(verb=str(spec.get("verb", "")), target=str(spec.get("target", "")), params=dict(params),
                            tenant=request_tenant(request), requester=who.name)
            await run_off_loop(ctx, service().validate, action)
        except (ParamError, ValueError, TypeError, TooLarge, BodyTimeout) as e:
            return body_error(e)
        decision, grant = await service().propose(action, who)
        return ok({"decision": decision.to_dict(), "action": action.to_dict(),
                   "grant": grant.to_token() if grant else None,
                   "allowance_id": grant.allowance_id if grant else None})

    async def execute(request: web.Request) -> web.Response:
        refused = limited(request)
        if refused is not None:
            return refused
        try:
            body = await _json_body(request, max_body, ("action", "grant"))
            if not isinstance(body.get("action"), dict) or not isinstance(body.get("grant"), str):
                raise ValueError("need 'action' (the JSON object returned by propose) and 'grant' (its token string)")
            action = Action.from_dict(body["action"])
            grant = Grant.from_token(body["grant"])
        except KeyError as e:
            return error_response("bad_data", f"missing field {e.args[0]!r} (need 'action' and 'grant')")
        except (ParamError, ValueError, TypeError, GrantError, TooLarge, BodyTimeout) as e:
            return body_error(e)
        if action.tenant != request_tenant(request):
            return error_response("bad_data", "action tenant does not match the caller's tenant")
        outcome = await service().execute(action, grant, request_principal(request, ctx))
        return ok(outcome.to_dict())

    async def revoke(request: web.Request) -> web.Response:
        refused = limited(request)
        if refused is not None:
            return refused
        try:
            body = await _json_body(request, max_body, ("allowance_id",))
            aid = str(body["allowance_id"])
            if len(aid) > max_name:
                raise ParamError(f"allowance_id longer than {max_name} characters")
        except KeyError:
            return error_response("bad_data", "missing field 'allowance_id'")
        except (ParamError, TooLarge, BodyTimeout) as e:
            return body_error(e)
        # Only the tenant the grant was issued to may revoke it (the grant's audit entry says which).
        tenant = request_tenant(request)
        grants = await run_off_loop(ctx, service().audit.read, kind="grant", grant=aid, limit=1)
        if not grants or grants[-1].get("tenant") != tenant:
            return error_response("not_found", f"no grant with allowance id {aid!r} for this tenant", 404)
        was = await service().control.revoke(aid, request_principal(request, ctx), tenant)
        return ok({"allowance_id": aid, "was_available": was})

    async def audit(request: web.Request) -> web.Response:
        q = request.query
        try:
            since = parse_time(q["start"]) if "start" in q else None
            until = parse_time(q["end"]) if "end" in q else None
            limit = int(q.get("limit", "1000"))
        except (ParamError, ValueError) as e:
            return error_response("bad_data", str(e))
        tenant = request_tenant(request)
        entries = await run_off_loop(ctx, service().audit.read, kind=q.get("kind"), tenant=tenant, since_ms=since,
                                     until_ms=until, grant=q.get("allowance_id"), limit=limit)
        return ok(entries)

    async def audit_verify(request: web.Request) -> web.Response:
        # the whole log's entry count and problems span every tenant: operators only
        if not is_operator(request, ctx):
            return error_response("forbidden", OPERATOR_ONLY, 403)
        rep = await run_off_loop(ctx, service().verify_audit)
        return ok({"ok": rep.ok, "entries": rep.entries, "signed_heads": rep.heads, "problems": rep.problems})

    app.router.add_post("/api/v1/kedgeflow/propose", propose)
    app.router.add_post("/api/v1/kedgeflow/execute", execute)
    app.router.add_post("/api/v1/kedgeflow/revoke", revoke)
    app.router.add_get("/api/v1/audit", audit)
    app.router.add_get("/api/v1/audit/verify", audit_verify)
