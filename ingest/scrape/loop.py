"""One target's scrape loop: fetch with aiohttp on the event loop; process and append in a worker
thread, together with the other scrapes that finished within the group window (groups.py)."""
from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from datetime import datetime, timezone
from typing import Any

import aiohttp

from ingest import metrics
from ingest.errors import IngestError
from ingest.http_client_config import HTTPClientConfig
from ingest.scrape.config import ScrapeConfig, format_duration
from ingest.scrape.groups import ScrapeGroups
from ingest.scrape.process import SeriesState, merge, process_scrape, report_batch, stale_batch
from ingest.scrape.targets import TargetSpec
from ingest.validation import name_validation_scheme

from storage.batch import SampleBatch
from storage.labels import DEFAULT_TENANT, Labels  # scraped targets belong to the default tenant (the operator)

log = logging.getLogger("turboprom.scrape")

# As Prometheus 3 asks: with escaping=allow-utf-8, exporters keep names such as vLLM's
# "vllm:num_requests_waiting" (prometheus-client >= 0.21 otherwise escapes ':' to '_' in OpenMetrics)
# and send UTF-8 names quoted ({"my.metric"}), which the text parser reads. Under
# metric_name_validation_scheme: legacy we ask for escaping=underscores instead, as Prometheus does.
ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,"
          "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
ACCEPT_LEGACY = ACCEPT.replace("escaping=allow-utf-8", "escaping=underscores")
REPORT = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
          "scrape_series_added")


SLOT_MS = 250  # the grid of scrape start times within an interval (see ScrapeLoop.offset_s)


