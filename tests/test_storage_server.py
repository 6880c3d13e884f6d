"""The store behind the real server: out-of-order window flag, rejections reported, samples
acknowledged over HTTP survive SIGKILL, storage self-metrics on /metrics."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from tests.helpers import ServerProcess

T = (int(time.time()) - 3600) // 60 * 60  # seconds


def post_text(url: str, body: str) -> tuple[int, str]:
    req = urllib.request.Request(url + "/api/v1/import/prometheus", data=body.encode(), method="POST",
                                 headers={"Content-Type": "text/plain"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def query(url: str, q: str, t: float) -> dict:
    qs = urllib.parse.urlencode({"query": q, "time": str(t)})
    with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=30) as r:
        return json.loads(r.read())


def test_out_of_order_window_and_durability_through_server(tmp_path):
    data = tmp_path / "data"
    srv = ServerProcess(data, ["--out-of-order-window", "10m"]).start()
    try:
        assert post_text(srv.url, f'st_ooo{{job="a"}} 1 {T * 1000}\nst_ooo{{job="a"}} 3 {(T + 60) * 1000}\n')[0] == 204
        assert post_text(srv.url, f'st_ooo{{job="a"}} 2 {(T + 30) * 1000}\n')[0] == 204  # inside the window
        assert post_text(srv.url, f'st_ooo{{job="a"}} 2 {(T + 30) * 1000}\n')[0] == 204  # retried: idempotent
        code, body = post_text(srv.url, f'st_ooo{{job="a"}} 9 {(T - 1200) * 1000}\n')  # 20 min older than newest
        assert code == 400 and "too old" in body
        code, body = post_text(srv.url, f'st_ooo{{job="a"}} 7 {(T + 60) * 1000}\n')
        assert code == 400 and "duplicate timestamp" in body
        with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert 'turboprom_storage_rejected_samples_total{reason="too_old"} 1.0' in metrics
        assert "turboprom_storage_wal_fsync_seconds_bucket" in metrics
        assert "turboprom_storage_head_series" in metrics
    finally:
        srv.kill()  # SIGKILL: no clean shutdown
        srv.stop()
    with ServerProcess(data) as srv2:
        res = query(srv2.url, 'st_ooo{job="a"}[5m]', T + 90)
        [series] = res["data"]["result"]
        assert [(int(float(t)), v) for t, v in series["values"]] == [(T, "1"), (T + 30, "2"), (T + 60, "3")]


def metric_value(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{}"):
                return float(line.rsplit(" ", 1)[1])
    return None


def test_partially_rejected_batch_still_reaches_the_ingest_sinks(tmp_path):
    """storage's per-sample accepted_mask lets the ingest pipeline hand the stored part of a
    partially rejected batch to its sinks (here the congestion tracker) instead of skipping it."""
    srv = ServerProcess(tmp_path / "data").start()
    try:
        now = int(time.time()) * 1000
        q = 'vllm:num_requests_waiting{cluster="c1",model_name="m1",instance="w9"}'
        assert post_text(srv.url, f'{q} 3 {now - 2000}\nst_other{{job="x"}} 1 {now - 1000}\n')[0] == 204
        # one batch: a duplicate of a stored sample, an out-of-order sample, a conflicting value,
        # and the one new sample the tracker must see
        body = (f'{q} 3 {now - 2000}\n'
                f'st_other{{job="x"}} 5 {now - 60_000}\n'
                f'st_other{{job="x"}} 2 {now - 1000}\n'
                f'{q} 7 {now}\n')
        code, text = post_text(srv.url, body)
        assert code == 400 and "partial import: 1 samples written" in text, text
        deadline = time.time() + 15
        inst = None
        while time.time() < deadline:
            with urllib.request.urlopen(srv.url + "/api/v1/congestion?instance=w9", timeout=10) as r:
                data = json.loads(r.read())["data"]
            inst = next((d for d in data["instances"] if d["instance"] == "w9"), None)
            if inst is not None and inst["queue_length"] == 7.0:
                break
            time.sleep(0.1)
        assert inst is not None and inst["queue_length"] == 7.0, inst
        assert metric_value(srv.url, "turboprom_ingest_sink_skipped_batches_total") == 0.0
        # storage holds exactly what it reported: the new sample, not the rejected ones
        res = query(srv.url, 'st_other{job="x"}[5m]', now / 1000)
        [series] = res["data"]["result"]
        assert [(float(t), v) for t, v in series["values"]] == [((now - 1000) / 1000, "1")]
    finally:
        srv.stop()
