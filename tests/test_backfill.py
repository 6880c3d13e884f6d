"""Backfill that never drops silently, through the real CLI and server: `turboprom import` of a
30-day OpenMetrics file into a stopped server's data dir (aligned blocks, then /api/v1/query_range
gives the file's values), CSV through a running server, refusals (beyond retention, bad lines) as one
line naming file:line with nothing written, old writes refused with the window that applies (remote
write, text import, OTLP), and `turboprom sql` seeing fresh head samples."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from storage.batch import SampleBatch
from storage.labels import make_labels
from storage.options import DAY_MS, HOUR_MS, StorageOptions
from storage.tsdb import TSDB
from tests.helpers import REPO, ServerProcess, http_json
from tests.test_ingest_support import error_of, post, remote_write, v1_payload
from turboprom.rejections import storage_problem

STEP_S = 600  # one sample per 10 minutes
SERIES = 24


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turboprom", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def one_line_failure(r: subprocess.CompletedProcess, *expected: str) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines and "Traceback" not in r.stderr, r.stderr
    last = lines[-1]  # progress lines may precede it
    assert last.startswith("turboprom: "), r.stderr
    for e in expected:
        assert e in last, (e, last)
    return last


def history(days: float, end_s: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample times (s, aligned to STEP_S) over ``days`` before ``end_s``, and values per series (rows)."""
    end = end_s // STEP_S * STEP_S
    ts = np.arange(end - int(days * 86400), end, STEP_S, dtype=np.int64)
    rng = np.random.default_rng(7)
    vals = np.cumsum(rng.integers(0, 50, size=(SERIES, len(ts))), axis=1).astype(np.float64) / 4
    return ts, vals


def write_openmetrics(path: Path, ts: np.ndarray, vals: np.ndarray) -> None:
    with open(path, "w") as f:
        f.write("# HELP jobs_done_total Jobs done.\n# TYPE jobs_done_total counter\n")
        for i in range(vals.shape[0]):
            f.writelines(f'jobs_done_total{{worker="w{i}",pool="p{i % 3}"}} {v!r} {t}\n' for t, v in zip(ts.tolist(), vals[i].tolist()))
        f.write("# EOF\n")


def query_range(url: str, q: str, start: int, end: int, step: int) -> list[dict]:
    qs = urllib.parse.urlencode({"query": q, "start": start, "end": end, "step": step})
    code, body, _ = http_json(f"{url}/api/v1/query_range?{qs}")
    assert code == 200 and body["status"] == "success", body
    return body["data"]["result"]


