"""aiohttp application: route modules discovered under turboprom/routes, lifecycle, graceful stop."""
from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil
import signal
import sys
from typing import Callable, Sequence

import yaml
from aiohttp import web

from turboprom import routes
from turboprom.config import ServerConfig
from turboprom.context import ServerContext
from turboprom.wiring import build_context, start_background, stop_background

log = logging.getLogger("turboprom")


class StartupError(Exception):
    """The server cannot start (port taken, bad web config file): one line for the operator."""


def create_app(ctx: ServerContext, *, route_filter: Callable[[str], bool] | None = None,
               extra_routes: Sequence[Callable[[web.Application, ServerContext], None]] = ()) -> web.Application:
    """The app with every route module under turboprom/routes (those ``route_filter`` keeps, by
    module name: a cluster role serves only its part) plus ``extra_routes``."""
    from turboprom.http_guard import Timeouts, body_deadline_middleware
    from turboprom.self_metrics import http_metrics

    # Outermost after the metrics: every route's body read has a deadline (408 when missed).
    middlewares = [http_metrics, body_deadline_middleware(Timeouts.from_config(ctx.config.raw))]
    auth = ctx.components.auth
    if auth is not None:
        from turboprom.auth import auth_middleware

        middlewares.append(auth_middleware(auth))
    app = web.Application(client_max_size=ctx.config.max_body_bytes, middlewares=middlewares)
    app["ctx"] = ctx
    for mod in sorted(pkgutil.iter_modules(routes.__path__), key=lambda m: m.name):
        if route_filter is not None and not route_filter(mod.name):
            continue
        module = importlib.import_module(f"{routes.__name__}.{mod.name}")
        setup = getattr(module, "setup", None)
        if setup is not None:
            setup(app, ctx)
    for extra in extra_routes:
        extra(app, ctx)

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


# The event loop shares the GIL with query, ingest and fold threads; Python's default 5 ms switch
# interval lets each busy thread hold it that long per turn, which adds up to tens of milliseconds
# for a health check or congestion poll behind a few of them. 1 ms keeps those polls fast.
GIL_SWITCH_INTERVAL_S = 0.001


async def serve(config: ServerConfig, *, build: Callable[[ServerConfig], ServerContext] = build_context,
                route_filter: Callable[[str], bool] | None = None,
                extra_routes: Sequence[Callable[[web.Application, ServerContext], None]] = ()) -> None:
    """Run until SIGTERM/SIGINT. The defaults are the embedded single node; a cluster role
    (turboprom/cluster/roles.py) passes its own context builder and routes."""
    from turboprom.auth import Authenticator, WebConfig, check_listen_guard
    from turboprom.http_guard import GuardedAppRunner, Timeouts

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

    try:
        web_cfg = WebConfig.load(config.web_config_file) if config.web_config_file else None
    except FileNotFoundError:
        raise StartupError(f"web config file {config.web_config_file} not found (--web.config.file)") from None
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise StartupError(f"web config error: {' '.join(str(e).split())}") from None
    timeouts = Timeouts.from_config(config.raw)  # refuses a malformed web.* timeout before starting
    check_listen_guard(config.host, web_cfg, config.insecure)
    ctx = await asyncio.get_running_loop().run_in_executor(None, build, config)
    if web_cfg is not None and web_cfg.auth_enabled:
        ctx.components.auth = Authenticator(web_cfg, config.raw.get("auth"))
    app = create_app(ctx, route_filter=route_filter, extra_routes=extra_routes)
    # Header read, body read and idle timeouts (turboprom/http_guard.py; web.* in the server YAML).
    runner = GuardedAppRunner(app, timeouts, handle_signals=False, access_log=None)
    await runner.setup()
    ssl_ctx = web_cfg.ssl_context() if web_cfg is not None else None
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True, ssl_context=ssl_ctx)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        from turboprom.config import listen_error

        raise StartupError(listen_error(config.listen, e)) from None
    from turboprom.reload import mark_loaded, reload_config

    mark_loaded(ctx)
    scheme = "https" if ssl_ctx else "http"
    log.info("TurboProm listening on %s://%s (data dir %s)", scheme, config.listen, config.data_dir)
    print(f"TurboProm listening on {scheme}://{config.listen}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def on_sighup() -> None:  # re-read config and rule files, as Prometheus (errors are logged)
        async def run() -> None:
            try:
                await reload_config(ctx)
            except Exception:  # noqa: BLE001 - reported by reload_config; the old config stays
                pass
        task = loop.create_task(run(), name="config reload")
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    reloads: set[asyncio.Task] = set()

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    await stop.wait()
    log.info("shutting down: finishing in-flight requests, persisting head")
    await runner.cleanup()
