"""The fast signal scrape: chosen jobs' targets every 50-250 ms, only the families a sink needs, not stored.

Beside the normal scraper (``ingest/scrape/loop.py``), which stores every target at its
``scrape_interval``, this loop re-reads the same targets at a short interval and hands the samples
of a fixed set of sample names (the congestion tracker's) to one consumer callable, never to
storage: fresher signals without storing a sample every 100 ms.

Cheap for the engine: the request carries ``name[]=<sample name>`` parameters, which
prometheus-client's exposition (vLLM's and SGLang's ``/metrics``) honours by rendering only those
families; servers that ignore them send the whole body, and the kept lines are picked here with one
regular-expression pass (C), so the parse sees only those lines.

Series labels are built exactly as the normal scrape builds them (target labels, ``honor_labels``,
``metric_relabel_configs``, via ``process.target_series_labels``), so a fast sample and a stored
sample of the same series land on the same tracker state. Targets are read from the scrape manager
on every round, so discovery and reloads apply. A round fetches a job's targets concurrently (with a
bound); one that overruns its interval skips ahead (counted), never queues up. It runs on its own
thread and event loop, parsing there too (the kept lines are few).
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable

import aiohttp
import numpy as np
from prometheus_client import Counter, Histogram

from ingest.errors import IngestError
from ingest.scrape.process import target_series_labels
from ingest.text_format import parse_series_key, parse_text
from storage.batch import SampleBatch
from storage.labels import Labels

log = logging.getLogger("turboprom.scrape.fast")

FAST_SCRAPES = Counter("turboprom_fast_scrapes_total", "Fast signal scrapes, by job and outcome.", ["job", "outcome"])
FAST_SKIPPED = Counter("turboprom_fast_scrape_rounds_skipped_total", "Fast scrape rounds skipped (a round overran).",
                       ["job"])
FAST_SECONDS = Histogram("turboprom_fast_scrape_seconds", "Wall time of one fast scrape of one target.",
                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25))


def line_filter(names: Iterable[str]) -> re.Pattern[bytes]:
    """Lines of a text exposition body whose sample name is one of ``names`` (comments dropped)."""
    alt = b"|".join(re.escape(n.encode()) for n in sorted(names, key=len, reverse=True))
    return re.compile(rb"^(?:" + alt + rb")(?:\{[^\n]*|[ \t][^\n]*)$", re.M)


class FastScrape:
    def __init__(self, manager: Any, jobs: Iterable[str], interval_s: float, names: Iterable[str],
                 consume: Callable[[SampleBatch], None], *, concurrency: int = 64) -> None:
        self.manager = manager  # ingest.scrape.manager.ScrapeManager: its loops are the targets
        self.jobs = tuple(jobs)
        self.interval_s = interval_s
        self.names = frozenset(names)
        self.consume = consume
        self._filter = line_filter(self.names)
        self._query = urllib.parse.urlencode([("name[]", n) for n in sorted(self.names)])
        self._labels: dict[tuple, dict[str, Labels]] = {}  # target key -> raw series text -> labels
        self._concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self._tasks: list[asyncio.Task] = []
        self._session: aiohttp.ClientSession | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_ev: asyncio.Event | None = None
        self.rounds = 0
        self.samples = 0

    def start(self) -> None:
        """Runs on its own thread and event loop, so its HTTP work never queues behind (or delays) the
        server's request handling on the main loop."""
        if self._thread is not None or not self.jobs:
            return
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="fast-scrape", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        t, self._thread = self._thread, None
        if t is None:
            return
        loop, stop = self._loop, self._stop_ev
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # loop already closed
                pass
        t.join(timeout=10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_ev = asyncio.Event()
        self._sem = asyncio.Semaphore(self._concurrency)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=30))
        self._tasks = [asyncio.create_task(self._run(job), name=f"fast scrape {job}") for job in self.jobs]
        try:
            await self._stop_ev.wait()
        finally:
            for t in self._tasks:
                t.cancel()
            for t in self._tasks:
                try:
                    await t
                except asyncio.CancelledError:
                    pass
                except Exception:  # noqa: BLE001
                    log.exception("fast scrape task failed")
            self._tasks = []
            await self._session.close()
            self._session = None

    def _targets(self, job: str) -> list[Any]:
        return list(self.manager.loops.get(job, {}).values())

    async def _run(self, job: str) -> None:
        nxt = time.monotonic()
        while True:
            await asyncio.gather(*(self._one(job, lp) for lp in self._targets(job)))
            self.rounds += 1
            nxt += self.interval_s
            now = time.monotonic()
            if now > nxt:
                skipped = int((now - nxt) // self.interval_s) + 1
                FAST_SKIPPED.labels(job).inc(skipped)
                nxt += skipped * self.interval_s
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))

    async def _one(self, job: str, lp: Any) -> None:
        assert self._session is not None and self._sem is not None
        spec = lp.spec
        url = spec.url + ("&" if "?" in spec.url else "?") + self._query
        timeout = min(spec.timeout_ms / 1000.0, max(self.interval_s * 2, 0.1))
        t0 = time.perf_counter()
        async with self._sem:
            try:
                async with self._session.get(url, headers={"Accept": "text/plain;version=0.0.4",
                                                           "User-Agent": "TurboProm-fast-scrape/0.1"},
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    if r.status != 200:
                        FAST_SCRAPES.labels(job, "error").inc()
                        return
                    body = await r.read()
                ts = int(time.time() * 1000)
            except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
                FAST_SCRAPES.labels(job, "error").inc()
                return
        try:
            n = self._process(lp, body, ts)  # small (the tracker's lines only); this thread is ours
        except IngestError as e:
            FAST_SCRAPES.labels(job, "error").inc()
            log.debug("fast scrape of %s: %s", spec.url, e)
            return
        self.samples += n
        FAST_SCRAPES.labels(job, "ok").inc()
        FAST_SECONDS.observe(time.perf_counter() - t0)

    def _process(self, lp: Any, body: bytes, ts: int) -> int:
        """Kept lines -> SampleBatch at the scrape time -> consumer (worker thread)."""
        kept = self._filter.findall(body)
        if not kept:
            return 0
        parsed = parse_text(b"\n".join(kept) + b"\n")
        spec, cfg = lp.spec, lp.cfg
        cache = self._labels.setdefault(spec.key, {})
        if len(cache) > 100_000:
            cache.clear()
        labels: list[Labels] = []
        for key in parsed.keys:
            lbl = cache.get(key)
            if lbl is None:
                lbl = cache[key] = target_series_labels(parse_series_key(key), spec.labels, cfg.honor_labels,
                                                        cfg.metric_relabel_configs)
            labels.append(lbl)
        keep_series = np.fromiter((len(x) > 0 for x in labels), bool, count=len(labels))
        keep = keep_series[parsed.series_index]
        if not keep.all():
            pos = np.cumsum(keep_series) - 1
            labels = [x for x, k in zip(labels, keep_series) if k]
            sidx = pos[parsed.series_index[keep]]
        else:
            sidx = parsed.series_index
        vals = parsed.values[keep]
        tss = np.where(parsed.has_ts[keep] & cfg.honor_timestamps, parsed.timestamps[keep], ts)
        batch = SampleBatch(labels, sidx, tss, vals)
        self.consume(batch)
        return len(batch)

    def status(self) -> dict[str, Any]:
        return {"jobs": list(self.jobs), "interval_seconds": self.interval_s, "rounds": self.rounds,
                "samples": self.samples, "targets": sum(len(self._targets(j)) for j in self.jobs)}