def test_thirty_day_openmetrics_backfill_then_queried(tmp_path):
    now_s = int(time.time())
    ts, vals = history(30, now_s - 4 * 3600)
    om = tmp_path / "history.om"
    write_openmetrics(om, ts, vals)
    data = tmp_path / "data"

    # the default retention (15d) refuses a 30-day file whole, naming the window and the flag
    r = run_cli("import", str(om), "--data-dir", str(data))
    msg = one_line_failure(r, "history.om:3:", 'jobs_done_total{pool="p0", worker="w0"}', "older than the retention window",
                           "--retention-time 15d", "nothing was imported")
    assert "samples like it" in msg
    assert not any((data / "blocks").glob("*")) if (data / "blocks").exists() else True

    r = run_cli("import", str(om), "--data-dir", str(data), "--retention-time", "40d")
    assert r.returncode == 0, r.stderr
    assert f"imported {SERIES * len(ts):,} samples of {SERIES} series" in r.stdout, r.stdout
    assert "reading history.om" in r.stderr and "writing blocks" in r.stderr, r.stderr  # the progress line
    metas = [json.loads((p / "meta.json").read_text()) for p in (data / "blocks").iterdir()]
    # properly sized: aligned ranges of the largest compaction level (54h with 40d retention), not per sample or per 2h
    rng_ms = 54 * HOUR_MS
    assert 13 <= len(metas) <= 15, len(metas)
    assert sum(m["numSamples"] for m in metas) == SERIES * len(ts)
    assert all(m["minTime"] // rng_ms == m["maxTime"] // rng_ms for m in metas)

    with ServerProcess(data, ["--retention-time", "40d", "--web.enable-admin-api"]) as srv:
        # every value of the file, at hourly steps that fall on its samples
        start, end = int(ts[0]), int(ts[-1])
        got = query_range(srv.url, "jobs_done_total", start, end, 3600)
        assert len(got) == SERIES
        steps = np.arange(start, end + 1, 3600)
        idx = np.searchsorted(ts, steps)
        for s in got:
            i = int(s["metric"]["worker"][1:])
            assert [int(float(p[0])) for p in s["values"]] == steps.tolist()
            assert [float(p[1]) for p in s["values"]] == vals[i, idx].tolist()
        # range functions over the history see exactly the file's samples: (t - 1d, t]
        at = start + 86400
        sel = (ts > at - 86400) & (ts <= at)
        for fn, want in (("count_over_time", float(sel.sum())), ("sum_over_time", float(vals[3, sel].sum()))):
            got = query_range(srv.url, f'{fn}(jobs_done_total{{worker="w3"}}[1d])', at, at, 60)
            assert got and float(got[0]["values"][0][1]) == want, (fn, got, want)

        # a stopped server's data dir only: a running one is refused, pointing at --url
        r = run_cli("import", str(om), "--data-dir", str(data), "--retention-time", "40d")
        one_line_failure(r, "is in use by another TurboProm process", "--url")

        # the same file again through the server: nothing new, nothing refused
        r = run_cli("import", str(om), "--url", srv.url)
        assert r.returncode == 0 and f"{SERIES * len(ts):,} already stored" in r.stdout, (r.stdout, r.stderr)

        # CSV through the running server: RFC 3339 and Unix-second timestamps, label columns, an absent label
        t0 = (now_s - 3 * 86400) // 60 * 60
        csv = tmp_path / "gpu.csv"
        rows = ["__name__,gpu,host,timestamp,value"]
        for k in range(6):
            t = t0 + 60 * k
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if k % 2 else str(t)
            rows.append(f"gpu_util,0,h1,{stamp},{k * 0.5}")
            rows.append(f"gpu_util,,h2,{stamp},{k}")
        csv.write_text("\n".join(rows) + "\n")
        r = run_cli("import", str(csv), "--url", srv.url)
        assert r.returncode == 0 and "imported 12 samples of 2 series" in r.stdout, (r.stdout, r.stderr)
        got = {tuple(sorted(s["metric"].items())): [(int(float(a)), float(b)) for a, b in s["values"]]
               for s in query_range(srv.url, "gpu_util", t0, t0 + 300, 60)}
        assert got == {
            (("__name__", "gpu_util"), ("gpu", "0"), ("host", "h1")): [(t0 + 60 * k, k * 0.5) for k in range(6)],
            (("__name__", "gpu_util"), ("host", "h2")): [(t0 + 60 * k, float(k)) for k in range(6)],
        }

        # SQL sees fresh head samples, with times shown as times; the README example returns rows
        fresh = int(time.time() * 1000)
        code, _, body = post(srv.url, "/api/v1/import/prometheus", f'fresh_gauge{{k="a"}} 1.5 {fresh}\nfresh_gauge{{k="b"}} 2 {fresh}\n'.encode())
        assert code == 204, body
        r = run_cli("sql", "--data-dir", str(data), "SELECT metric, labels, value, timestamp, timestamp_ms FROM labeled_samples "
                                                   "WHERE block_id = 'head' AND metric = 'fresh_gauge' ORDER BY labels")
        assert r.returncode == 0, r.stderr
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(fresh / 1000)) + f".{fresh % 1000:03d}Z"
        body_rows = [ln for ln in r.stdout.splitlines() if "fresh_gauge" in ln]
        assert len(body_rows) == 2 and all(stamp in ln and str(fresh) in ln for ln in body_rows), r.stdout
        assert "(2 rows)" in r.stdout
        r = run_cli("sql", "--data-dir", str(data), "SELECT * FROM series LIMIT 5")
        assert r.returncode == 0 and "(5 rows)" in r.stdout, (r.stdout, r.stderr)
        r = run_cli("sql", "--data-dir", str(data), "SELECT num_series FROM blocks WHERE id = 'head'")
        assert r.returncode == 0 and r.stdout.splitlines()[2].strip() == "2", r.stdout


