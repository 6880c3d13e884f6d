"""``@`` timestamps before 1970 (``foo @ -100``).

The parser keeps an ``@`` time as integer milliseconds (Go's ``timestamp.FromFloatSeconds``:
rounded half away from zero), negative ones included. Checked in-process over samples at negative timestamps, and side by side with a real Prometheus
2.42 (which supports negative ``@``) through both HTTP APIs on queries that need no stored data.
"""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest

from promql.engine import Engine
from promql.parser import parse
from promql.memory_source import MemorySource
from tests.helpers import ServerProcess, free_port, require_binary, wait_http


@pytest.fixture(scope="module")
def eng() -> Engine:
    src = MemorySource()
    src.add_series((("__name__", "foo"),), [-200_000, -100_000, 0, 100_000], [1.0, 2.0, 3.0, 4.0])
    return Engine(src)


def test_negative_at_milliseconds():
    assert parse("foo @ -100").at.ms == -100_000
    assert parse("foo @ -100.25").at.ms == -100_250
    assert parse("foo[5m] @ -0.5").vector_selector.at.ms == -500
    assert parse("foo @ -0.0005").at.ms == -1  # Go's math.Round: half away from zero
    assert parse("foo @ -0.0004").at.ms == 0
    assert parse("foo[1m:] @ -1e3").at.ms == -1_000_000


@pytest.mark.parametrize("query,expect", [
    ("foo @ -100", 2.0),  # the sample at -100 s
    ("foo @ -150", 1.0),  # lookback to the sample at -200 s
    ("foo @ -99.9995", 2.0),  # -99999.5 ms rounds to -100000
    ("count_over_time(foo[5m] @ -100)", 2.0),  # (-400 s, -100 s]: -200 s and -100 s
    ("sum(foo @ -200) + foo @ 100", 5.0),
    ("foo offset 100s @ -100", 1.0),  # -100 s - 100 s = -200 s
])
def test_negative_at_in_process(eng, query, expect):
    res = eng.instant_query(query, 1_000_000)
    assert res.values.tolist() == [expect]


def test_negative_at_subquery_and_range(eng):
    res = eng.instant_query("(foo)[2m:1m] @ -100", 1_000_000)
    off, ts, vals = res.csr
    assert ts.tolist() == [-180_000, -120_000] and vals.tolist() == [1.0, 1.0]
    res = eng.range_query("foo @ -100", 0, 120_000, 60_000)
    assert res.values.tolist() == [[2.0, 2.0, 2.0]]


def _get(base: str, path: str, params: dict) -> dict:
    url = f"{base}{path}?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


QUERIES = [
    "(vector(1))[1m:30s] @ -100",
    "count_over_time((vector(2))[2m:20s] @ -61)",
    "sum_over_time((vector(time()))[1m:15s] @ -100.5)",
    "absent(nonexistent @ -100)",
]


def test_negative_at_matches_prometheus(tmp_path):
    prom_bin = require_binary("prometheus")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1h\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "ab")
    prom = subprocess.Popen([prom_bin, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(tmp_path / "turboprom")
    try:
        prom_url = f"http://127.0.0.1:{port}"
        wait_http(prom_url + "/-/ready", timeout=60, proc=prom)
        server.start()
        for q in QUERIES:
            params = {"query": q, "time": "1000"}
            theirs = _get(prom_url, "/api/v1/query", params)
            ours = _get(server.url, "/api/v1/query", params)
            assert theirs["status"] == "success", theirs
            assert ours["status"] == "success", (q, ours)
            assert ours["data"] == theirs["data"], q
    finally:
        server.stop()
        if prom.poll() is None:
            prom.terminate()
            try:
                prom.wait(30)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait(10)
        log.close()
