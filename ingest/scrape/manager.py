"""ScrapeManager: ctx.components.scraper.

Lifecycle: ``start()`` (async; called by wiring.start_background) builds targets and starts one
loop per target; ``stop()`` cancels them (no stale markers on shutdown, like Prometheus).
file_sd_configs files are polled for changes (every min(refresh_interval, 5s)); targets that
disappear get stale markers for all their series.

Read API for /api/v1/targets:
    targets_snapshot() -> list[dict]   # Prometheus activeTargets entries: discoveredLabels, labels,
                                       # scrapePool, scrapeUrl, globalUrl, lastError, lastScrape (RFC 3339),
                                       # lastScrapeDuration (s), health ("up"|"down"|"unknown"),
                                       # scrapeInterval, scrapeTimeout
    dropped_targets_snapshot() -> list[dict]   # [{"discoveredLabels": {...}}]
    scrape_pools() -> list[str]
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import aiohttp

from ingest.scrape.config import ScrapeConfig, parse_scrape_configs
from ingest.scrape.groups import DEFAULT_WINDOW_S, ScrapeGroups
from ingest.scrape.loop import ScrapeLoop
from ingest.scrape.targets import build_targets, file_mtimes, file_sd_groups

log = logging.getLogger("turboprom.scrape")


class ScrapeManager:
    def __init__(self, configs: list[ScrapeConfig], append: Callable, executor=None, *, file_sd_poll_s: float = 5.0,
                 group_window_s: float = DEFAULT_WINDOW_S):
        self.configs = configs
        self.append = append
        self.groups = ScrapeGroups(append, executor, group_window_s)  # all targets' scrapes share the groups
        self.exemplars = None  # ingest.exemplars.ExemplarStore: OpenMetrics exemplars of scraped samples
        self.executor = executor
        self.file_sd_poll_s = file_sd_poll_s
        self.loops: dict[str, dict[tuple, ScrapeLoop]] = {c.job_name: {} for c in configs}
        self.dropped: dict[str, list[dict[str, str]]] = {c.job_name: [] for c in configs}
        self.sd_errors: list[str] = []
        self._mtimes: dict[str, dict[str, float]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._watch: asyncio.Task | None = None
        self._sync_lock: asyncio.Lock | None = None

    @classmethod
    def from_config(cls, raw: dict[str, Any], append: Callable, executor=None, *, self_url: str | None = None,
                    self_interval_s: float = 15.0, group_window_s: float = DEFAULT_WINDOW_S,
                    base_dir: str | None = None) -> "ScrapeManager":
        return cls(configs_from_raw(raw, self_url=self_url, self_interval_s=self_interval_s, base_dir=base_dir), append,
                   executor, group_window_s=group_window_s)

    async def apply(self, configs: list[ScrapeConfig]) -> None:
        """Config reload: scrape ``configs`` from now on. Jobs that are gone stop (their targets' series get
        stale markers); changed jobs restart their loops with the new settings (targets no longer listed
        get stale markers); unchanged jobs keep running untouched."""
        if self._session is None:
            self._sync_lock = asyncio.Lock()
            self._session = _scrape_session()
        old = {c.job_name: c for c in self.configs}
        new = {c.job_name: c for c in configs}
        for job in [j for j in old if j not in new]:
            await asyncio.gather(*(lp.stop(stale=True) for lp in self.loops.pop(job, {}).values()), return_exceptions=True)
            self.dropped.pop(job, None)
            self._mtimes.pop(job, None)
        self.configs = list(configs)
        for cfg in configs:
            if cfg.job_name in old and _same(old[cfg.job_name], cfg):
                continue
            self.loops.setdefault(cfg.job_name, {})
            self.dropped.setdefault(cfg.job_name, [])
            await self.sync_job(cfg, restart=cfg.job_name in old)
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if any(c.file_sd_configs for c in self.configs):
            self._watch = asyncio.get_running_loop().create_task(self._watch_files(), name="file_sd watch")

    async def start(self) -> None:
        if not self.configs:
            return
        self._sync_lock = asyncio.Lock()
        self._session = _scrape_session()
        await self.sync_all()
        if any(c.file_sd_configs for c in self.configs):
            self._watch = asyncio.get_running_loop().create_task(self._watch_files(), name="file_sd watch")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            try:
                await self._watch
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        for loops in self.loops.values():
            await asyncio.gather(*(lp.stop(stale=False) for lp in loops.values()), return_exceptions=True)
            loops.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def sync_all(self) -> None:
        for cfg in self.configs:
            await self.sync_job(cfg)

    async def sync_job(self, cfg: ScrapeConfig, *, restart: bool = False) -> None:
        assert self._sync_lock is not None and self._session is not None
        async with self._sync_lock:
            errors: list[str] = []
            groups = list(cfg.static_configs)
            if cfg.file_sd_configs:
                groups += await asyncio.get_running_loop().run_in_executor(self.executor, file_sd_groups, cfg, errors)
                self._mtimes[cfg.job_name] = file_mtimes(cfg)
            self.sd_errors = errors
            for e in errors:
                log.warning("%s", e)
            active, dropped = build_targets(cfg, groups)
            self.dropped[cfg.job_name] = dropped
            loops = self.loops[cfg.job_name]
            wanted = {t.key: t for t in active}
            removed = [k for k in loops if k not in wanted]
            for k in removed:
                await loops.pop(k).stop(stale=True)
            if restart:  # reload with changed job settings: the kept targets' loops start over with them
                for k in list(loops):
                    await loops.pop(k).stop(stale=False)
            for k, spec in wanted.items():
                if k not in loops:
                    lp = ScrapeLoop(cfg, spec, self._session, self.append, self.executor, exemplars=self.exemplars,
                                    groups=self.groups)
                    loops[k] = lp
                    lp.start()

    async def _watch_files(self) -> None:
        jobs = [c for c in self.configs if c.file_sd_configs]
        poll = min([self.file_sd_poll_s] + [f.refresh_interval_ms / 1000 for c in jobs for f in c.file_sd_configs])
        while True:
            await asyncio.sleep(max(poll, 0.2))
            for cfg in jobs:
                try:
                    now = await asyncio.get_running_loop().run_in_executor(self.executor, file_mtimes, cfg)
                    if now != self._mtimes.get(cfg.job_name):
                        await self.sync_job(cfg)
                except Exception:  # noqa: BLE001 - keep watching
                    log.exception("file_sd refresh for job %s failed", cfg.job_name)

    # ---- read API ----
    def targets_snapshot(self) -> list[dict[str, Any]]:
        return [lp.snapshot() for loops in self.loops.values() for lp in loops.values()]

    def dropped_targets_snapshot(self) -> list[dict[str, Any]]:
        return [{"discoveredLabels": d} for ds in self.dropped.values() for d in ds]

    def scrape_pools(self) -> list[str]:
        return [c.job_name for c in self.configs]

    def stats(self) -> dict[str, int]:
        loops = [lp for ls in self.loops.values() for lp in ls.values()]
        return {"targets": len(loops), "scrapes": sum(lp.scrapes for lp in loops), "missed": sum(lp.missed for lp in loops)}


def _scrape_session() -> aiohttp.ClientSession:
    """The scrapers' HTTP client: keep-alive connections to the targets, gzip bodies decoded, no
    cookie jar (Prometheus's scrape client keeps no cookies between scrapes, and a jar costs a
    filter and an update per request)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256, ttl_dns_cache=300), auto_decompress=True,
                                 cookie_jar=aiohttp.DummyCookieJar())


