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
thread and event loop, and parses a whole round as one body (each target's lines tagged with its id),
so the parser's fixed cost and the consumer's per-batch cost are paid once per round.
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


_TAG_NAME = "__fast_target__"  # a target's id on its lines while a round is parsed as one body
_TAG = _TAG_NAME.encode()
_TAG_BRACE = re.compile(rb"^([^{\s]+)\{", re.M)
_TAG_BARE = re.compile(rb"^([^{\s]+)([ \t])", re.M)


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
        self._labels: dict[str, tuple[Labels, int]] = {}  # tagged series text -> (labels, target id)
        self._tids: dict[tuple, int] = {}  # target key -> id (stable for the life of this scraper)
        self._by_tid: dict[int, Any] = {}  # id -> the target's current scrape loop
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
            got = await asyncio.gather(*(self._one(job, lp) for lp in self._targets(job)))
            self._process_round(job, [g for g in got if g is not None])
            self.rounds += 1
            nxt += self.interval_s
            now = time.monotonic()
            if now > nxt:
                skipped = int((now - nxt) // self.interval_s) + 1
                FAST_SKIPPED.labels(job).inc(skipped)
                nxt += skipped * self.interval_s
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))

    async def _one(self, job: str, lp: Any) -> tuple[Any, bytes, int] | None:
        """(target, its kept lines, scrape time ms), or None when the scrape failed."""
        assert self._session is not None and self._sem is not None
        spec = lp.spec
        url = spec.url + ("&" if "?" in spec.url else "?") + self._query
        timeout = min(spec.timeout_ms / 1000.0, max(self.interval_s * 2, 0.1))
        http = lp.cfg.http  # the job's credentials, TLS and proxy, as its normal scrape uses them
        headers = {"Accept": "text/plain;version=0.0.4", "User-Agent": "TurboProm-fast-scrape/0.1"}
        t0 = time.perf_counter()
        async with self._sem:
            try:
                auth = http.authorization_header()
                if auth is not None:
                    headers["Authorization"] = auth
                async with self._session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout),
                                             ssl=http.ssl_context() or True, server_hostname=http.server_hostname(),
                                             proxy=http.proxy_url, allow_redirects=http.follow_redirects) as r:
                    if r.status != 200:
                        FAST_SCRAPES.labels(job, "error").inc()
                        return None
                    body = await r.read()
                ts = int(time.time() * 1000)
            except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
                FAST_SCRAPES.labels(job, "error").inc()
                return None
        FAST_SECONDS.observe(time.perf_counter() - t0)
        return lp, b"\n".join(self._filter.findall(body)), ts

    def _target_id(self, lp: Any) -> int:
        tid = self._tids.get(lp.spec.key)
        if tid is None:
            tid = self._tids[lp.spec.key] = len(self._tids)
        self._by_tid[tid] = lp
        return tid

    def _process_round(self, job: str, got: list[tuple[Any, bytes, int]], split_on_error: bool = True) -> None:
        """All targets of a round -> one parse, one SampleBatch, one consume (this thread). Each
        target's lines are tagged with a target label first (one regex substitution per body), so
        the same series text from two engines stays two series; the parser's fixed cost is paid once
        per round instead of once per target."""
        parts = []
        ts_of: dict[int, int] = {}
        for lp, kept, ts in got:
            if not kept:
                FAST_SCRAPES.labels(job, "ok").inc()
                continue
            tid = self._target_id(lp)
            ts_of[tid] = ts
            parts.append(_TAG_BARE.sub(rb'\1{' + _TAG + b'="%d"}\2' % tid,
                                       _TAG_BRACE.sub(rb'\1{' + _TAG + b'="%d",' % tid, kept)))
        if not parts:
            return
        try:
            parsed = parse_text(b"\n".join(parts) + b"\n")
        except IngestError as e:  # one target's body is bad: the round goes target by target
            if not split_on_error:
                raise
            log.debug("fast scrape round of job %s: %s; parsing per target", job, e)
            for lp, kept, ts in got:
                if kept:
                    self._process_round_one(job, lp, kept, ts)
            return
        cache = self._labels
        if len(cache) > 200_000:
            cache.clear()
        labels: list[Labels] = []
        key_tid = np.empty(len(parsed.keys), np.int64)
        for i, key in enumerate(parsed.keys):  # per distinct series; cached, so Python only for new ones
            hit = cache.get(key)
            if hit is None:
                pairs = parse_series_key(key)
                tid = int(next(v for k, v in pairs if k == _TAG_NAME))
                lp = self._by_tid[tid]
                lbl = target_series_labels(tuple((k, v) for k, v in pairs if k != _TAG_NAME), lp.spec.labels,
                                           lp.cfg.honor_labels, lp.cfg.metric_relabel_configs)
                hit = cache[key] = (lbl, tid)
            labels.append(hit[0])
            key_tid[i] = hit[1]
        n = self._emit(parsed, labels, key_tid, ts_of)
        self.samples += n
        FAST_SCRAPES.labels(job, "ok").inc(len(parts))

    def _process_round_one(self, job: str, lp: Any, kept: bytes, ts: int) -> None:
        try:
            self._process_round(job, [(lp, kept, ts)], split_on_error=False)
        except IngestError as e:
            FAST_SCRAPES.labels(job, "error").inc()
            log.debug("fast scrape of %s: %s", lp.spec.url, e)

    def _emit(self, parsed: Any, labels: list[Labels], key_tid: np.ndarray, ts_of: dict[int, int]) -> int:
        keep_series = np.fromiter((len(x) > 0 for x in labels), bool, count=len(labels))
        keep = keep_series[parsed.series_index]
        sidx = parsed.series_index
        if not keep.all():
            pos = np.cumsum(keep_series) - 1
            labels = [x for x, k in zip(labels, keep_series) if k]
            sidx = pos[sidx[keep]]
        tids = key_tid[parsed.series_index[keep]]
        top = int(key_tid.max()) + 1 if len(key_tid) else 0
        scrape_ts = np.zeros(top, np.int64)
        honor = np.zeros(top, bool)
        for tid, ts in ts_of.items():
            if tid < top:
                scrape_ts[tid] = ts
                honor[tid] = self._by_tid[tid].cfg.honor_timestamps
        own = parsed.has_ts[keep] & honor[tids]
        tss = np.where(own, parsed.timestamps[keep], scrape_ts[tids])
        batch = SampleBatch(labels, sidx, tss, parsed.values[keep])
        self.consume(batch)
        return len(batch)

    def status(self) -> dict[str, Any]:
        return {"jobs": list(self.jobs), "interval_seconds": self.interval_s, "rounds": self.rounds,
                "samples": self.samples, "targets": sum(len(self._targets(j)) for j in self.jobs)}
