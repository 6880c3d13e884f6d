"""/api/v1/query and /api/v1/query_range parse a query's text once: the route's syntax check, the
query log's pattern cache and the engine share the parser's tree for that text
(promql/query_guard.py), and syntax errors still read like Prometheus's. A real app on a loopback
port, in this process so the parser's calls can be counted."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

import promql.parser as pp
from tests.helpers import free_port
from turboprom.config import ServerConfig
from turboprom.server import create_app
from turboprom.wiring import build_context


def test_each_request_parses_its_query_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_parse = pp.parse

    def counting_parse(text: str, *a, **kw):
        calls.append(text)
        return real_parse(text, *a, **kw)

    monkeypatch.setattr(pp, "parse", counting_parse)
    ctx = build_context(ServerConfig(data_dir=str(tmp_path / "d")))
    now = time.time()

    async def run() -> None:
        runner = web.AppRunner(create_app(ctx))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                async def get(path: str, **params: str) -> tuple[int, dict]:
                    async with s.get(f"{base}{path}?{urllib.parse.urlencode(params)}") as r:
                        return r.status, json.loads(await r.read())

                for path, q, params in (
                        ("/api/v1/query", 'sum by (job) (rate(parse_once_total{job="a"}[5m]))', {"time": str(now)}),
                        ("/api/v1/query_range", 'max(parse_once_total) by (job)',
                         {"start": str(now - 600), "end": str(now), "step": "60"})):
                    calls.clear()
                    status, body = await get(path, query=q, **params)
                    assert status == 200 and body["status"] == "success", body
                    assert calls == [q], (path, calls)  # a new text: parsed once for the route, planner and engine
                    calls.clear()
                    status, body = await get(path, query=q, **params)
                    assert status == 200 and body["status"] == "success", body
                    assert calls == [], (path, calls)  # the same text again: not parsed at all
                # Syntax errors are still answered by the route, as Prometheus words them.
                status, body = await get("/api/v1/query", query="sum(", time=str(now))
                assert status == 400 and body["errorType"] == "bad_data"
                assert body["error"].startswith('invalid parameter "query": 1:5: parse error')
                status, body = await get("/api/v1/query_range", query="sum(", start=str(now - 60), end=str(now), step="15")
                assert status == 400 and body["error"].startswith("1:5: parse error")
        finally:
            await runner.cleanup()

    try:
        asyncio.run(run())
    finally:
        ctx.storage.close()
        ctx.executor.shutdown(wait=False)
