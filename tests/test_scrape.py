"""Our scraper against real exporters (prometheus_client HTTP servers started here), through the
real server: report series, relabeling, honor_labels, staleness on series/target disappearance,
file_sd reload, failing targets. Stored data is read from the data dir after the server stops."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from storage.labels import make_labels
from storage.matchers import Matcher
from storage.stale import is_stale
from tests.helpers import ServerProcess, free_port
from tests.test_ingest_support import name_is, read_stored


def _exporter():
    reg = CollectorRegistry()
    g = Gauge("exp_temperature", "Temperature.", ["room"], registry=reg)
    g.labels(room="a").set(21.5)
    g.labels(room="b").set(-3.0)
    c = Counter("exp_events", "Events.", registry=reg)
    c.inc(7)
    clash = Gauge("exp_clash", "Has a job label.", ["job"], registry=reg)
    clash.labels(job="inner").set(1)
    Gauge("exp_dropme", "Dropped by metric relabeling.", registry=reg).set(5)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    return port, server, g


def _wait_for(pred, timeout=20.0, step=0.25):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def test_scrape_report_relabel_staleness_file_sd(tmp_path):
    p1, srv1, gauge1 = _exporter()
    p2, srv2, _ = _exporter()
    dead = free_port()
    sd = tmp_path / "targets.json"
    sd.write_text(f'[{{"targets": ["127.0.0.1:{p2}"], "labels": {{"zone": "z2"}}}}]')
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: exp
    static_configs:
      - targets: ["127.0.0.1:{p1}"]
        labels: {{zone: z1}}
    relabel_configs:
      - source_labels: [zone]
        regex: "z(.*)"
        target_label: zone_num
        replacement: "n$1"
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: exp_dropme
        action: drop
  - job_name: filesd
    file_sd_configs:
      - files: ["{sd}"]
        refresh_interval: 1s
  - job_name: dead
    scrape_timeout: 500ms
    static_configs:
      - targets: ["127.0.0.1:{dead}"]
""")
    server = ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        time.sleep(3.5)
        gauge1.remove("b")  # series disappears from target 1 -> stale marker
        time.sleep(2.0)
        sd.write_text("[]")  # target 2 disappears -> stale markers for all its series
        time.sleep(3.0)
    finally:
        server.stop()
        srv1.shutdown()
        srv2.shutdown()
    inst1 = f"127.0.0.1:{p1}"
    tl1 = {"job": "exp", "instance": inst1, "zone": "z1", "zone_num": "n1"}
    got = read_stored(server.data_dir, name_is("exp_temperature"))
    ts_a, vs_a = got[make_labels({"__name__": "exp_temperature", "room": "a", **tl1})]
    assert len(vs_a) >= 3 and np.all(vs_a == 21.5)
    assert np.all(np.diff(ts_a) > 500)  # one sample per ~1s scrape
    ts_b, vs_b = got[make_labels({"__name__": "exp_temperature", "room": "b", **tl1})]
    assert is_stale(vs_b[-1:]).all() and np.all(vs_b[:-1] == -3.0) and len(vs_b) >= 3
    # honor_labels: false -> the exposed job label is kept as exported_job
    clash = read_stored(server.data_dir, name_is("exp_clash"))
    assert make_labels({"__name__": "exp_clash", "exported_job": "inner", **tl1}) in clash
    # metric relabeling (job exp only) dropped exp_dropme
    assert read_stored(server.data_dir, [Matcher("__name__", "=", "exp_dropme"), Matcher("job", "=", "exp")]) == {}
    # report series
    up = read_stored(server.data_dir, [Matcher("__name__", "=", "up"), Matcher("job", "=", "exp")])
    (_, up_v), = up.values()
    assert np.all(up_v == 1.0) and len(up_v) >= 5
    scraped = read_stored(server.data_dir, [Matcher("__name__", "=", "scrape_samples_scraped"), Matcher("job", "=", "exp")])
    post = read_stored(server.data_dir, [Matcher("__name__", "=", "scrape_samples_post_metric_relabeling"), Matcher("job", "=", "exp")])
    (_, sv), = scraped.values()
    (_, pv), = post.values()
    assert np.all(sv - pv == 1.0)  # exactly the one exp_dropme sample dropped
    added = read_stored(server.data_dir, [Matcher("__name__", "=", "scrape_series_added"), Matcher("job", "=", "exp")])
    (_, av), = added.values()
    assert av[0] == pv[0] and np.all(av[1:] == 0)
    dur = read_stored(server.data_dir, [Matcher("__name__", "=", "scrape_duration_seconds"), Matcher("job", "=", "exp")])
    (_, dv), = dur.values()
    assert np.all((dv > 0) & (dv < 1))
    # file_sd target: scraped, then removed -> every series ends with a stale marker
    t2 = read_stored(server.data_dir, [Matcher("job", "=", "filesd")])
    assert make_labels({"__name__": "exp_temperature", "room": "a", "job": "filesd", "instance": f"127.0.0.1:{p2}", "zone": "z2"}) in t2
    assert len(t2) >= 10  # exporter families + report series; the exact count varies with collector timing
    for lbl, (_, vs) in t2.items():
        assert is_stale(vs[-1:]).all(), lbl
        assert len(vs) >= 2
    # dead target: up == 0
    dead_up = read_stored(server.data_dir, [Matcher("__name__", "=", "up"), Matcher("job", "=", "dead")])
    (_, dv), = dead_up.values()
    assert len(dv) >= 3 and np.all(dv == 0.0)


