"""Scrapes grouped for processing and appending (ingest/scrape/groups.py): one append per group,
each scrape's own result or failure back to its loop, and, on a real server, every target's samples
stored while scrapes share appends."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ingest.scrape.groups import ScrapeGroups, scrape_group_window_s
from storage.batch import SampleBatch
from storage.labels import make_labels
from tests.helpers import ServerProcess
from tests.test_ingest_support import metric_value


def _batch(i: int) -> SampleBatch:
    return SampleBatch([make_labels({"__name__": "m", "target": str(i)})], np.zeros(1, np.int64),
                       np.array([1000 + i], np.int64), np.array([float(i)]))


def test_scrapes_within_the_window_share_one_append() -> None:
    appended: list[SampleBatch] = []
    pool = ThreadPoolExecutor(2)

    async def main() -> list:
        g = ScrapeGroups(appended.append, pool, window_s=0.05)
        futs = [g.submit(lambda i=i: (_batch(i), f"r{i}")) for i in range(5)]
        out = await asyncio.gather(*futs)
        later = await g.submit(lambda: (_batch(9), "r9"))
        return [*out, later, g.groups, g.scrapes]

    res = asyncio.run(main())
    pool.shutdown()
    assert res[:6] == ["r0", "r1", "r2", "r3", "r4", "r9"] and res[6:] == [2, 6]
    assert len(appended) == 2
    first = appended[0]
    assert sorted(dict(first.series[j])["target"] for j in first.series_index.tolist()) == ["0", "1", "2", "3", "4"]
    assert first.values.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_failing_scrape_fails_alone_and_a_failing_append_fails_all() -> None:
    pool = ThreadPoolExecutor(2)
    appended: list[SampleBatch] = []

    def boom() -> tuple:
        raise ValueError("bad body")

    def refuse(batch: SampleBatch) -> None:
        raise OSError("disk full")

    async def main() -> tuple:
        g = ScrapeGroups(appended.append, pool, window_s=0.02)
        ok, bad = g.submit(lambda: (_batch(1), "ok")), g.submit(boom)
        r = await asyncio.gather(ok, bad, return_exceptions=True)
        h = ScrapeGroups(refuse, pool, window_s=0.02)
        r2 = await asyncio.gather(h.submit(lambda: (_batch(2), "a")), h.submit(lambda: (None, "b")), return_exceptions=True)
        return r, r2

    r, r2 = asyncio.run(main())
    pool.shutdown()
    assert r[0] == "ok" and isinstance(r[1], ValueError) and len(appended) == 1
    assert all(isinstance(x, OSError) for x in r2)


def test_a_loop_asks_for_a_shorter_wait_than_the_window() -> None:
    """A scrape loop caps its wait at a tenth of its interval: the group is flushed by then."""
    pool = ThreadPoolExecutor(1)

    async def main() -> float:
        g = ScrapeGroups(lambda b: None, pool, window_s=5.0)
        t0 = time.perf_counter()
        await g.submit(lambda: (_batch(1), None), max_wait_s=0.05)
        return time.perf_counter() - t0

    took = asyncio.run(main())
    pool.shutdown()
    assert took < 2.0


def test_window_setting() -> None:
    assert scrape_group_window_s({}) == 0.25
    assert scrape_group_window_s({"ingest": {"scrape_group_window": "1s"}}) == 1.0
    assert scrape_group_window_s({"ingest": {"scrape_group_window": 0}}) == 0.0


def test_server_groups_scrapes_and_stores_every_target(tmp_path: Path) -> None:
    """30 targets at 1 s on a real server: scrapes share appends (fewer groups than scrapes), and
    every target's samples and report series are stored."""
    from aiohttp import web

    ready = threading.Event()
    ports: list[int] = []
    stop: list = []

    def serve() -> None:
        async def handle(request: web.Request) -> web.Response:
            port = request.transport.get_extra_info("sockname")[1]
            return web.Response(text=f'# TYPE work gauge\nwork{{kind="a"}} {port}\nwork{{kind="b"}} 2\n',
                                content_type="text/plain")

        async def main() -> None:
            app = web.Application()
            app.router.add_get("/metrics", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            for _ in range(30):
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
            done = asyncio.Event()
            stop.append((asyncio.get_running_loop(), done))
            ready.set()
            await done.wait()
            await runner.cleanup()

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text("scrape_configs:\n  - job_name: fleet\n    scrape_interval: 1s\n    static_configs:\n"
                   f"      - targets: [{', '.join(f'127.0.0.1:{p}' for p in ports)}]\n")
    server = ServerProcess(tmp_path / "data", ["--config", str(cfg)]).start()
    try:
        import json
        import urllib.parse
        import urllib.request

        def query(q: str) -> list:
            url = server.url + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
            return json.loads(urllib.request.urlopen(url, timeout=10).read())["data"]["result"]

        deadline = time.time() + 30
        while time.time() < deadline and metric_value(server.url, "turboprom_scrapes_total", outcome="ok") < 150:
            time.sleep(0.5)
        scrapes = metric_value(server.url, "turboprom_scrapes_total", outcome="ok")
        groups = metric_value(server.url, "turboprom_scrape_groups_total")
        assert scrapes >= 150 and 0 < groups < 0.8 * scrapes, (scrapes, groups)
        assert len(query('work{job="fleet",kind="a"}')) == 30
        assert {int(r["metric"]["instance"].rsplit(":", 1)[1]) for r in query('work{kind="a"}')} == set(ports)
        assert all(float(r["value"][1]) == int(r["metric"]["instance"].rsplit(":", 1)[1]) for r in query('work{kind="a"}'))
        assert len(query('up{job="fleet"} == 1')) == 30
        durations = [float(r["value"][1]) for r in query('scrape_duration_seconds{job="fleet"}')]
        assert len(durations) == 30 and all(0 < d < 1.0 for d in durations)
    finally:
        server.stop()
        loop, done = stop[0]
        loop.call_soon_threadsafe(done.set)
        t.join(10)
