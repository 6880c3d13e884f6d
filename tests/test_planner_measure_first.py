"""Measured first (``planner.measure_first``, the default): a shape of use of an adopted plan is answered
raw until its summary path, run beside the raw answer on the canary's worker, has been measured faster
than raw. No reader waits for a summary answer that has not been measured, and the summary still
reaches every shape where it pays. In process and over real HTTP."""
from __future__ import annotations

import time

import numpy as np

from planner.rewrite_rules import WHY_MEASURING, WHY_SLOWER
from planner.sds import SDSSpec, shape_of
from planner.stack import build
from promql.engine import Engine, QueryOpts
from tests.test_planner_fixtures import SMALL_DATA_PRIOR_S, feed, load, random_series

Q = "sum by (job) (rate(x_total[2h]))"


def _settle(st) -> None:
    deadline = time.time() + 30
    while st.canary.in_flight() and time.time() < deadline:
        time.sleep(0.01)


def _served(res) -> bool:
    return any(p.startswith("summary:") for p in res.stats.paths)


def test_new_shapes_are_answered_raw_until_measured_faster():
    src, batch = load(random_series(seed=31, n_series=8))
    tmax = int(batch.timestamps.max())
    st = build(src, Engine(src), None, {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0,
                                        "min_count": 1000, "step_cache_bytes": 0})
    assert st.config.measure_first and st.hook.rctx.measure_first
    feed(st.summarizer, batch)
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 300_000), reason="test")
    end = tmax // 300_000 * 300_000  # windows on pane bounds, as Grafana aligns a 5m step
    start, step = end - 3 * 3_600_000, 300_000
    shape = shape_of("rate", 2 * 3_600_000, len(range(start, end + 1, step)))
    (item,) = st.planner.explain(Q, start, end, step)["subtrees"]
    assert item["path"] == "raw" and item["why"] == WHY_MEASURING  # explain says what the hook will do

    exact = st.engine.range_query(Q, start, end, step, QueryOpts(exact=True))
    for k in range(sds.stats.SHAPE_MIN_RUNS):
        if sds.stats.verdict(shape) is not None:
            break  # every run so far decisive (SDSStats.SHAPE_DECISIVE): measured enough to decide
        res = st.engine.range_query(Q, start, end, step)
        assert not _served(res), res.stats.paths  # the reader got the raw answer ...
        np.testing.assert_array_equal(res.values, exact.values)
        _settle(st)
        runs = list(sds.stats.shapes[shape])  # ... and the summary path was run and timed beside it
        assert len(runs) == k + 1 and all(r[1] > 0 and r[2] > 0 and r[3] > 0 and r[4] > 0 for r in runs)
    n = len(sds.stats.shapes[shape])
    assert sds.stats.hits == 0 and len(sds.stats.shadow) == n >= 1
    checks = st.canary.records()  # the measuring runs are checked like shadow runs: exact here
    assert len(checks) == n and all(c["max_error"] <= 1e-9 for c in checks)

    verdict = sds.stats.verdict(shape)
    assert verdict in ("faster", "slower")
    (item,) = st.planner.explain(Q, start, end, step)["subtrees"]
    res = st.engine.range_query(Q, start, end, step)
    assert _served(res) == (verdict == "faster") == item["path"].startswith("summary:")
    if verdict == "slower":
        assert item["why"] == WHY_SLOWER
    np.testing.assert_allclose(res.values, exact.values, rtol=1e-9)
    _settle(st)

    # measured faster: served; once those runs age out it keeps being served while measured again
    sds.stats.shapes.clear()
    for _ in range(sds.stats.SHAPE_MIN_RUNS):
        sds.stats.record(shape, 0.001, 0.001, 0.050, 0.050)
    assert _served(st.engine.range_query(Q, start, end, step))
    sds.stats.SHAPE_TTL_S = 0.0  # every run is old now
    assert sds.stats.needs_probe(shape) and not sds.stats.measuring(shape)
    assert _served(st.engine.range_query(Q, start, end, step))
    _settle(st)
    # last measured slower: once those runs age out, raw again while it is measured again
    sds.stats.SHAPE_TTL_S = 900.0
    sds.stats.shapes.clear()
    for _ in range(sds.stats.SHAPE_MIN_RUNS):
        sds.stats.record(shape, 0.050, 0.050, 0.001, 0.001)
    assert sds.stats.known[shape] == "slower"
    sds.stats.SHAPE_TTL_S = 0.0
    assert sds.stats.measuring(shape)
    before = sum(len(d) for d in sds.stats.shapes.values())
    assert not _served(st.engine.range_query(Q, start, end, step))
    _settle(st)
    assert sum(len(d) for d in sds.stats.shapes.values()) == before + 1  # measured beside the raw answer


