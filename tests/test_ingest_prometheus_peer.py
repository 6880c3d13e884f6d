"""Real peers: Debian's Prometheus 2.42 remote-writes to TurboProm what it scrapes from a
prometheus_client exporter; and Debian's node exporter is scraped by both Prometheus and our
scraper at the same time. We compare what we stored with what Prometheus stored."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from storage.matchers import Matcher
from storage.stale import is_stale
from tests.helpers import ServerProcess, free_port, require_binary, wait_http
from tests.test_ingest_support import metric_value, read_stored

pytestmark = pytest.mark.peer


def _prom_query(base: str, query: str, t: float) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{t:.3f}"})
    doc = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _start_prometheus(tmp_path, config: str) -> tuple[subprocess.Popen, str]:
    binary = require_binary("prometheus")
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(config)
    log = open(tmp_path / "prometheus.log", "ab")
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.remote.flush-deadline=15s"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/-/ready", timeout=30, proc=proc)
    except Exception:
        proc.kill()
        raise
    return proc, base


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_prometheus_remote_write_exact_values(tmp_path):
    reg = CollectorRegistry()
    g = Gauge("peer_gauge", "A gauge.", ["kind"], registry=reg)
    values = {"pi": 3.141592653589793, "tiny": 1e-300, "neg": -2.5, "big": 1.7976931348623157e308}
    for k, v in values.items():
        g.labels(kind=k).set(v)
    c = Counter("peer_requests", "Requests.", ["code"], registry=reg)
    c.labels(code="200").inc(12345)
    exp_port = free_port()
    exp_server, _ = start_http_server(exp_port, addr="127.0.0.1", registry=reg)
    ours = ServerProcess(tmp_path / "data").start()
    prom = None
    try:
        prom, base = _start_prometheus(tmp_path, f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: app
    static_configs: [{{targets: ["127.0.0.1:{exp_port}"]}}]
remote_write:
  - url: {ours.url}/api/v1/write
    queue_config: {{batch_send_deadline: 1s, max_shards: 2, min_backoff: 100ms, max_backoff: 1s}}
    metadata_config: {{send: true, send_interval: 1s}}
""")
        deadline = time.time() + 40
        while time.time() < deadline and metric_value(ours.url, "turboprom_ingest_samples_total", protocol="remote_write") < 60:
            time.sleep(0.5)
        c.labels(code="200").inc(0.5)
        time.sleep(2.5)
        t_query = time.time()
        prom_result = _prom_query(base, '{job="app"}[10m]', t_query)
        time.sleep(3.0)  # let the sender deliver everything up to t_query
        meta = json.loads(urllib.request.urlopen(ours.url + "/api/v1/metadata?metric=peer_gauge").read())["data"]
        assert meta["peer_gauge"][0]["type"] == "gauge" and meta["peer_gauge"][0]["help"] == "A gauge."
        rejected = metric_value(ours.url, "turboprom_ingest_rejected_samples_total")
    finally:
        if prom is not None:
            _stop(prom)
        ours.stop()
        exp_server.shutdown()
    assert rejected == 0
    got = read_stored(ours.data_dir, [Matcher("job", "=", "app")])
    assert len(prom_result) >= 5 + 4 + 1
    names = set()
    for series in prom_result:
        labels = tuple(sorted(series["metric"].items()))
        names.add(series["metric"]["__name__"])
        assert labels in got, f"series {labels} not stored"
        p_ts = np.array([round(float(t) * 1000) for t, _ in series["values"]], np.int64)
        p_vs = np.array([float(v) for _, v in series["values"]], np.float64)
        ts, vs = got[labels]
        keep = (ts <= p_ts[-1]) & ~is_stale(vs)
        assert ts[keep].tolist() == p_ts.tolist(), labels
        assert np.array_equal(vs[keep].view(np.uint64), p_vs.view(np.uint64)), labels
    assert {"peer_gauge", "peer_requests_total", "up", "scrape_duration_seconds"} <= names
    pi = got[(("__name__", "peer_gauge"), ("instance", f"127.0.0.1:{exp_port}"), ("job", "app"), ("kind", "pi"))][1]
    assert np.all(pi == values["pi"])
    reqs = got[(("__name__", "peer_requests_total"), ("code", "200"), ("instance", f"127.0.0.1:{exp_port}"), ("job", "app"))][1]
    assert reqs[0] == 12345.0 and reqs[-1] == 12345.5