def in_process(capsys, *args: str, expected: list[str]) -> None:
    from turboprom.cli import main

    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    one_line_failure(subprocess.CompletedProcess(args, code, "", err), *expected)


def test_bad_files_refused_with_file_and_line(tmp_path, capsys):
    data = tmp_path / "data"
    now_s = int(time.time()) - 86400
    cases = {
        "value.om": (f"# TYPE a gauge\na 1 {now_s}\na{{x=\"1\"}} 2 {now_s}\na{{x=\"1\"}} zwei {now_s + 1}\n# EOF\n",
                     ["value.om:4:", "invalid value 'zwei'"]),
        "nots.prom": (f"a 1 {now_s * 1000}\nb 2\n", ["nots.prom:2:", "sample without a timestamp"]),
        "eof.om": (f"a 1 {now_s}\n# EOF\na 2 {now_s + 1}\n# EOF\n", ["eof.om:2:", "'# EOF' before the end of the file"]),
        "labels.prom": (f"a{{x=\"1\" 1 {now_s * 1000}\n", ["labels.prom:1:", "invalid sample line"]),
        "conflict.prom": (f"a 1 {now_s * 1000}\na 2 {now_s * 1000}\n", ["conflict.prom:2:", "two different values"]),
        "columns.csv": (f"__name__,job,timestamp,value\nup,a,{now_s},1\nup,a,{now_s + 60},1,9\n", ["columns.csv:3:", "expected 4 columns"]),
        "stamp.csv": (f"__name__,timestamp,value\nup,{now_s},1\nup,yesterday,1\n", ["stamp.csv:3:", "invalid timestamp 'yesterday'"]),
        "header.csv": (f"name,timestamp,value\nup,{now_s},1\n", ["header.csv:1:", "__name__ (or metric)"]),
        "number.csv": (f"metric,timestamp,value\nup,{now_s},1\nup,{now_s + 60},one\n", ["number.csv:3:", "invalid value 'one'"]),
        "future.csv": (f"metric,timestamp,value\nup,{now_s},1\nup,{now_s + 3 * 86400},1\n",
                       ["future.csv:3:", "ahead of the wall clock"]),
    }
    for name, (text, expected) in cases.items():  # the CLI's entry point in this process: no start-up per case
        f = tmp_path / name
        f.write_text(text)
        in_process(capsys, "import", str(f), "--data-dir", str(data), expected=expected)
    assert not any((data / "blocks").iterdir())  # nothing of any of them was written
    one_line_failure(run_cli("import", str(tmp_path / "missing.om"), "--data-dir", str(data)), "not found")


def test_old_writes_refused_naming_the_window(tmp_path):
    with ServerProcess(tmp_path / "data") as srv:  # default retention 15d, no out-of-order window
        now = int(time.time() * 1000)
        assert post(srv.url, "/api/v1/import/prometheus", f"live 1 {now}\n".encode())[0] == 204
        old = now - 20 * DAY_MS
        for attempt in range(2):  # a retry gets the same answer (never "duplicate timestamp" for lost data)
            code, _, body = post(srv.url, "/api/v1/import/prometheus", f'hist{{k="1"}} 1 {old}\n'.encode())
            msg = error_of(body)
            assert code == 400 and "beyond retention" in msg and "--retention-time 15d" in msg, msg
            assert "duplicate" not in msg
        code, _, body = remote_write(srv.url, v1_payload([({"__name__": "hist_rw"}, [(old, 1.0), (now - 1000, 2.0)])]))
        msg = error_of(body)
        assert code == 400 and "1 samples written" in msg and "beyond retention" in msg and "--retention-time" in msg, msg
        # OTLP answers 200 with partial_success naming the same window
        otlp = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "hist_otlp", "gauge": {"dataPoints": [
            {"asDouble": 1.0, "timeUnixNano": str(old * 1_000_000)}]}}]}]}]}
        code, _, body = post(srv.url, "/api/v1/otlp/v1/metrics", json.dumps(otlp).encode(), {"Content-Type": "application/json"})
        part = json.loads(body)["partialSuccess"]
        assert code == 200 and int(part["rejectedDataPoints"]) == 1 and "--retention-time" in part["errorMessage"], body
        # out of order: names the flag that is off and points at turboprom import
        code, _, body = remote_write(srv.url, v1_payload([({"__name__": "live"}, [(now - 2 * DAY_MS, 1.0)])]))
        msg = error_of(body)
        assert code == 400 and "out of order" in msg and "--out-of-order-window is 0" in msg and "turboprom import" in msg, msg
        qs = urllib.parse.urlencode({"query": "{__name__=~\"hist.*\"}[30d]", "time": now / 1000})
        code, res, _ = http_json(f"{srv.url}/api/v1/query?{qs}")
        assert code == 200 and [s["metric"]["__name__"] for s in res["data"]["result"]] == ["hist_rw"], res
        assert res["data"]["result"][0]["values"] == [[(now - 1000) / 1000, "2"]]  # only the recent sample was written


