"""The built-in page in a real browser: Debian's Chromium, headless, driven over the Chrome DevTools
protocol (aiohttp's WebSocket client) against the real server on loopback.

One browser and one server (with a real scrape target and a real rule file) serve every check, to
keep the run short: no console errors on any page, a Prometheus-style ``?g0.expr=`` link draws the
query's series (pixels of the series' colours on the canvas, the x axis spanning the chosen range),
hovering shows each series' value, typing gives autocomplete from the API, and the status pages show
the server's real targets, rules, alerts, TSDB figures, flags, config and version.
"""
from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from PIL import Image

import turboprom
from tests.helpers import ServerProcess, free_port, require_binary

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,1000", "--force-device-scale-factor=1"]


class Browser:
    """One Chromium page over CDP: navigate, evaluate, wait for a condition, mouse, screenshot."""

    def __init__(self, profile: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([require_binary("chromium"), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                      f"--remote-debugging-port={self.port}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.errors: list[str] = []
        self._id = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._events: dict[str, asyncio.Event] = {}

    async def start(self) -> None:
        self.http = aiohttp.ClientSession()
        deadline = time.time() + 30
        while True:
            try:
                async with self.http.get(f"http://127.0.0.1:{self.port}/json/list") as r:
                    pages = [t for t in await r.json() if t["type"] == "page"]
                if pages:
                    break
            except aiohttp.ClientError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools endpoint")
            await asyncio.sleep(0.2)
        self.ws = await self.http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")

    async def _read(self) -> None:
        async for msg in self.ws:
            m = json.loads(msg.data)
            if "id" in m and m["id"] in self._pending:
                fut = self._pending.pop(m["id"])
                if "error" in m:
                    fut.set_exception(RuntimeError(f"CDP error: {m['error']}"))
                else:
                    fut.set_result(m.get("result", {}))
                continue
            method, p = m.get("method", ""), m.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                self.errors.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                self.errors.append("exception: " + str(d.get("exception", {}).get("description", d.get("text"))))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                self.errors.append("log: " + p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
            if method in self._events:
                self._events[method].set()

    async def send(self, method: str, **params: Any) -> dict:
        self._id += 1
        fut = asyncio.get_running_loop().create_future()
        self._pending[self._id] = fut
        await self.ws.send_str(json.dumps({"id": self._id, "method": method, "params": params}))
        return await asyncio.wait_for(fut, 30)

    async def goto(self, url: str) -> None:
        ev = self._events["Page.loadEventFired"] = asyncio.Event()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(ev.wait(), 30)

    async def js(self, expr: str) -> Any:
        r = await self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def wait(self, cond: str, timeout: float = 20.0) -> Any:
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = await self.js(cond)
            if v:
                return v
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {cond}; page text: {await self.js('document.body.innerText')!r:.2000}")

    async def mouse(self, x: float, y: float) -> None:
        await self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    async def screenshot(self, clip: dict | None = None) -> np.ndarray:
        r = await self.send("Page.captureScreenshot", format="png", **({"clip": {**clip, "scale": 1}} if clip else {}))
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(r["data"]))).convert("RGB")).astype(int)

    async def close(self) -> None:
        try:
            await self.ws.close()
            await self.http.close()
            self._reader.cancel()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


RULES = """groups:
  - name: ui-demo
    interval: 1s
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
      - alert: LoadHigh
        expr: demo_load > 60
        labels: {severity: page}
        annotations: {summary: "load is high"}
"""


def _import(url: str, text: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url + "/api/v1/import/prometheus", data=text.encode(), method="POST"), timeout=30).read()


def _colour(img: np.ndarray, hexcolour: str, tol: int = 40) -> np.ndarray:
    r, g, b = (int(hexcolour[i:i + 2], 16) for i in (1, 3, 5))
    return (abs(img[..., 0] - r) < tol) & (abs(img[..., 1] - g) < tol) & (abs(img[..., 2] - b) < tol)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("ui")
    port = free_port()
    (tmp / "rules.yml").write_text(RULES)
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(tmp / "rules.yml")],
           "scrape_configs": [{"job_name": "turboprom", "scrape_interval": "1s", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
                              {"job_name": "down-target", "scrape_interval": "1s",
                               "static_configs": [{"targets": [f"127.0.0.1:{free_port()}"]}]}]}
    (tmp / "config.yml").write_text(json.dumps(cfg))
    with ServerProcess(tmp / "data", ["--config", str(tmp / "config.yml")], port=port) as srv:
        now = int(time.time())
        lines = [f'demo_load{{gpu="{g}"}} {v:.3f} {(now - 1800 + k * 10) * 1000}'
                 for k in range(181) for g, v in (("0", 50 + 40 * np.sin(k / 12)), ("1", 30 + 10 * np.cos(k / 18)))]
        _import(srv.url, "\n".join(lines) + "\n")
        yield srv, tmp, now


