"""Cost report end to end: recurring queries over real HTTP land in the query log; the report (API and
CLI, every format) attributes executions, CPU, samples and serving path per pattern."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.helpers import REPO, ServerProcess


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def test_cost_report_api_and_cli(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as srv:
        now = int(time.time())
        lines = [f'http_requests_total{{code="{c}",pod="p{p}"}} {k * (p + 1) * 10} {(now - 3600 + k * 15) * 1000}'
                 for k in range(240) for p in range(5) for c in ("200", "500")]
        req = urllib.request.Request(srv.url + "/api/v1/import/prometheus", data=("\n".join(lines) + "\n").encode(), method="POST")
        urllib.request.urlopen(req, timeout=60).read()
        for rng in ("5m", "10m", "5m", "15m"):  # one pattern, different ranges: recognized as the same work
            q = urllib.parse.urlencode({"query": f'sum by (code) (rate(http_requests_total[{rng}]))', "start": now - 1800, "end": now, "step": 30})
            assert json.loads(_get(srv.url + "/api/v1/query_range?" + q))["status"] == "success"
        q = urllib.parse.urlencode({"query": "count(http_requests_total)", "time": now})
        _get(srv.url + "/api/v1/query?" + q)
        time.sleep(1.5)  # query log flushes in the background
        rep = json.loads(_get(srv.url + "/api/v1/cost_report?since=1h"))["data"]
        pats = {p["pattern"]: p for p in rep["patterns"]}
        rate_pat = [p for k, p in pats.items() if "rate(http_requests_total" in k]
        assert len(rate_pat) == 1, list(pats)
        p = rate_pat[0]
        assert p["executions"] == 4 and p["samples_scanned"] > 0 and p["cpu_s_total"] > 0
        assert p["p99_latency_s"] >= p["p50_latency_s"] > 0
        assert rep["totals"]["executions"] >= 5
        assert any(m["name"] == "http_requests_total" for m in rep["storage"]["seriesCountByMetricName"])
        for fmt, marker in (("text", "TurboProm cost report"), ("csv", "pattern"), ("html", "<svg")):
            body = _get(srv.url + f"/api/v1/cost_report?since=1h&format={fmt}").decode()
            assert marker in body
        rows = list(csv.DictReader(io.StringIO(_get(srv.url + "/api/v1/cost_report?since=1h&format=csv").decode())))
        assert any(r["executions"] == "4" for r in rows)
        bad = urllib.request.Request(srv.url + "/api/v1/cost_report?format=pdf")
        try:
            urllib.request.urlopen(bad, timeout=10)
            raise AssertionError("bad format accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 400 and b"format" in e.read()
        out = tmp_path / "report.html"
        r = subprocess.run([sys.executable, "-m", "turboprom", "cost-report", "--url", srv.url, "--since", "1h", "--format", "html",
                            "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "<h1>TurboProm cost report</h1>" in out.read_text()


def test_savings_are_measured_per_way_of_serving(tmp_path: Path) -> None:
    """Answers a summary gave are credited with the canary's shadow pairs (raw and summary timed on the
    same sub-query at the same moment); refreshes that reused step answers are compared with the
    pattern's raw executions, and counted only once there is one."""
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text("planner:\n  min_count: 2\n  period: 10m\n  pane: 1m\n  seal_delay: 0s\n  history: 1d\n"
                   "  canary_fraction: 1.0\n  cost_based: false\n"
                   "  pinned:\n  - {metric: http_requests_total, algorithm: exact, pane: 1m, history: 1d}\n")
    now = (int(time.time()) // 60) * 60
    with ServerProcess(tmp_path / "data", ["--config", str(cfg), "--wal-fsync", "never"]) as srv:
        lines = [f'http_requests_total{{code="{c}",pod="p{p}"}} {k * (p + 1) * 10} {(now - 7200 + k * 15) * 1000}'
                 for k in range(480) for p in range(8) for c in ("200", "500")]
        req = urllib.request.Request(srv.url + "/api/v1/import/prometheus", data=("\n".join(lines) + "\n").encode(), method="POST")
        urllib.request.urlopen(req, timeout=60).read()
        deadline = time.time() + 60
        while time.time() < deadline:
            plans = json.loads(_get(srv.url + "/api/v1/planner/plans"))["data"]["plans"]
            if plans and plans[0]["backfill"]["state"] == "done":
                break
            time.sleep(0.3)
        q = urllib.parse.urlencode({"query": "sum by (code) (increase(http_requests_total[30m]))",
                                    "start": now - 5400, "end": now - 60, "step": 60, "stats": "all"})
        served = 0
        for _ in range(6):
            body = json.loads(_get(srv.url + "/api/v1/query_range?" + q))
            served += any(p.startswith("summary:") for p in body["data"]["stats"]["turboprom"]["paths"])
        assert served, "the pinned exact summary never answered"
        deadline = time.time() + 30
        while time.time() < deadline:  # shadow runs finish on the canary's own thread
            checks = json.loads(_get(srv.url + "/api/v1/planner/canary"))["data"]["checks"]
            if len(checks) >= served:
                break
            time.sleep(0.3)
        time.sleep(1.5)  # query log flushes in the background
        rep = json.loads(_get(srv.url + "/api/v1/cost_report?since=1h"))["data"]
        pat = [p for p in rep["patterns"] if "increase(http_requests_total" in p["pattern"]]
        assert len(pat) == 1, [p["pattern"] for p in rep["patterns"]]
        p = pat[0]
        pairs = [c["raw_cpu_s"] - c["served_cpu_s"] for c in checks if c["sds"] in p["sds"]]
        n_summary = p["summary_executions"] - p["reuse_executions"]
        assert pairs and n_summary >= 1, p
        # the refreshes that reused steps have no raw execution of the pattern to be compared with
        assert f"{n_summary} summary answers vs {len(pairs)} paired shadow runs" in p["savings_basis"], p
        if p["reuse_executions"]:
            assert "reusing refreshes: no raw execution to compare with" in p["savings_basis"], p
        expect = sum(pairs) / len(pairs) * n_summary
        assert abs(p["measured_savings_cpu_s"] - expect) <= 1e-9 + 1e-9 * abs(expect), (p, expect)
        # an exact=true run of the pattern is a raw execution: the reusing refreshes are now compared with it
        json.loads(_get(srv.url + "/api/v1/query_range?" + q + "&exact=true"))
        time.sleep(1.5)
        p = [x for x in json.loads(_get(srv.url + "/api/v1/cost_report?since=1h"))["data"]["patterns"]
             if "increase(http_requests_total" in x["pattern"]][0]
        assert f"{p['reuse_executions']} reusing refreshes vs raw executions" in p["savings_basis"], p
        expect = ((p["mean_cpu_raw_s"] - p["mean_cpu_reuse_s"]) * p["reuse_executions"]
                  + sum(pairs) / len(pairs) * (p["summary_executions"] - p["reuse_executions"]))
        assert abs(p["measured_savings_cpu_s"] - expect) <= 1e-9 + 1e-9 * abs(expect), (p, expect)


def test_html_bars_of_negative_savings_have_their_size_not_a_negative_width() -> None:
    import re

    from turboprom.cost_report import _bar_svg

    svg = _bar_svg([("exact-a", 2.0, -1.5), ("exact-b", 1.0, 0.5)], "savings", "spent", "saved")
    widths = [float(w) for w in re.findall(r'<rect x="\d+" y="\d+" width="(-?[\d.]+)" height="10"', svg)]
    assert len(widths) == 4 and min(widths) >= 0
    assert abs(widths[1] / widths[0] - 0.75) < 0.01  # |-1.5| against 2.0
    assert "<title>-1.5</title>" in svg