def configs_from_raw(raw: dict[str, Any] | None, *, self_url: str | None = None, self_interval_s: float = 15.0,
                     base_dir: str | None = None) -> list[ScrapeConfig]:
    """The scrape configs of a server config, with the ``self_scrape`` job when it asks for one
    (``base_dir``: the config file's folder, which credential and TLS file names are relative to)."""
    raw = dict(raw or {})
    self_scrape = raw.get("self_scrape")
    if self_scrape and not raw.get("scrape_configs") and self_url:
        # `self_scrape: true` (interval from the server config) or `self_scrape: {scrape_interval: 5s}`
        interval = self_scrape.get("scrape_interval") if isinstance(self_scrape, dict) else None
        raw["scrape_configs"] = [{"job_name": "turboprom", "scrape_interval": interval or f"{max(1, int(self_interval_s))}s",
                                  "static_configs": [{"targets": [self_url]}]}]
    return parse_scrape_configs(raw, base_dir)


def _same(a: ScrapeConfig, b: ScrapeConfig) -> bool:
    """Equal settings (relabel rules compared by their text: compiled regexes do not compare)."""
    def key(c: ScrapeConfig) -> tuple:
        rel = [[(r.action, tuple(r.source_labels), r.separator, r.regex_text, r.target_label, r.replacement, r.modulus)
                for r in rs] for rs in (c.relabel_configs, c.metric_relabel_configs)]
        return (repr([getattr(c, f) for f in c.__dataclass_fields__ if f not in ("relabel_configs", "metric_relabel_configs")]),
                repr(rel))
    return key(a) == key(b)