def test_pages_in_chromium(server) -> None:
    srv, tmp, now = server
    asyncio.run(_browse(srv.url, tmp, now))


def _demo_load(gpu: str, t: float, now: int) -> float:
    """The imported demo_load value in force at time t (samples every 10 s from now - 1800)."""
    k = int((t - (now - 1800)) // 10)
    return round(50 + 40 * np.sin(k / 12), 3) if gpu == "0" else round(30 + 10 * np.cos(k / 18), 3)


async def _browse(url: str, tmp: Path, now: int) -> None:
    b = Browser(tmp / "chrome-profile")
    await b.start()
    try:
        await _graph_link(b, url)
        await _hover(b, now)
        await _zoom_and_stack(b, now)
        await _autocomplete(b, url)
        await _status_pages(b, url)
        assert not b.errors, b.errors
    finally:
        await b.close()


async def _graph_link(b: Browser, url: str) -> None:
    # A Prometheus-style link (as Prometheus's own UI and Grafana's "explore in Prometheus" write them).
    end = int(time.time())
    q = urllib.parse.urlencode({"g0.expr": "demo_load", "g0.tab": "0", "g0.range_input": "30m", "g0.end_input": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(end))})
    await b.goto(f"{url}/graph?{q}")
    await b.wait("document.querySelector('.chart')?.dataset.series === '2'")
    assert await b.js("document.querySelector('textarea.expr').value") == "demo_load"
    assert await b.js("document.querySelector('.range-input').value") == "30m"
    # the header names TurboProm and its version, never a Prometheus version
    header = await b.js("document.querySelector('header .brand').innerText")
    assert header.startswith("TurboProm") and turboprom.__version__ in header and "2.42" not in header
    # the x axis spans the chosen range (not only the data), and both series are in the legend
    labels = await b.js("[...document.querySelectorAll('.u-legend .u-label')].map(e => e.innerText)")
    assert any('gpu="0"' in x for x in labels) and any('gpu="1"' in x for x in labels), labels
    box = await b.js("(() => { const r = document.querySelector('.chart .u-over').getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height}; })()")
    img = await b.screenshot(box)
    orange, blue = _colour(img, "#e6522c"), _colour(img, "#1f77b4")
    assert orange.sum() > 300 and blue.sum() > 300, (orange.sum(), blue.sum())
    # the series start 30 minutes before the end: the first pixels of the plot hold data, the range is the chosen one
    cols = np.nonzero(orange.any(axis=0))[0]
    assert cols.min() < img.shape[1] * 0.05 and cols.max() > img.shape[1] * 0.95, (cols.min(), cols.max(), img.shape)
    # the x axis spans exactly the chosen range, whatever the data covers
    span = await b.js("(() => { const s = document.querySelector('.chart').uplot.scales.x; return [s.min, s.max]; })()")
    assert span == [end - 1800, end], (span, end)
    # every x tick label, the last included, lies inside the chart (uPlot draws them on the canvas)
    clipped = await b.js("""(() => { const u = document.querySelector('.chart').uplot, ax = u.axes[0];
        u.ctx.font = ax.font[0];
        return ax._splits.map((v, i) => { const x = u.valToPos(v, 'x') + u.bbox.left / devicePixelRatio, w = u.ctx.measureText(ax._values[i]).width;
            return [x - w / 2, x + w / 2]; }).filter(([l, r]) => l < 0 || r > u.width).length; })()""")
    assert clipped == 0
    # y ticks are round numbers (steps of 1, 2 or 5 times a power of ten)
    ticks = await b.js("document.querySelector('.chart').uplot.axes[1]._values")
    vals = [float(t) for t in ticks]
    steps = {round(y - x, 9) for x, y in zip(vals, vals[1:])}
    assert len(ticks) >= 3 and len(steps) == 1 and f"{steps.pop():.0e}"[0] in "125", ticks
    # the URL keeps Prometheus's parameters
    href = await b.js("location.search")
    assert "g0.expr=demo_load" in href and "g0.range_input=30m" in href and "g0.tab=0" in href