def test_measuring_runs_of_one_shape_do_not_pile_up():
    """One measuring run per (plan, shape) in flight: loads that find theirs still running are raw and
    unmeasured, so a burst of loads of a new shape queues one summary run, not one per load."""
    import threading

    src, batch = load(random_series(seed=32))
    tmax = int(batch.timestamps.max())
    st = build(src, Engine(src), None, {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0,
                                        "min_count": 1000, "step_cache_bytes": 0})
    feed(st.summarizer, batch)
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 300_000), reason="test")
    gate = threading.Event()
    st.canary.pool.submit(gate.wait, 30)  # the canary's one worker is busy
    end = tmax // 300_000 * 300_000
    (item,) = st.planner.explain(Q, end - 3 * 3_600_000, end, 300_000)["subtrees"]
    assert item["why"] == WHY_MEASURING
    for _ in range(5):
        assert not _served(st.engine.range_query(Q, end - 3 * 3_600_000, end, 300_000))
    assert st.canary.in_flight() == 1
    gate.set()
    _settle(st)
    assert len(sds.stats.shadow) == 1


def test_over_http_with_default_settings(tmp_path):
    """A real server with the default planner settings: after adoption, a panel panned to new ranges
    (no step answer to reuse) is answered raw, equal to exact=true, while explain says it is being
    measured; the canary lists the measuring runs; then the path follows their verdict."""
    from tests.helpers import ServerProcess
    from tests.test_planner_http import _get, _ingest_history, _matrix, _same

    cfg = tmp_path / "tp.yml"
    cfg.write_text(f"planner:\n  min_count: 3\n  seal_delay: 0s\n  summary_cost_prior: {SMALL_DATA_PRIOR_S}\n")  # the rest: defaults (measure_first on)
    srv = ServerProcess(tmp_path / "data", ["--config", str(cfg), "--wal-fsync", "never"])
    srv.start()
    try:
        now = int(time.time() * 1000) // 60_000 * 60_000
        _ingest_history(srv.url, now - 60_000, hours=3.0)
        q = "sum by (job) (rate(req_total[1h]))"
        end = (now - 120_000) // 1000 // 600 * 600
        for k in range(3):  # recurrences: adoption
            _get(srv.url, "/api/v1/query_range", query=q, start=end - 3600 - k * 600, end=end - k * 600, step=600)
        deadline = time.time() + 60
        plans: list = []
        while time.time() < deadline:
            plans = _get(srv.url, "/api/v1/planner/plans")["data"]["plans"]
            if plans and all(p["backfill"]["state"] == "done" and p["coverage"]["panes"] > 0 for p in plans):
                break
            time.sleep(0.3)
        assert plans and plans[0]["algorithm"] == "exact"
        runs = 0
        for k in range(1, 40):  # panned by a few seconds each time: a new grid, nothing to reuse
            e = end - k * 7
            params = dict(query=q, start=e - 3600, end=e, step=600)
            ex = _get(srv.url, "/api/v1/planner/explain", **params)["data"]["subtrees"][0]
            got = _get(srv.url, "/api/v1/query_range", **params)
            exact = _get(srv.url, "/api/v1/query_range", **params, exact="true")
            _same(_matrix(got), _matrix(exact))
            served = any("served from summary" in i for i in got.get("infos", []))
            assert served == ex["path"].startswith("summary:"), (ex, got.get("infos"))
            if ex.get("why", "").startswith("measuring"):
                runs += 1
                time.sleep(0.2)  # the measuring run beside it
            elif runs:
                break
        assert runs >= 3 and not ex.get("why", "").startswith("measuring"), ex
        checks = _get(srv.url, "/api/v1/planner/canary")["data"]["checks"]
        assert len(checks) >= 3 and all(c["max_error"] <= 1e-9 for c in checks), checks
    finally:
        srv.stop()


