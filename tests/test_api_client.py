"""prometheus-api-client (PyPI) ``PrometheusConnect`` against TurboProm: every call works
unchanged and returns what the same call returns from a real Prometheus 2.42 with the same data."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

from tests.test_api_helpers import T0_MS, PeerPair

pytestmark = pytest.mark.peer

T = (T0_MS + 900_500) / 1000
START = datetime.fromtimestamp((T0_MS + 60_250) / 1000, tz=timezone.utc)
END = datetime.fromtimestamp((T0_MS + 1_500_250) / 1000, tz=timezone.utc)


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    with PeerPair(tmp_path_factory.mktemp("api-client")) as p:
        yield PrometheusConnect(url=p.prom.url, disable_ssl=True), PrometheusConnect(url=p.tp.url, disable_ssl=True)


def _key(item: dict) -> str:
    return repr(sorted(item.get("metric", item).items()))


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False
        if a and all(isinstance(x, dict) for x in a):
            a, b = sorted(a, key=_key), sorted(b, key=_key)
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str) and a != b:
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except ValueError:
            return False
    return a == b


def test_connection_check(clients):
    ref, ours = clients
    assert ref.check_prometheus_connection()
    assert ours.check_prometheus_connection()


@pytest.mark.parametrize("q", ["http_requests_total", "sum by (code) (rate(http_requests_total[5m]))", "temperature_celsius", "vector(3)", "7"])
def test_custom_query(clients, q):
    ref, ours = clients
    assert _same(ours.custom_query(q, params={"time": T}), ref.custom_query(q, params={"time": T}))


@pytest.mark.parametrize("q", ["http_requests_total{job='web'}", "avg(temperature_celsius)", "sparse_gauge"])
def test_custom_query_range(clients, q):
    ref, ours = clients
    a = ref.custom_query_range(q, start_time=START, end_time=END, step="30")
    b = ours.custom_query_range(q, start_time=START, end_time=END, step="30")
    assert a and _same(b, a)


def test_metric_helpers(clients):
    ref, ours = clients
    assert ours.all_metrics(params={"start": START.timestamp(), "end": END.timestamp()}) == \
        ref.all_metrics(params={"start": START.timestamp(), "end": END.timestamp()})
    assert ours.get_label_names(params={"start": START.timestamp(), "end": END.timestamp()}) == \
        ref.get_label_names(params={"start": START.timestamp(), "end": END.timestamp()})
    assert ours.get_label_values("job", params={"start": START.timestamp(), "end": END.timestamp()}) == ["api", "web"]
    assert _same(ours.get_series(START, END, params={"match[]": "temperature_celsius"}),
                 ref.get_series(START, END, params={"match[]": "temperature_celsius"}))
    a = ref.get_current_metric_value("http_requests_total", {"code": "500"}, params={"time": T})
    b = ours.get_current_metric_value("http_requests_total", {"code": "500"}, params={"time": T})
    assert len(b) == 3 and _same(b, a)


def test_metric_range_data(clients):
    ref, ours = clients
    # The client rounds to whole seconds and asks for metric[<end-start>s] at end: keep the window
    # edge off sample timestamps (2.42 includes a sample exactly at the edge, 3.x does not).
    start = datetime.fromtimestamp(T0_MS / 1000 + 67, tz=timezone.utc)
    end = datetime.fromtimestamp(T0_MS / 1000 + 1507, tz=timezone.utc)
    a = ref.get_metric_range_data("temperature_celsius", start_time=start, end_time=end)
    b = ours.get_metric_range_data("temperature_celsius", start_time=start, end_time=end)
    assert a and _same(b, a)
    assert {s["metric"]["room"] for s in b} == {"<lab & co>", "office"}


def test_metric_aggregation(clients):
    ref, ours = clients
    ops = ["sum", "max", "min", "average", "percentile_50", "deviation"]
    a = ref.get_metric_aggregation("temperature_celsius", ops, start_time=START, end_time=END, step="60")
    b = ours.get_metric_aggregation("temperature_celsius", ops, start_time=START, end_time=END, step="60")
    assert a.keys() == b.keys()
    for k in a:
        assert math.isclose(a[k], b[k], rel_tol=1e-9), k


def test_metadata_and_targets(clients):
    _, ours = clients
    md = ours.get_metric_metadata("http_requests_total")
    assert md == [{"metric_name": "http_requests_total", "type": "counter", "help": "Requests served.", "unit": ""}]
    assert ours.get_targets() == {"activeTargets": [], "droppedTargets": []}
    assert ours.get_scrape_pools() == []


def test_errors_raise_client_exception(clients):
    _, ours = clients
    with pytest.raises(PrometheusApiClientException) as e:
        ours.custom_query("sum(")
    assert "400" in str(e.value) and "bad_data" in str(e.value)