def test_node_exporter_same_series_set_as_prometheus(tmp_path):
    """Both scrape the same targets at the same time: the node exporter (text format) and a
    prometheus_client exporter answering OpenMetrics (counters, histograms, summaries, info,
    enum/stateset, _created samples). Same series sets, and same values for the static ones."""
    from prometheus_client import Enum, Histogram, Info, Summary

    ne = require_binary("prometheus-node-exporter")
    ne_port = free_port()
    ne_log = open(tmp_path / "node-exporter.log", "ab")
    ne_proc = subprocess.Popen([ne, f"--web.listen-address=127.0.0.1:{ne_port}"], stdout=ne_log, stderr=subprocess.STDOUT)
    reg = CollectorRegistry()
    Counter("om_jobs", "Jobs.", ["kind"], registry=reg).labels(kind="a").inc(3)
    h = Histogram("om_latency_seconds", "Latency.", buckets=(0.1, 1.0), registry=reg)
    h.observe(0.05)
    h.observe(0.5)
    Summary("om_size_bytes", "Sizes.", registry=reg).observe(1024)
    Info("om_build", "Build info.", registry=reg).info({"version": "1.2.3"})
    Enum("om_state", "State.", states=["up", "down"], registry=reg).state("down")
    Gauge("om_temp_celsius", "Temp.", registry=reg).set(21.25)
    om_port = free_port()
    om_server, _ = start_http_server(om_port, addr="127.0.0.1", registry=reg)
    prom = ours = None
    try:
        wait_http(f"http://127.0.0.1:{ne_port}/metrics", timeout=30, proc=ne_proc)
        scrape = f"""
  - job_name: node
    scrape_interval: 2s
    scrape_timeout: 2s
    static_configs: [{{targets: ["127.0.0.1:{ne_port}"]}}]
  - job_name: om
    scrape_interval: 2s
    scrape_timeout: 2s
    static_configs: [{{targets: ["127.0.0.1:{om_port}"]}}]
"""
        cfg = tmp_path / "ours.yml"
        cfg.write_text("scrape_configs:" + scrape)
        ours = ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
        prom, base = _start_prometheus(tmp_path, "scrape_configs:" + scrape)
        deadline = time.time() + 30  # Prometheus applies discovered targets after ~5s
        while time.time() < deadline and len(_prom_query(base, 'up{job=~"node|om"}', time.time())) < 2:
            time.sleep(0.5)
        t0 = time.time()
        time.sleep(6.0)
        t1 = time.time()
        prom_series = {}
        for job in ("node", "om"):
            url = f"{base}/api/v1/series?" + urllib.parse.urlencode({"match[]": f'{{job="{job}"}}', "start": f"{t0:.3f}", "end": f"{t1:.3f}"})
            prom_series[job] = json.loads(urllib.request.urlopen(url, timeout=10).read())["data"]
        up = _prom_query(base, 'up{job=~"node|om"}', t1)
        om_values = {tuple(sorted(r["metric"].items())): float(r["value"][1])
                     for r in _prom_query(base, '{job="om", __name__!~"scrape_.*|up|.*_created"}', t1)}
    finally:
        if prom is not None:
            _stop(prom)
        if ours is not None:
            ours.stop()
        _stop(ne_proc)
        om_server.shutdown()
    assert len(up) == 2 and all(u["value"][1] == "1" for u in up)
    for job in ("node", "om"):
        theirs = {tuple(sorted(x.items())) for x in prom_series[job]}
        got = read_stored(ours.data_dir, [Matcher("job", "=", job)], int(t0 * 1000), int(t1 * 1000))
        mine = set(got)
        assert len(theirs) > (100 if job == "node" else 15)
        only_theirs = sorted(theirs - mine)[:10]
        only_mine = sorted(mine - theirs)[:10]
        assert not only_theirs and not only_mine, (job, only_theirs, only_mine)
        (_, up_vals), = [v for k, v in got.items() if dict(k)["__name__"] == "up"]
        assert np.all(up_vals == 1.0)
        if job == "om":
            for lbl, v in om_values.items():
                assert got[lbl][1][-1] == v, lbl
            assert len(om_values) >= 12