class ScrapeLoop:
    def __init__(self, cfg: ScrapeConfig, spec: TargetSpec, session: aiohttp.ClientSession, append, executor,
                 *, max_body_bytes: int = 64 * 1024 * 1024, exemplars=None, groups: ScrapeGroups | None = None):
        self.cfg = cfg
        self.exemplars = exemplars  # ingest.exemplars.ExemplarStore or None
        self.spec = spec
        self.session = session
        self.append = append  # callable(SampleBatch) -> AppendResult, runs in a worker thread
        self.executor = executor
        self.groups = groups if groups is not None else ScrapeGroups(append, executor, 0.0)
        self._options: tuple[str, dict[str, str], aiohttp.ClientTimeout, HTTPClientConfig | None] | None = None
        self._client_kw: dict[str, Any] = {}  # ssl, server_hostname, proxy, allow_redirects of the job
        self._scrapes_ok = metrics.SCRAPES.labels(job=cfg.job_name, outcome="ok")
        self._scrapes_err = metrics.SCRAPES.labels(job=cfg.job_name, outcome="error")
        self.max_body_bytes = cfg.body_size_limit or max_body_bytes
        self.state = SeriesState()
        self.task: asyncio.Task | None = None
        self.health = "unknown"
        self.last_error = ""
        self.last_scrape: float = 0.0
        self.last_duration = 0.0
        self.last_samples = 0
        self.scrapes = 0
        self.missed = 0
        self._ever_scraped = False

    @property
    def labels(self) -> Labels:
        return self.spec.labels

    def offset_s(self) -> float:
        """Spread targets over the interval like Prometheus (stable per target), on a grid of slots
        (a twentieth of the interval, at most ``SLOT_MS``): targets of one slot start together, so one
        wake-up of the event loop sends their requests and their scrapes share a processing group."""
        h = int.from_bytes(hashlib.sha256(repr(self.spec.key).encode()).digest()[:8], "big")
        interval = max(self.spec.interval_ms, 1)
        slot = max(1, min(SLOT_MS, interval // 20))
        return (h % interval) // slot * slot / 1000.0

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"scrape {self.spec.url}")

    async def stop(self, *, stale: bool) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            except Exception:  # noqa: BLE001
                log.exception("scrape loop for %s failed", self.spec.url)
        if stale and self._ever_scraped:
            # target gone: stale markers for its series and its report series, like Prometheus
            ts = int(time.time() * 1000)
            series = list(self.state.last_series) + [tuple(sorted(self.spec.labels + (("__name__", n),))) for n in REPORT]
            # through the groups: a scrape of this target still waiting for its group is appended first
            # (the same group, or an earlier one), so its samples do not land after the markers
            batch = stale_batch(series, ts)
            await self.groups.submit(lambda: (batch, None), self.spec.interval_ms / 10_000.0)

    async def _run(self) -> None:
        interval = self.spec.interval_ms / 1000.0
        loop = asyncio.get_running_loop()
        now = time.time()
        # first scrape at the next point of this target's phase within the interval
        base = now - (now % interval) + self.offset_s()
        next_t = base if base >= now else base + interval
        while True:
            delay = next_t - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.scrape_once(loop)
            next_t += interval
            now = time.time()
            if now > next_t:
                skipped = int((now - next_t) // interval) + 1
                self.missed += skipped
                metrics.SCRAPE_LAG.labels(job=self.cfg.job_name).inc(skipped)
                next_t += skipped * interval

    async def scrape_once(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        loop = loop or asyncio.get_running_loop()
        start = time.time()
        scrape_ts = int(start * 1000)
        err = ""
        body = b""
        ctype = ""
        try:
            headers, timeout, client = self._request_options()
            if client is not None:  # credentials from files: read again when they change
                auth = self.cfg.http.authorization_header()
                headers = {**headers, "Authorization": auth} if auth is not None else headers
            async with self.session.get(self.spec.url, headers=headers, timeout=timeout, **self._client_kw) as resp:
                if resp.status != 200:
                    err = f"server returned HTTP status {resp.status} {resp.reason}"
                else:
                    ctype = resp.headers.get("Content-Type", "")
                    chunks: list[bytes] = []
                    total = 0
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        total += len(chunk)
                        if total > self.max_body_bytes:
                            err = f"body size limit exceeded ({self.max_body_bytes} bytes)"
                            break
                        chunks.append(chunk)
                    body = b"".join(chunks)
        except asyncio.TimeoutError:
            err = f'Get "{self.spec.url}": context deadline exceeded'
        except aiohttp.ClientError as e:
            err = f'Get "{self.spec.url}": {e}'
        except OSError as e:
            err = f'Get "{self.spec.url}": {e}'
        work = self._work_ok if not err else self._work_fail
        fetch_s = time.time() - start
        # processed and appended with the scrapes finishing about now, within a tenth of the interval
        result_err = await self.groups.submit(functools.partial(work, body, ctype, scrape_ts, fetch_s, err),
                                              self.spec.interval_ms / 10_000.0)
        err = err or result_err
        self.scrapes += 1
        self._ever_scraped = True
        self.last_scrape = start
        self.last_duration = time.time() - start
        if err and self.last_error != err:
            log.warning("scrape of %s (job %s) failed: %s", self.spec.url, self.cfg.job_name, err)
        self.health = "down" if err else "up"
        self.last_error = err
        (self._scrapes_err if err else self._scrapes_ok).inc()

    def _request_options(self) -> tuple[dict[str, str], aiohttp.ClientTimeout, HTTPClientConfig | None]:
        """The scrape request's headers and timeout, built once (again if the name validation scheme
        changed with a reload), and the job's HTTP client settings when its credentials come from
        files (None: the headers hold them, if any)."""
        scheme = name_validation_scheme()
        if self._options is None or self._options[0] != scheme:
            timeout_s = self.spec.timeout_ms / 1000.0
            http = self.cfg.http
            headers = {"Accept": ACCEPT if scheme == "utf8" else ACCEPT_LEGACY,
                       "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout_s:g}", "User-Agent": "TurboProm-scraper/0.1"}
            from_files = http.reads_files()
            auth = None if from_files else http.authorization_header()
            if auth is not None:
                headers["Authorization"] = auth
            self._client_kw = {"ssl": http.ssl_context() or True, "server_hostname": http.server_hostname(),
                               "proxy": http.proxy_url, "allow_redirects": http.follow_redirects}
            self._options = (scheme, headers, aiohttp.ClientTimeout(total=timeout_s), http if from_files else None)
        return self._options[1], self._options[2], self._options[3]

    def _work_ok(self, body: bytes, ctype: str, scrape_ts: int, fetch_s: float, _err: str) -> tuple[SampleBatch, str]:
        """(the scrape's batch for the group's append, "" or the error); ``scrape_duration_seconds`` is
        the fetch plus this scrape's own processing, not its wait for the group."""
        t0 = time.perf_counter()
        try:
            out = process_scrape(body, ctype, scrape_ts, self.spec.labels, self.state,
                                 honor_labels=self.cfg.honor_labels, honor_timestamps=self.cfg.honor_timestamps,
                                 mrc=self.cfg.metric_relabel_configs, sample_limit=self.cfg.sample_limit)
        except IngestError as e:
            return self._work_fail(b"", ctype, scrape_ts, fetch_s + time.perf_counter() - t0, e.message)
        dur = fetch_s + time.perf_counter() - t0
        self.last_samples = out.scraped
        rep = report_batch(self.spec.labels, scrape_ts, 1.0, dur, out.scraped, out.post_relabel, out.added)
        if out.exemplars and self.exemplars is not None:
            self.exemplars.add(DEFAULT_TENANT, out.exemplars)
        return merge(out.batch, rep), ""

    def _work_fail(self, _body: bytes, _ctype: str, scrape_ts: int, fetch_s: float, err: str) -> tuple[SampleBatch, str]:
        stale = self.state.forget_series()
        return report_batch(self.spec.labels, scrape_ts, 0.0, fetch_s, 0, 0, 0, stale_from=stale), err

    def snapshot(self) -> dict[str, Any]:
        return {
            "discoveredLabels": dict(self.spec.discovered),
            "labels": dict(self.spec.labels),
            "scrapePool": self.cfg.job_name,
            "scrapeUrl": self.spec.url,
            "globalUrl": self.spec.url,
            "lastError": self.last_error,
            "lastScrape": (datetime.fromtimestamp(self.last_scrape, timezone.utc).isoformat().replace("+00:00", "Z")
                           if self.last_scrape else "0001-01-01T00:00:00Z"),
            "lastScrapeDuration": round(self.last_duration, 6),
            "health": self.health,
            "scrapeInterval": format_duration(self.spec.interval_ms),
            "scrapeTimeout": format_duration(self.spec.timeout_ms),
        }