async def _hover(b: Browser, now: int) -> None:
    box = await b.js("(() => { const r = document.querySelector('.chart .u-over').getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; })()")
    await b.mouse(box["x"] + box["w"] * 0.5, box["y"] + box["h"] * 0.5)
    tip = await b.wait("(() => { const t = document.querySelector('.chart .tooltip'); return t && !t.hidden && t.innerText; })()")
    assert 'gpu="0"' in tip and 'gpu="1"' in tip, tip
    # the legend shows each series' value at the hovered time: the very values imported
    t = await b.js("(() => { const u = document.querySelector('.chart').uplot; return u.data[0][u.cursor.idx]; })()")
    values = await b.js("[...document.querySelectorAll('.u-legend .u-series .u-value')].slice(1).map(e => e.innerText)")
    assert len(values) == 2, values
    for gpu, v in zip("01", values):
        assert abs(float(v) - _demo_load(gpu, t, now)) <= 1e-3 * abs(_demo_load(gpu, t, now)), (gpu, v, t, _demo_load(gpu, t, now))
    # legend click toggles a series off
    await b.js("document.querySelectorAll('.u-legend .u-series')[1].querySelector('th').click()")
    assert await b.js("document.querySelectorAll('.u-legend .u-series')[1].classList.contains('u-off')")


async def _zoom_and_stack(b: Browser, now: int) -> None:
    box = await b.js("(() => { const r = document.querySelector('.chart .u-over').getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; })()")
    y = box["y"] + box["h"] / 2
    await b.send("Input.dispatchMouseEvent", type="mousePressed", x=box["x"] + box["w"] * 0.25, y=y, button="left", clickCount=1)
    for f in (0.35, 0.5, 0.65, 0.75):
        await b.send("Input.dispatchMouseEvent", type="mouseMoved", x=box["x"] + box["w"] * f, y=y, button="left", buttons=1)
    await b.send("Input.dispatchMouseEvent", type="mouseReleased", x=box["x"] + box["w"] * 0.75, y=y, button="left", clickCount=1)
    # drag-to-zoom re-queries the selected half of the range: the axis spans it and the URL carries it
    await b.wait("(() => { const s = document.querySelector('.chart').uplot?.scales.x; return s && Math.abs((s.max - s.min) - 900) < 20; })()")
    assert "g0.end_input=" in await b.js("location.search")
    # stacked: the second series is drawn on top of the first, its hover value is still its own
    await b.js("document.querySelector('.stacked-box').click()")
    await b.wait("location.search.includes('g0.stacked=1') && document.querySelector('.chart').uplot?.series.length === 3 && document.querySelector('.chart').uplot.bands.length === 1")
    await b.mouse(box["x"] + box["w"] * 0.5, y)
    await b.wait("document.querySelector('.chart .tooltip') && !document.querySelector('.chart .tooltip').hidden")
    t, lower, upper = await b.js("(() => { const u = document.querySelector('.chart').uplot, i = u.cursor.idx; return [u.data[0][i], u.data[1][i], u.data[2][i]]; })()")
    assert abs(upper - lower - _demo_load("1", t, now)) < 1e-6 and abs(lower - _demo_load("0", t, now)) < 1e-6, (t, lower, upper)
    values = await b.js("[...document.querySelectorAll('.u-legend .u-series .u-value')].slice(1).map(e => e.innerText)")
    assert abs(float(values[1]) - _demo_load("1", t, now)) <= 1e-3 * _demo_load("1", t, now), values


