"""KedgeFlow over HTTP: propose (decide + grant), execute (gateway), revoke, and the audit log."""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from scheduler_metrics.kedgeflow.action import Action
from scheduler_metrics.kedgeflow.grant import Grant, GrantError
from turboprom.api_common import error_response, ok, run_off_loop
from turboprom.api_params import ParamError, parse_time
from turboprom.context import ServerContext
from turboprom.principal import request_principal, request_tenant


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ParamError(f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ParamError("request body must be a JSON object")
    return body


def setup(app: web.Application, ctx: ServerContext) -> None:
    def service():
        svc = ctx.components.get("kedgeflow")
        if svc is None:
            raise web.HTTPServiceUnavailable(text="kedgeflow is not configured")
        return svc

    async def propose(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            who = request_principal(request, ctx)
            spec = body.get("action", body)
            if not isinstance(spec, dict):
                raise ValueError("'action' must be a JSON object with verb, target and params")
            params = spec.get("params") or {}
            if not isinstance(params, dict):
                raise ValueError("'params' must be a JSON object")
            action = Action(verb=str(spec.get("verb", "")), target=str(spec.get("target", "")), params=dict(params),
                            tenant=request_tenant(request), requester=who.name)
            await run_off_loop(ctx, service().validate, action)
        except (ParamError, ValueError, TypeError) as e:
            return error_response("bad_data", str(e))
        decision, grant = await service().propose(action, who)
        return ok({"decision": decision.to_dict(), "action": action.to_dict(),
                   "grant": grant.to_token() if grant else None,
                   "allowance_id": grant.allowance_id if grant else None})

    async def execute(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            if not isinstance(body.get("action"), dict) or not isinstance(body.get("grant"), str):
                raise ValueError("need 'action' (the JSON object returned by propose) and 'grant' (its token string)")
            action = Action.from_dict(body["action"])
            grant = Grant.from_token(body["grant"])
        except KeyError as e:
            return error_response("bad_data", f"missing field {e.args[0]!r} (need 'action' and 'grant')")
        except (ParamError, ValueError, TypeError, GrantError) as e:
            return error_response("bad_data", str(e))
        if action.tenant != request_tenant(request):
            return error_response("bad_data", "action tenant does not match the caller's tenant")
        outcome = await service().execute(action, grant, request_principal(request, ctx))
        return ok(outcome.to_dict())

    async def revoke(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            aid = str(body["allowance_id"])
        except KeyError:
            return error_response("bad_data", "missing field 'allowance_id'")
        except ParamError as e:
            return error_response("bad_data", str(e))
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

    async def audit_verify(_: web.Request) -> web.Response:
        rep = await run_off_loop(ctx, service().verify_audit)
        return ok({"ok": rep.ok, "entries": rep.entries, "signed_heads": rep.heads, "problems": rep.problems})

    app.router.add_post("/api/v1/kedgeflow/propose", propose)
    app.router.add_post("/api/v1/kedgeflow/execute", execute)
    app.router.add_post("/api/v1/kedgeflow/revoke", revoke)
    app.router.add_get("/api/v1/audit", audit)
    app.router.add_get("/api/v1/audit/verify", audit_verify)