def test_honor_labels_and_timestamps(tmp_path):
    from aiohttp import web
    import asyncio
    import threading

    t_exposed = int(time.time() * 1000) - 30_000
    body = f'hl_metric{{job="from_target",x="1"}} 42 {t_exposed}\nhl_plain 1\n'
    port = free_port()
    loop = asyncio.new_event_loop()
    runner_holder = {}

    async def handler(_):
        return web.Response(text=body, content_type="text/plain")

    async def run():
        app = web.Application()
        app.router.add_get("/custom/path", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runner_holder["r"] = runner

    th = threading.Thread(target=lambda: (loop.run_until_complete(run()), loop.run_forever()), daemon=True)
    th.start()
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"""
scrape_configs:
  - job_name: honored
    scrape_interval: 1s
    honor_labels: true
    metrics_path: /custom/path
    params: {{module: [m1]}}
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
""")
    try:
        with ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]) as s:
            time.sleep(2.5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
    got = read_stored(s.data_dir, name_is("hl_metric"))
    lbl = make_labels({"__name__": "hl_metric", "job": "from_target", "x": "1", "instance": f"127.0.0.1:{port}"})
    ts, vs = got[lbl]
    assert ts.tolist()[0] == t_exposed and vs[0] == 42.0  # honor_timestamps default true
    plain = read_stored(s.data_dir, name_is("hl_plain"))
    assert make_labels({"__name__": "hl_plain", "job": "honored", "instance": f"127.0.0.1:{port}"}) in plain


@pytest.mark.parametrize("scheme", ["utf8", "legacy"])
def test_scrape_utf8_metric_names(tmp_path, scheme):
    """prometheus_client answers our Accept header (escaping=allow-utf-8) with quoted UTF-8 names:
    they are parsed and kept; under metric_name_validation_scheme: legacy we ask for
    escaping=underscores and get the escaped names, as Prometheus 3 does."""
    reg = CollectorRegistry()
    Gauge("gpu.util", "GPU utilisation.", ["k8s.pod"], registry=reg).labels("p-0").set(0.5)
    Gauge("vllm:num_requests_waiting", "Queue.", registry=reg).set(3)
    port = free_port()
    exporter, _ = start_http_server(port, addr="127.0.0.1", registry=reg)
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"global:\n  scrape_interval: 1s\n  metric_name_validation_scheme: {scheme}\n"
                   f"scrape_configs:\n  - job_name: u\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    server = ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        time.sleep(2.5)  # two or three scrapes at 1s
    finally:
        server.stop()
        exporter.shutdown()
    name, label = ("gpu.util", "k8s.pod") if scheme == "utf8" else ("gpu_util", "k8s_pod")
    inst = {"job": "u", "instance": f"127.0.0.1:{port}"}
    got = read_stored(server.data_dir, name_is(name))
    _, vs = got[make_labels({"__name__": name, label: "p-0", **inst})]
    assert len(vs) >= 1 and np.all(vs == 0.5)
    # prometheus-client's escaping=underscores also rewrites ':' (a legal legacy character): vLLM's names
    # arrive as vllm_* under the legacy scheme, exactly as a Prometheus 3 server in legacy mode sees them.
    qname = "vllm:num_requests_waiting" if scheme == "utf8" else "vllm_num_requests_waiting"
    _, qv = read_stored(server.data_dir, name_is(qname))[make_labels({"__name__": qname, **inst})]
    assert np.all(qv == 3.0)
    (_, up), = read_stored(server.data_dir, [Matcher("__name__", "=", "up"), Matcher("job", "=", "u")]).values()
    assert len(up) >= 1 and np.all(up == 1.0)


def test_scrape_keeps_openmetrics_exemplars(tmp_path):
    """A prometheus_client counter incremented with an exemplar: the scraper (OpenMetrics) stores it under
    the series' final labels, served by /api/v1/query_exemplars."""
    import urllib.parse

    from tests.helpers import http_json

    reg = CollectorRegistry()
    c = Counter("tokens", "Tokens generated.", ["model"], registry=reg)
    c.labels("m").inc(5, exemplar={"trace_id": "4bf92f3577b34da6"})
    port = free_port()
    exporter, _ = start_http_server(port, addr="127.0.0.1", registry=reg)
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ex\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{port}']\n")
    try:
        with ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]) as server:
            q = urllib.parse.urlencode({"query": 'tokens_total{job="ex"}', "start": time.time() - 60, "end": time.time() + 60})
            got = []
            assert _wait_for(lambda: bool(got.extend(http_json(server.url + "/api/v1/query_exemplars?" + q)[1]["data"]) or got))
    finally:
        exporter.shutdown()
    (series,) = got
    assert series["seriesLabels"] == {"__name__": "tokens_total", "model": "m", "job": "ex", "instance": f"127.0.0.1:{port}"}
    (ex,) = series["exemplars"]  # one exemplar, however often it was scraped (duplicates are no-ops)
    assert ex["labels"] == {"trace_id": "4bf92f3577b34da6"} and ex["value"] == "5"