async def _autocomplete(b: Browser, url: str) -> None:
    await b.goto(f"{url}/graph")
    await b.js("(() => { const t = document.querySelector('textarea.expr'); t.focus(); t.value = 'demo_lo'; t.selectionStart = t.selectionEnd = 7; t.dispatchEvent(new Event('input')); })()")
    items = await b.wait("[...document.querySelectorAll('.ac-list li .ac-text')].map(e => e.innerText).join(',')")
    assert "demo_load" in items.split(","), items
    await b.js("(() => { const t = document.querySelector('textarea.expr'); t.value = 'histogram_qu'; t.selectionStart = t.selectionEnd = 12; t.dispatchEvent(new Event('input')); })()")
    items = await b.wait("[...document.querySelectorAll('.ac-list li .ac-text')].map(e => e.innerText).join(',').includes('histogram_quantile') && 'ok'")
    # label names inside a selector, and accepting with Enter, then running with Enter
    await b.js("(() => { const t = document.querySelector('textarea.expr'); t.value = 'demo_load{gp'; t.selectionStart = t.selectionEnd = 12; t.dispatchEvent(new Event('input')); })()")
    await b.wait("[...document.querySelectorAll('.ac-list li .ac-text')].some(e => e.innerText === 'gpu')")
    await b.send("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter", windowsVirtualKeyCode=13)
    assert await b.js("document.querySelector('textarea.expr').value") == "demo_load{gpu"
    await b.js("(() => { const t = document.querySelector('textarea.expr'); t.value = 'sum(demo_load)'; t.dispatchEvent(new Event('input')); })()")
    await b.send("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter", windowsVirtualKeyCode=13)
    await b.wait("document.querySelector('.chart')?.dataset.series === '1'")
    assert "sum(demo_load)" in await b.js("localStorage.getItem('turboprom.queryHistory')")
    # the table tab evaluates at the end time; the history list brings a past query back
    await b.js("document.querySelector('.tab-btn[data-tab=table]').click()")
    rows = await b.wait("[...document.querySelectorAll('.result-table tr')].map(r => r.innerText).join('|') || null")
    assert rows.startswith("{}\t") and float(rows.split("\t")[1]) > 0, rows
    assert "g0.tab=1" in await b.js("location.search")
    await b.js("[...document.querySelectorAll('.panel button')].find(x => x.innerText === 'History').click()")
    assert "sum(demo_load)" in await b.wait("document.querySelector('.history-list:not([hidden])')?.innerText")
    # a second panel from the metric browser: pick a metric, run it; both panels are in the URL
    await b.js("document.querySelector('.add-panel').click()")
    await b.js("[...document.querySelectorAll('.panel')[1].querySelectorAll('button')].find(x => x.innerText === 'Metrics').click()")
    await b.wait("!!document.querySelector('.modal .browser-row')")
    await b.js("(() => { const f = document.querySelector('.modal input'); f.value = 'demo_lo'; f.dispatchEvent(new Event('input')); })()")
    await b.wait("document.querySelectorAll('.modal .browser-row').length === 1")
    await b.js("document.querySelector('.modal .browser-row').click()")
    assert await b.js("document.querySelectorAll('.panel')[1].querySelector('textarea').value") == "demo_load"
    await b.js("document.querySelectorAll('.panel')[1].querySelector('.exec').click()")
    await b.wait("document.querySelectorAll('.panel')[1].querySelector('.chart').dataset.series === '2'")
    qs = urllib.parse.parse_qs((await b.js("location.search"))[1:])
    assert qs["g0.expr"] == ["sum(demo_load)"] and qs["g1.expr"] == ["demo_load"], qs


async def _status_pages(b: Browser, url: str) -> None:
    async def page(path: str) -> str:
        await b.goto(url + path)
        await b.wait("document.querySelector('#main').dataset.ready")
        assert await b.js("document.querySelector('#main').dataset.ready") == "1", await b.js("document.body.innerText")
        return await b.js("document.querySelector('#main').innerText")

    deadline = time.time() + 20
    while True:  # the first scrapes and rule evaluations
        text = await page("/targets")
        if "UP" in text and "DOWN" in text and "(1/1 up)" in text or time.time() > deadline:
            break
        await asyncio.sleep(0.5)
    assert "turboprom (1/1 up)" in text and "down-target (0/1 up)" in text and "cannot connect" in text.lower(), text
    text = await page("/service-discovery")
    assert "__address__" in text and "down-target" in text, text
    deadline = time.time() + 20
    while "FIRING" not in (text := await page("/alerts")) and time.time() < deadline:
        await asyncio.sleep(0.5)
    assert "LoadHigh" in text and "FIRING" in text and 'gpu="0"' in text, text
    text = await page("/rules")
    assert "record: job:up:sum" in text and "alert: LoadHigh" in text and "ui-demo" in text, text
    text = await page("/tsdb-status")
    with urllib.request.urlopen(url + "/api/v1/status/tsdb", timeout=10) as r:
        top = json.loads(r.read())["data"]["seriesCountByMetricName"][0]
    assert f"{top['name']}\t" in text and "Number of series" in text, (top, text)
    text = await page("/flags")
    assert "--storage.tsdb.path" in text, text
    text = await page("/config")
    assert "down-target" in text and "rule_files" in text, text
    text = await page("/status")
    assert turboprom.__version__ in text and "Start time" in text, text
    text = await page("/cardinality")
    await b.wait("document.querySelector('#main').innerText.includes('Series by metric name')")
    text = await page("/query-log")
    assert "demo_load" in text, text
    for path in ("/planner", "/congestion", "/audit", "/cost"):
        await page(path)