@pytest.mark.parametrize("status", [429, pytest.param(503, marks=pytest.mark.slow)])
def test_prometheus_retries_through_overload(tmp_path, status):
    """Ingest overloaded by a slow upload from this test, which holds the budget of bytes being
    received (a slow upload holds no queue slot): Prometheus's sender gets 429/503 with Retry-After,
    backs off and retries; in the end every sample Prometheus scraped is stored exactly (nothing
    acknowledged or refused-as-overloaded is lost)."""
    import socket

    reg = CollectorRegistry()
    g = Gauge("ovl_gauge", "Overload test.", ["i"], registry=reg)
    for i in range(300):
        g.labels(i=str(i)).set(i * 0.5)
    exp_port = free_port()
    exp_server, _ = start_http_server(exp_port, addr="127.0.0.1", registry=reg)
    cfg = tmp_path / "ours.yml"
    budget = 256 * 1024
    cfg.write_text(f"ingest: {{max_queue: 1, max_reading_bytes: {budget}, overload_status: {status}}}\n")
    ours = ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    prom = None
    retry_429 = "retry_on_http_429: true, " if status == 429 else ""
    try:
        prom, base = _start_prometheus(tmp_path, f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: ovl
    static_configs: [{{targets: ["127.0.0.1:{exp_port}"]}}]
remote_write:
  - url: {ours.url}/api/v1/write
    queue_config: {{{retry_429}batch_send_deadline: 500ms, min_backoff: 50ms, max_backoff: 500ms}}
""")
        deadline = time.time() + 40
        while time.time() < deadline and metric_value(ours.url, "turboprom_ingest_samples_total") < 300:
            time.sleep(0.3)
        # hold nearly all of the reading budget: headers and most of a body, then nothing for a while
        held = budget - 64
        sock = socket.create_connection(("127.0.0.1", ours.port))
        sock.sendall(b"POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                     + f"Content-Length: {held + 56}\r\n\r\n".encode() + b"\x00" * held)
        deadline = time.time() + 20
        while time.time() < deadline and metric_value(ours.url, "turboprom_ingest_requests_total", code=str(status)) < 2:
            time.sleep(0.2)
        time.sleep(1.0)
        overloaded = metric_value(ours.url, "turboprom_ingest_requests_total", code=str(status))
        sock.sendall(b"\x00" * 56)  # finish the upload: a malformed body, answered 400, slot freed
        sock.recv(4096)
        sock.close()
        t_query = time.time()
        prom_result = _prom_query(base, '{job="ovl"}[10m]', t_query)
        want = sum(len(x["values"]) for x in prom_result)
        deadline = time.time() + 40
        while time.time() < deadline and metric_value(ours.url, "turboprom_ingest_samples_total") < want:
            time.sleep(0.3)
        time.sleep(1.0)
    finally:
        if prom is not None:
            _stop(prom)
        ours.stop()
        exp_server.shutdown()
    assert overloaded >= 2, "no overload answers happened: the test did not exercise back-off"
    got = read_stored(ours.data_dir, [Matcher("job", "=", "ovl")])
    assert len(prom_result) >= 300
    differ = 0
    for series in prom_result:
        labels = tuple(sorted(series["metric"].items()))
        p_ts = [round(float(t) * 1000) for t, _ in series["values"]]
        p_vs = [float(v) for _, v in series["values"]]
        ts, vs = got.get(labels, (np.zeros(0, np.int64), np.zeros(0)))
        keep = ts <= p_ts[-1]
        if ts[keep].tolist() != p_ts or vs[keep].tolist() != p_vs:
            differ += 1
    assert differ == 0, f"{differ} series differ from what Prometheus scraped"