def test_too_old_names_the_out_of_order_window(tmp_path):
    now = int(time.time() * 1000)
    opts = StorageOptions(out_of_order_window_ms=HOUR_MS)
    lbl = make_labels({"__name__": "m"})
    with TSDB(str(tmp_path), opts, background=False) as db:
        assert db.append(SampleBatch.from_series([(lbl, [now], [1.0])])).accepted == 1
        res = db.append(SampleBatch.from_series([(lbl, [now - 3 * HOUR_MS, now - 30 * 60_000], [2.0, 3.0])]))
        assert res.accepted == 1 and res.rejected == {"too_old": 1}
        msg = storage_problem(res, 2)
        assert "outside the out-of-order window (--out-of-order-window 1h" in msg and "turboprom import" in msg, msg
        # samples retention would delete at once are refused before anything else
        res = db.append(SampleBatch.from_series([(lbl, [now - 16 * DAY_MS], [4.0])]))
        assert res.rejected == {"beyond_retention": 1}


@pytest.mark.parametrize("fmt", ["prometheus", "openmetrics"])
def test_text_timestamps_units(tmp_path, fmt):
    """Prometheus text carries milliseconds, OpenMetrics seconds: both land at the same instant."""
    t = (int(time.time()) - 86400) // 60 * 60
    f = tmp_path / ("h.om" if fmt == "openmetrics" else "h.prom")
    stamp = str(t) if fmt == "openmetrics" else str(t * 1000)
    f.write_text(f"u 1 {stamp}\n" + ("# EOF\n" if fmt == "openmetrics" else ""))
    from turboprom.cli import main

    assert main(["import", str(f), "--data-dir", str(tmp_path / "d")]) == 0
    with TSDB(str(tmp_path / "d"), background=False) as db:
        from storage.matchers import Matcher

        ss = db.select([Matcher("__name__", "=", "u")], 0, 2**62)
        assert ss.timestamps.tolist() == [t * 1000]


def test_sql_runs_again_when_a_block_is_replaced_while_it_reads(tmp_path, monkeypatch):
    """A running server may replace a block (compaction, retention) between the listing of the blocks'
    files and DuckDB reading them: ``turboprom sql`` runs the statement again on a fresh listing."""
    from storage import catalog

    ts, vals = history(3, int(time.time()) - 4 * 3600)
    om = tmp_path / "history.om"
    write_openmetrics(om, ts, vals)
    data = tmp_path / "data"
    r = run_cli("import", str(om), "--data-dir", str(data))
    assert r.returncode == 0, r.stderr
    block = next(p for p in (data / "blocks").iterdir() if (p / "data.parquet").exists())
    away = tmp_path / "away.parquet"
    real_open, opened = catalog.open_session, []

    def open_then_lose_a_block(data_dir, head=True):
        opened.append(1)
        if len(opened) > 1 and away.exists():  # the replacement block is in place for the next listing
            away.rename(block / "data.parquet")
        con = real_open(data_dir, head)
        if len(opened) == 1:  # the first listing still names the file; it is gone when read
            (block / "data.parquet").rename(away)
        return con

    monkeypatch.setattr(catalog, "open_session", open_then_lose_a_block)
    out = catalog.run_sql(str(data), "SELECT count(*) AS n FROM samples WHERE block_id <> 'head'")
    assert len(opened) == 2
    assert out.splitlines()[2].strip() == str(SERIES * len(ts)), out
