"""`promtool query instant|range|series|labels` (Prometheus 2.42's own client, client_golang)
against TurboProm, with the same commands against a real Prometheus holding the same data as
the reference: the printed output must be identical (json output compared structurally)."""
from __future__ import annotations

import json
import math
import subprocess

import pytest

from tests.helpers import require_binary
from tests.test_api_helpers import T0_MS, PeerPair

pytestmark = pytest.mark.peer

T = str((T0_MS + 900_500) / 1000)
START = str((T0_MS + 60_250) / 1000)
END = str((T0_MS + 1_500_250) / 1000)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with PeerPair(tmp_path_factory.mktemp("promtool")) as p:
        yield p


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = require_binary("promtool")
    return subprocess.run([binary, "query", *args], capture_output=True, text=True, timeout=60)


def run_both(pair: PeerPair, build) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    return promtool(*build(pair.prom.url)), promtool(*build(pair.tp.url))


def same_json(a: str, b: str) -> bool:
    def norm(x):
        if isinstance(x, list):
            items = [norm(i) for i in x]
            return sorted(items, key=lambda i: json.dumps(i, sort_keys=True)) if all(isinstance(i, dict) for i in items) else items
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items()}
        return x

    def close(x, y):
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(close(x[k], y[k]) for k in x)
        if isinstance(x, list) and isinstance(y, list):
            return len(x) == len(y) and all(close(i, j) for i, j in zip(x, y))
        if isinstance(x, str) and isinstance(y, str) and x != y:
            try:
                return math.isclose(float(x), float(y), rel_tol=1e-9)
            except ValueError:
                return False
        return x == y

    return close(norm(json.loads(a)), norm(json.loads(b)))


@pytest.mark.parametrize("expr", [
    "http_requests_total",
    'sum by (job) (rate(http_requests_total{code="200"}[5m]))',
    "temperature_celsius",
    "temperature_celsius[2m]",
    "scalar(sum(sparse_gauge))",
    "42",
])
@pytest.mark.parametrize("fmt", ["promql", "json"])
def test_promtool_query_instant(pair, expr, fmt):
    ref, ours = run_both(pair, lambda url: ["instant", "-o", fmt, f"--time={T}", url, expr])
    assert ref.returncode == 0, ref.stderr
    assert ours.returncode == 0, ours.stderr
    if fmt == "json":
        assert same_json(ref.stdout, ours.stdout), (ref.stdout, ours.stdout)
    else:
        assert sorted(ours.stdout.splitlines()) == sorted(ref.stdout.splitlines())


@pytest.mark.parametrize("expr", ["http_requests_total", "rate(http_requests_total[1m])", "sparse_gauge", "1"])
def test_promtool_query_range(pair, expr):
    ref, ours = run_both(pair, lambda url: ["range", f"--start={START}", f"--end={END}", "--step=45s", url, expr])
    assert ref.returncode == 0, ref.stderr
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == ref.stdout


def test_promtool_query_range_json(pair):
    ref, ours = run_both(pair, lambda url: ["range", "-o", "json", f"--start={START}", f"--end={END}", "--step=1m", url,
                                            "sum(rate(http_requests_total[5m]))"])
    assert ref.returncode == 0 and ours.returncode == 0, (ref.stderr, ours.stderr)
    assert same_json(ref.stdout, ours.stdout)


@pytest.mark.parametrize("matches", [["http_requests_total"], ["temperature_celsius", 'sparse_gauge{kind="x"}'], ['{job="web"}']])
def test_promtool_query_series(pair, matches):
    ref, ours = run_both(pair, lambda url: ["series", *[f"--match={m}" for m in matches], f"--start={START}", f"--end={END}", url])
    assert ref.returncode == 0, ref.stderr
    assert ours.returncode == 0, ours.stderr
    assert sorted(ours.stdout.splitlines()) == sorted(ref.stdout.splitlines())
    assert ours.stdout.strip()


@pytest.mark.parametrize("name,extra", [("__name__", []), ("job", []), ("code", ["--match=http_requests_total{job=\"web\"}"]),
                                        ("room", []), ("site", ["--match=temperature_celsius"])])
def test_promtool_query_labels(pair, name, extra):
    ref, ours = run_both(pair, lambda url: ["labels", *extra, f"--start={START}", f"--end={END}", url, name])
    assert ref.returncode == 0, ref.stderr
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == ref.stdout
    assert ours.stdout.strip()


def test_promtool_default_time_range(pair):
    # Without --start/--end promtool asks for the recent past only: our 2023 data is outside it.
    for args in (["series", "--match=http_requests_total"], ["labels"]):
        ref, ours = run_both(pair, lambda url: [*args, url] + (["job"] if args == ["labels"] else []))
        assert ref.returncode == ours.returncode == 0, (ref.stderr, ours.stderr)
        assert ours.stdout == ref.stdout


def test_promtool_reports_our_errors_like_prometheus(pair):
    ref, ours = run_both(pair, lambda url: ["instant", url, "sum("])
    assert ref.returncode != 0 and ours.returncode != 0
    assert "bad_data" in ours.stderr and "bad_data" in ref.stderr
