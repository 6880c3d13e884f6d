"""Who is calling. With no auth configured (the embedded default on 127.0.0.1) a caller holds every
role; with auth configured (ctx.components.auth) the authenticator decides."""
from __future__ import annotations

from aiohttp import web

from scheduler_metrics.kedgeflow.policy import Principal
from storage.labels import DEFAULT_TENANT
from turboprom.context import ServerContext

ALL_ROLES = frozenset({"read", "write", "admin", "scheduler"})


def request_principal(request: web.Request, ctx: ServerContext) -> Principal:
    auth = ctx.components.auth
    if auth is not None:
        return auth.principal(request)
    return Principal("local", ALL_ROLES)


def request_tenant(request: web.Request) -> str:
    return request.headers.get("X-Scope-OrgID") or DEFAULT_TENANT