def test_background_runs_wait_for_the_readers_query():
    """Shadow and measuring runs wait while a query a reader waits for is in flight (and ``QUIET_S``
    after it, for its answer's encoding), so they do not take turns with it on the interpreter's lock;
    never longer than ``MAX_WAIT_S``. The planned engine enters and leaves around each query."""
    import threading

    from planner.canary import Foreground

    fg = Foreground()
    fg.QUIET_S = 0.01
    started = threading.Event()
    fg.enter()
    t = threading.Thread(target=lambda: (fg.wait_quiet(), started.set()))
    t.start()
    assert not started.wait(0.3)  # the query is in flight: the run waits
    fg.leave()
    assert started.wait(10)
    t.join()

    busy = Foreground()
    busy.MAX_WAIT_S = 0.05
    busy.enter()  # a query that never ends: the run goes after MAX_WAIT_S
    done = threading.Event()
    threading.Thread(target=lambda: (busy.wait_quiet(), done.set())).start()
    assert done.wait(10)

    src, batch = load(random_series(seed=33))
    st = build(src, Engine(src), None, {"background_backfill": False, "seal_delay": "0s"})
    assert st.engine.foreground is st.canary.foreground
    seen = []
    orig = st.engine.engine.range_query
    st.engine.engine.range_query = lambda *a, **k: (seen.append(st.canary.foreground._n), orig(*a, **k))[1]
    tmax = int(batch.timestamps.max())
    st.engine.range_query(Q, tmax - 3_600_000, tmax, 300_000)
    assert seen == [1] and st.canary.foreground._n == 0


def test_a_query_of_a_shape_whose_measuring_run_is_in_flight_is_plain_raw(monkeypatch):
    """One measuring run per (plan, shape) at a time: a query of that shape arriving meanwhile cannot be
    paired with one, so it is answered by the plain raw path, decided before the windows are planned,
    with no raw evaluation of the hook's own (a client repeating the query back to back paid both on
    every query). Once the run is done, the next query is measured again."""
    import threading

    from planner.canary import Canary

    src, batch = load(random_series(seed=31, n_series=8))
    tmax = int(batch.timestamps.max())
    st = build(src, Engine(src), None, {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0,
                                        "min_count": 1000, "step_cache_bytes": 0})
    feed(st.summarizer, batch)
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 300_000), reason="test")
    end = tmax // 300_000 * 300_000
    start, step = end - 3 * 3_600_000, 300_000
    shape = shape_of("rate", 2 * 3_600_000, len(range(start, end + 1, step)))
    release = threading.Event()
    real_quietly = Canary._quietly

    def held(self, fn, *args):  # the measuring run waits until the test lets it go
        release.wait(30)
        return real_quietly(self, fn, *args)

    monkeypatch.setattr(Canary, "_quietly", held)
    own_raw = []
    real_measure = type(st.hook)._measure
    monkeypatch.setattr(type(st.hook), "_measure", lambda self, *a: own_raw.append(1) or real_measure(self, *a))
    exact = st.engine.range_query(Q, start, end, step, QueryOpts(exact=True))
    first = st.engine.range_query(Q, start, end, step)  # measured: the hook's timed raw answer, a run queued
    assert own_raw == [1] and st.canary.in_flight() == 1
    for _ in range(3):
        res = st.engine.range_query(Q, start, end, step)
        assert not _served(res) and res.stats.paths == ["raw"]
        np.testing.assert_array_equal(res.values, exact.values)
    assert own_raw == [1]  # no raw evaluation of the hook's own while the run was in flight
    (item,) = st.planner.explain(Q, start, end, step)["subtrees"]
    assert item["path"] == "raw" and item["why"] == WHY_MEASURING
    np.testing.assert_array_equal(first.values, exact.values)
    release.set()
    _settle(st)
    st.engine.range_query(Q, start, end, step)
    if sds.stats.measuring(shape):  # (unless that one run was decisive: SDSStats.SHAPE_DECISIVE)
        assert own_raw == [1, 1]  # the run done: the next query is measured again
    _settle(st)
    st.planner.stop()
