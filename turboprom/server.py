"""aiohttp application: route modules discovered under turboprom/routes, lifecycle, graceful stop."""
from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil
import signal

from aiohttp import web

from turboprom import routes
from turboprom.config import ServerConfig
from turboprom.context import ServerContext
from turboprom.wiring import build_context, start_background, stop_background

log = logging.getLogger("turboprom")


def create_app(ctx: ServerContext) -> web.Application:
    from turboprom.self_metrics import http_metrics

    app = web.Application(client_max_size=ctx.config.max_body_bytes, middlewares=[http_metrics])
    app["ctx"] = ctx
    for mod in sorted(pkgutil.iter_modules(routes.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{routes.__name__}.{mod.name}")
        setup = getattr(module, "setup", None)
        if setup is not None:
            setup(app, ctx)

    async def on_startup(_: web.Application) -> None:
        await start_background(ctx)
        ctx.ready = True

    async def on_cleanup(_: web.Application) -> None:
        ctx.ready = False
        await stop_background(ctx)
        await asyncio.get_running_loop().run_in_executor(None, ctx.storage.close)
        ctx.executor.shutdown(wait=True)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def serve(config: ServerConfig) -> None:
    ctx = await asyncio.get_running_loop().run_in_executor(None, build_context, config)
    app = create_app(ctx)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    log.info("TurboProm listening on http://%s (data dir %s)", config.listen, config.data_dir)
    print(f"TurboProm listening on http://{config.listen}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: finishing in-flight requests, persisting head")
    await runner.cleanup()
