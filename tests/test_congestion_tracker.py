"""CongestionTracker driven directly with SampleBatches (the ingest sink contract), clock injected."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from scheduler_metrics.congestion import CongestionConfig, CongestionTracker
from scheduler_metrics.schema import CONGESTION_FAMILIES
from storage.batch import SampleBatch
from storage.labels import Labels, make_labels
from storage.stale import STALE_NAN, is_stale


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lbl(name: str, instance: str, cluster: str = "c1", model: str = "m", **extra: str) -> Labels:
    return make_labels({"__name__": name, "cluster": cluster, "model_name": model, "instance": instance, **extra})


class SimWorker:
    """Cumulative counters + gauges of one vLLM-like worker, emitted as samples at the clock's time."""

    def __init__(self, instance: str, capacity: float | None = 1000.0, cluster: str = "c1", model: str = "m") -> None:
        self.instance, self.capacity, self.cluster, self.model = instance, capacity, cluster, model
        self.computed = 0.0
        self.done = 0.0

    def step(self, t: float, dt: float, tps: float, req_per_s: float, backlog: float, waiting: float,
             kv: float = 0.5) -> list[tuple[Labels, list[int], list[float]]]:
        self.computed += tps * dt
        self.done += req_per_s * dt
        ts = [int(t * 1000)]
        c, m, i = self.cluster, self.model, self.instance
        out = [
            (lbl("vllm:num_requests_waiting", i, c, m), ts, [waiting]),
            (lbl("vllm:num_requests_running", i, c, m), ts, [4.0]),
            (lbl("vllm:kv_cache_usage_perc", i, c, m), ts, [kv]),
            (lbl("turboprom_worker_prefill_backlog_tokens", i, c, m), ts, [backlog]),
            (lbl("turboprom_worker_prefill_computed_tokens_total", i, c, m), ts, [self.computed]),
            (lbl("vllm:request_success_total", i, c, m, finished_reason="stop"), ts, [self.done]),
        ]
        if self.capacity is not None:
            out.append((lbl("turboprom_worker_prefill_capacity_tokens_per_second", i, c, m), ts, [self.capacity]))
        return out


def run(tr: CongestionTracker, clock: Clock, workers: list[tuple[SimWorker, dict]], seconds: float, dt: float = 0.5) -> None:
    for _ in range(int(seconds / dt)):
        clock.t += dt
        items = []
        for w, load in workers:
            items += w.step(clock.t, dt, **load)
        tr.consume(SampleBatch.from_series(items))


def inst(tr: CongestionTracker, name: str) -> dict:
    snap = tr.refresh()
    found = [d for d in snap.instances if d["instance"] == name]
    assert len(found) == 1, snap.instances
    return found[0]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tracker(clock: Clock) -> CongestionTracker:
    return CongestionTracker(CongestionConfig(rate_window_s=1.0, stale_after_s=5, drop_after_s=20), clock=clock)


def test_levels_rates_and_surrogate(tracker: CongestionTracker, clock: Clock) -> None:
    w = SimWorker("w1", capacity=1000.0)
    run(tracker, clock, [(w, dict(tps=500, req_per_s=1.0, backlog=2000, waiting=3))], 10)
    d = inst(tracker, "w1")
    assert d["queue_length"] == 3 and d["running"] == 4 and d["kv_usage"] == 0.5
    assert d["backlog_tokens"] == 2000 and d["backlog_reported"] is True
    assert d["service_rate_tokens_per_second"] == 1000 and d["service_rate_source"] == "capacity"
    assert d["throughput_tokens_per_second"] == pytest.approx(500)
    assert d["tokens_per_request"] == pytest.approx(500)
    assert d["arrival_rate_tokens_per_second"] == pytest.approx(500)  # backlog flat: lambda = throughput
    assert d["utilization"] == pytest.approx(0.5)
    assert d["backlog_seconds"] == pytest.approx(2.0)
    S = 500 / 1000
    assert d["queueing_delay_seconds"] == pytest.approx(0.5 / 0.5 * S)
    # lam_req (V + S) / (mu (1 - rho)), V = observed backlog seconds
    assert d["congestion_price_seconds_per_token"] == pytest.approx(1.0 * (2.0 + S) / (1000 * 0.5))
    assert d["stale"] is False and d["age_seconds"] == pytest.approx(0.0)
    assert d["stack"] == "vllm"


def test_price_and_backlog_follow_load_changes(tracker: CongestionTracker, clock: Clock) -> None:
    w = SimWorker("w1", capacity=1000.0)
    run(tracker, clock, [(w, dict(tps=200, req_per_s=0.4, backlog=0, waiting=0))], 10)
    light = inst(tracker, "w1")
    run(tracker, clock, [(w, dict(tps=900, req_per_s=1.8, backlog=8000, waiting=16))], 10)
    heavy = inst(tracker, "w1")
    assert light["utilization"] == pytest.approx(0.2, rel=0.02)
    assert heavy["utilization"] == pytest.approx(0.9, rel=0.02)
    assert heavy["backlog_seconds"] == pytest.approx(8.0)
    assert heavy["congestion_price_seconds_per_token"] > 50 * light["congestion_price_seconds_per_token"]
    assert light["congestion_price_seconds_per_token"] == pytest.approx(0.2 / (1000 * 0.8), rel=0.03)
    # and back down
    run(tracker, clock, [(w, dict(tps=200, req_per_s=0.4, backlog=0, waiting=0))], 10)
    again = inst(tracker, "w1")
    assert again["congestion_price_seconds_per_token"] == pytest.approx(light["congestion_price_seconds_per_token"], rel=0.05)


def test_growing_backlog_counts_as_arrivals(tracker: CongestionTracker, clock: Clock) -> None:
    w = SimWorker("w1", capacity=1000.0)
    for k in range(20):
        run(tracker, clock, [(w, dict(tps=1000, req_per_s=1.0, backlog=500.0 * (k + 1), waiting=k))], 0.5)
    d = inst(tracker, "w1")
    # backlog grows 1000 tokens/s while 1000 tokens/s are served: lambda ~ 2000, rho ~ 2
    assert d["arrival_rate_tokens_per_second"] == pytest.approx(2000, rel=0.05)
    assert d["saturated"] is True
    assert np.isfinite(d["congestion_price_seconds_per_token"])  # bounded by rho_max


def test_service_rate_from_busy_throughput_without_capacity(tracker: CongestionTracker, clock: Clock) -> None:
    w = SimWorker("w1", capacity=None)
    run(tracker, clock, [(w, dict(tps=800, req_per_s=1.0, backlog=4000, waiting=5))], 10)
    d = inst(tracker, "w1")
    assert d["service_rate_source"] == "busy_throughput"
    assert d["service_rate_tokens_per_second"] == pytest.approx(800, rel=0.02)
    # later idle at lower throughput: mu stays at the busy estimate
    run(tracker, clock, [(w, dict(tps=200, req_per_s=0.25, backlog=0, waiting=0))], 10)
    d = inst(tracker, "w1")
    assert d["service_rate_tokens_per_second"] == pytest.approx(800, rel=0.05)
    assert d["utilization"] == pytest.approx(0.25, rel=0.05)


def test_never_busy_uses_peak_bound(tracker: CongestionTracker, clock: Clock) -> None:
    w = SimWorker("w1", capacity=None)
    run(tracker, clock, [(w, dict(tps=300, req_per_s=1.0, backlog=0, waiting=0))], 6)
    d = inst(tracker, "w1")
    assert d["service_rate_source"] == "peak_bound"
    assert d["service_rate_tokens_per_second"] == pytest.approx(600, rel=0.02)


def test_counter_reset_is_not_negative_rate(tracker: CongestionTracker, clock: Clock) -> None:
    w = SimWorker("w1")
    run(tracker, clock, [(w, dict(tps=500, req_per_s=1.0, backlog=0, waiting=0))], 5)
    w.computed = 0.0  # worker restarted
    w.done = 0.0
    run(tracker, clock, [(w, dict(tps=500, req_per_s=1.0, backlog=0, waiting=0))], 5)
    d = inst(tracker, "w1")
    assert d["throughput_tokens_per_second"] == pytest.approx(500, rel=0.05)


def test_several_samples_per_series_in_one_batch(tracker: CongestionTracker, clock: Clock) -> None:
    t0 = clock.t
    ts = np.arange(1, 21) * 500 + int(t0 * 1000)
    counter = np.arange(1, 21) * 250.0  # 500 tokens/s
    batch = SampleBatch.from_series([
        (lbl("turboprom_worker_prefill_computed_tokens_total", "w1"), ts[::-1].copy(), counter[::-1].copy()),
        (lbl("turboprom_worker_prefill_capacity_tokens_per_second", "w1"), ts[-1:], [1000.0]),
        (lbl("vllm:num_requests_waiting", "w1"), ts, np.arange(20.0)),
    ])
    clock.t = t0 + 10
    tracker.consume(batch)
    d = inst(tracker, "w1")
    assert d["throughput_tokens_per_second"] == pytest.approx(500)
    assert d["queue_length"] == 19  # newest sample, whatever the batch order
    # replays and older samples change nothing
    tracker.consume(batch)
    assert inst(tracker, "w1")["throughput_tokens_per_second"] == pytest.approx(500)


def test_sglang_tgi_aliases(tracker: CongestionTracker, clock: Clock) -> None:
    ts = [int(clock.t * 1000)]
    tracker.consume(SampleBatch.from_series([
        (lbl("sglang:num_queue_reqs", "s1"), ts, [7.0]),
        (lbl("sglang:num_running_reqs", "s1"), ts, [3.0]),
        (lbl("sglang:token_usage", "s1"), ts, [0.25]),
        (make_labels({"__name__": "tgi_queue_size", "instance": "t1", "cluster": "c1", "model": "m"}), ts, [2.0]),
    ]))
    s1, t1 = inst(tracker, "s1"), inst(tracker, "t1")
    assert (s1["stack"], s1["queue_length"], s1["running"], s1["kv_usage"]) == ("sglang", 7, 3, 0.25)
    assert s1["backlog_reported"] is False and s1["backlog_tokens"] == 7 * 1024  # queue x default tokens/request
    assert (t1["stack"], t1["model_name"], t1["queue_length"]) == ("tgi", "m", 2)


def test_irrelevant_series_are_ignored(tracker: CongestionTracker, clock: Clock) -> None:
    ts = [int(clock.t * 1000)]
    tracker.consume(SampleBatch.from_series([(lbl("node_cpu_seconds_total", "n1"), ts, [1.0]),
                                              (lbl("up", "n1"), ts, [1.0])]))
    assert tracker.refresh().instances == []
    assert tracker.samples_relevant == 0 and tracker.samples_consumed == 2


def test_stale_then_dropped(tracker: CongestionTracker, clock: Clock) -> None:
    a, b = SimWorker("a"), SimWorker("b")
    run(tracker, clock, [(a, dict(tps=500, req_per_s=1, backlog=100, waiting=1)),
                         (b, dict(tps=500, req_per_s=1, backlog=100, waiting=1))], 5)
    run(tracker, clock, [(a, dict(tps=500, req_per_s=1, backlog=100, waiting=1))], 6)  # b silent 6s > 5s
    snap = tracker.refresh()
    by = {d["instance"]: d for d in snap.instances}
    assert by["a"]["stale"] is False and by["b"]["stale"] is True
    assert by["b"]["age_seconds"] == pytest.approx(6.0)
    (cl,) = snap.clusters
    assert cl["instances"] == 1 and cl["stale_instances"] == 1
    assert cl["queue_length"] == 1  # stale instance left out of aggregates
    assert [d["instance"] for d in snap.filtered(include_stale=False)["instances"]] == ["a"]
    run(tracker, clock, [(a, dict(tps=500, req_per_s=1, backlog=100, waiting=1))], 15)  # b silent 21s > 20s
    assert [d["instance"] for d in tracker.refresh().instances] == ["a"]
    # b comes back: a fresh instance again
    run(tracker, clock, [(b, dict(tps=500, req_per_s=1, backlog=100, waiting=1))], 1)
    by = {d["instance"]: d for d in tracker.refresh().instances}
    assert by["b"]["stale"] is False


def test_stale_markers_end_an_instance(tracker: CongestionTracker, clock: Clock) -> None:
    w = SimWorker("w1")
    run(tracker, clock, [(w, dict(tps=500, req_per_s=1, backlog=100, waiting=1))], 2)
    clock.t += 0.5
    ts = [int(clock.t * 1000)]
    ended = [(labels, ts, [STALE_NAN]) for labels, _, _ in w.step(clock.t, 0.5, 0, 0, 0, 0)]
    tracker.consume(SampleBatch.from_series(ended))
    d = inst(tracker, "w1")
    assert d["stale"] is True and d["queue_length"] is None


def test_cluster_aggregates_and_filters(tracker: CongestionTracker, clock: Clock) -> None:
    fleet = [(SimWorker("a", 1000, "east", "llama"), dict(tps=500, req_per_s=1, backlog=1000, waiting=2)),
             (SimWorker("b", 1000, "east", "llama"), dict(tps=300, req_per_s=1, backlog=0, waiting=0)),
             (SimWorker("c", 2000, "west", "qwen"), dict(tps=1000, req_per_s=2, backlog=500, waiting=1))]
    run(tracker, clock, fleet, 6)
    snap = tracker.refresh()
    east = next(c for c in snap.clusters if c["cluster"] == "east")
    assert east["instances"] == 2 and east["model_name"] == "llama"
    assert east["service_rate_tokens_per_second"] == pytest.approx(2000)
    assert east["arrival_rate_tokens_per_second"] == pytest.approx(800, rel=0.02)
    assert east["utilization"] == pytest.approx(0.4, rel=0.02)
    assert east["backlog_tokens"] == 1000 and east["queue_length"] == 2
    assert east["spare_capacity_tokens_per_second"] == pytest.approx(1200, rel=0.02)
    assert east["min_instance_price"] <= east["max_instance_price"]
    f = snap.filtered(clusters=["west"])
    assert [d["instance"] for d in f["instances"]] == ["c"] and [c["cluster"] for c in f["clusters"]] == ["west"]
    f = snap.filtered(models=["llama"], instances=["b", "c"])
    assert [d["instance"] for d in f["instances"]] == ["b"]
    assert snap.filtered(clusters=["nope"])["instances"] == []


def test_write_back_batch(clock: Clock) -> None:
    written: list[SampleBatch] = []
    tr = CongestionTracker(CongestionConfig(rate_window_s=1, stale_after_s=5, drop_after_s=10, resolution_s=5),
                           write=written.append, clock=clock)
    w = SimWorker("w1")
    run(tr, clock, [(w, dict(tps=500, req_per_s=1, backlog=100, waiting=1))], 3)
    tr.refresh()
    clock.t = float(int(clock.t)) + 0.7
    assert tr.write_back() > 0
    b = written[-1]
    assert np.all(b.timestamps == int(clock.t) // 5 * 5 * 1000)  # resolution-aligned
    names = {dict(s)["__name__"] for s in b.series}
    assert "turboprom_congestion_price_seconds_per_token" in names
    assert "turboprom_congestion_cluster_utilization_ratio" in names
    assert names <= {f.name for f in CONGESTION_FAMILIES}
    price = next(v for s, v in zip(b.series, b.values) if dict(s)["__name__"] == "turboprom_congestion_price_seconds_per_token")
    assert dict(next(s for s in b.series if dict(s)["__name__"] == "turboprom_congestion_queue_length")) == {
        "__name__": "turboprom_congestion_queue_length", "cluster": "c1", "model_name": "m", "instance": "w1"}
    assert price == pytest.approx(tr.snapshot().instances[0]["congestion_price_seconds_per_token"])
    # instance dropped -> its series get stale markers once
    clock.t += 11
    tr.refresh()
    tr.write_back()
    b = written[-1]
    assert len(b) > 0 and is_stale(b.values).all()
    tr.refresh()
    assert tr.write_back() == 0


def test_concurrent_consume_and_refresh(clock: Clock) -> None:
    tr = CongestionTracker(CongestionConfig(rate_window_s=1), clock=clock)
    errors: list[BaseException] = []

    def feed(k: int) -> None:
        try:
            for step in range(200):
                ts = [int(clock.t * 1000) + step * 10]
                tr.consume(SampleBatch.from_series([
                    (lbl("vllm:num_requests_waiting", f"w{k}"), ts, [float(step)]),
                    (lbl("turboprom_worker_prefill_computed_tokens_total", f"w{k}"), ts, [step * 10.0]),
                ]))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=feed, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        tr.refresh()
    for t in threads:
        t.join()
    assert not errors
    snap = tr.refresh()
    assert sorted(d["instance"] for d in snap.instances) == ["w0", "w1", "w2", "w3"]
    assert all(d["queue_length"] == 199 for d in snap.instances)


def test_refresher_thread_publishes_quickly(clock: Clock) -> None:
    import time

    tr = CongestionTracker(CongestionConfig(rebuild_period_s=10))  # real clock
    seen = threading.Event()
    tr.subscribe(lambda s: seen.set() if s.instances else None)
    tr.start()
    try:
        t0 = time.time()
        tr.consume(SampleBatch.from_series([(lbl("vllm:num_requests_waiting", "w1"), [int(t0 * 1000)], [1.0])]))
        assert seen.wait(2.0)
        assert time.time() - t0 < 1.0
        assert tr.snapshot().instances[0]["queue_length"] == 1
    finally:
        tr.stop()


def test_fast_path_data_skips_the_coalescing_wait() -> None:
    """Bulk ingest waits out ``rebuild_min_interval`` after the last rebuild; ``consume_now`` (a fast
    scrape round, a push) is published at once."""
    import time

    tr = CongestionTracker(CongestionConfig(rebuild_period_s=30, rebuild_min_interval_s=3.0))  # real clock
    versions: list[tuple[float, float]] = []  # (time, queue length) per snapshot with the instance
    tr.subscribe(lambda s: versions.append((time.time(), s.instances[0]["queue_length"])) if s.instances else None)
    tr.start()

    def sample(v: float) -> SampleBatch:
        return SampleBatch.from_series([(lbl("vllm:num_requests_waiting", "w1"), [int(time.time() * 1000)], [v])])

    try:
        tr.consume(sample(1.0))
        end = time.time() + 5
        while not versions and time.time() < end:
            time.sleep(0.01)
        assert versions and versions[-1][1] == 1.0
        tr.consume(sample(2.0))  # coalesced: the last rebuild was just now
        time.sleep(0.3)
        assert versions[-1][1] == 1.0
        t0 = time.time()
        tr.consume_now(sample(3.0))
        while versions[-1][1] != 3.0 and time.time() < t0 + 2.0:
            time.sleep(0.005)
        assert versions[-1][1] == 3.0 and versions[-1][0] - t0 < 1.0
    finally:
        tr.stop()


def test_idle_tracker_rebuilds_rarely_and_a_read_catches_up() -> None:
    """Nobody reading (idle_after): scrapes do not each trigger a rebuild, only the slow idle period
    does. The first read after the spell wakes the refresher and gets the newest data; the tracker is
    then prompt again. A relay's reader clock (the poll process's board) counts as a reader."""
    import time

    tr = CongestionTracker(CongestionConfig(rebuild_period_s=0.05, idle_after_s=0.2, idle_rebuild_period_s=60))
    builds: list[float] = []
    tr.subscribe(lambda s: builds.append(time.monotonic()), reader=False)  # a relay: not a reader

    def sample(v: float) -> SampleBatch:
        return SampleBatch.from_series([(lbl("vllm:num_requests_waiting", "w1"), [int(time.time() * 1000)], [v])])

    tr.start()
    try:
        time.sleep(0.5)  # past idle_after with no read; the start-up build is done
        n0 = len(builds)
        for v in range(1, 21):
            tr.consume(sample(float(v)))
            time.sleep(0.02)
        time.sleep(0.2)
        assert len(builds) == n0  # 20 batches, no rebuild
        assert tr.idle()
        t0 = time.monotonic()
        snap = tr.fresh_snapshot(2.0)
        assert snap.instances and snap.instances[0]["queue_length"] == 20.0
        assert time.monotonic() - t0 < 1.0 and len(builds) == n0 + 1
        assert not tr.idle()
        tr.consume(sample(21.0))  # a reader is around: published within the normal coalescing
        end = time.monotonic() + 2.0
        while tr.snapshot().instances[0]["queue_length"] != 21.0 and time.monotonic() < end:
            time.sleep(0.005)
        assert tr.snapshot().instances[0]["queue_length"] == 21.0
        time.sleep(0.4)
        assert tr.idle()
        remove = tr.add_reader_clock(time.monotonic)  # a relay whose readers read just now
        assert not tr.idle()
        remove()
        assert tr.idle()
        unsubscribe = tr.subscribe(lambda s: None)  # a stream is a reader while subscribed
        assert not tr.idle()
        unsubscribe()
        unsubscribe()
        assert tr.idle()
    finally:
        tr.stop()


def test_idle_after_zero_never_idles() -> None:
    tr = CongestionTracker(CongestionConfig(idle_after_s=0))
    assert not tr.idle()
    with pytest.raises(ValueError, match="idle_after"):
        CongestionConfig.from_mapping({"idle_after": -1})
    assert CongestionConfig.from_mapping({"idle_after": "2m", "idle_rebuild_period": "10s"}).idle_after_s == 120.0


def test_config_from_mapping() -> None:
    cfg = CongestionConfig.from_mapping({"stale_after": "2s", "drop_after": "1m", "resolution": "500ms", "rho_max": 0.9})
    assert (cfg.stale_after_s, cfg.drop_after_s, cfg.resolution_s, cfg.rho_max) == (2.0, 60.0, 0.5, 0.9)
    with pytest.raises(ValueError, match="unknown setting"):
        CongestionConfig.from_mapping({"stale": 1})
    with pytest.raises(ValueError, match="drop_after"):
        CongestionConfig.from_mapping({"stale_after": 10, "drop_after": 5})
    with pytest.raises(ValueError, match="duration"):
        CongestionConfig.from_mapping({"stale_after": "soon"})


def test_series_ids_from_storage_give_the_same_signals(tmp_path) -> None:
    """Batches through the real pipeline carry storage's series ids; the tracker resolves each id once
    and its signals equal those of a tracker fed the same samples without ids."""
    import time

    from ingest.pipeline import IngestPipeline
    from storage.tsdb import TSDB

    clock = Clock(time.time() - 60)
    cfg = CongestionConfig(rate_window_s=1.0, stale_after_s=5, drop_after_s=20)
    by_id, by_labels = CongestionTracker(cfg, clock=clock), CongestionTracker(cfg, clock=clock)
    db = TSDB(str(tmp_path / "db"), background=False)
    try:
        pipe = IngestPipeline(db)
        pipe.add_sink(by_id)
        workers = [SimWorker("a", 1000.0), SimWorker("b", None, cluster="c2")]
        noise = make_labels({"__name__": "node_cpu_seconds_total", "instance": "a", "cpu": "0"})
        seen_ids = []
        for k in range(12):
            clock.t += 0.5
            items = [(noise, [int(clock.t * 1000)], [float(k)])]
            for w in workers:
                items += w.step(clock.t, 0.5, tps=400, req_per_s=1, backlog=200, waiting=2)
            batch = SampleBatch.from_series(items)
            pipe.append_sync(batch)
            assert batch.series_ids is not None
            seen_ids.append(batch.series_ids)
            by_labels.consume(SampleBatch.from_series(items))
        a, b = by_id.refresh(), by_labels.refresh()
        assert a.instances == b.instances and a.clusters == b.clusters and len(a.instances) == 2
        # every id was resolved once: the label cache holds the relevant series only, not the noise
        assert noise not in by_id.table.cache and len(by_id.table.cache) == 13
        # an instance forgotten after drop_after comes back through the same ids
        clock.t += 30
        assert by_id.refresh().instances == []
        clock.t += 0.5
        items = workers[0].step(clock.t, 0.5, tps=400, req_per_s=1, backlog=200, waiting=7)
        pipe.append_sync(SampleBatch.from_series(items))
        back = by_id.refresh().instances
        assert [(d["instance"], d["queue_length"]) for d in back] == [("a", 7.0)]
    finally:
        db.close()


def test_dropping_many_instances_at_once_keeps_the_others(tmp_path) -> None:
    """Instances that fall silent together are forgotten in one rebuild; the series ids of the
    instances still reporting keep their slots, and a forgotten one comes back with fresh state."""
    import time

    from ingest.pipeline import IngestPipeline
    from storage.tsdb import TSDB

    clock = Clock(time.time() - 120)
    tr = CongestionTracker(CongestionConfig(rate_window_s=1.0, stale_after_s=5, drop_after_s=20), clock=clock)
    db = TSDB(str(tmp_path / "db"), background=False)
    try:
        pipe = IngestPipeline(db)
        pipe.add_sink(tr)
        workers = [SimWorker(f"w{i}", 1000.0) for i in range(6)]
        for _ in range(4):
            clock.t += 0.5
            items = [x for w in workers for x in w.step(clock.t, 0.5, tps=400, req_per_s=1, backlog=100, waiting=1)]
            pipe.append_sync(SampleBatch.from_series(items))
        assert len(tr.refresh().instances) == 6
        kept_ids = None
        for _ in range(50):  # only w5 keeps reporting for 25 s
            clock.t += 0.5
            batch = SampleBatch.from_series(workers[5].step(clock.t, 0.5, tps=400, req_per_s=1, backlog=100, waiting=3))
            pipe.append_sync(batch)
            kept_ids = batch.series_ids
        left = tr.refresh().instances
        assert [(d["instance"], d["queue_length"]) for d in left] == [("w5", 3.0)]
        assert kept_ids is not None and (tr.table.sid_slot[kept_ids] >= 0).all()
        assert len(tr.table.free_slots) == 5 * len(kept_ids) and len(tr.table.free_insts) == 5
        clock.t += 0.5
        items = workers[0].step(clock.t, 0.5, tps=400, req_per_s=1, backlog=100, waiting=9)
        items += workers[5].step(clock.t, 0.5, tps=400, req_per_s=1, backlog=100, waiting=4)
        pipe.append_sync(SampleBatch.from_series(items))
        back = {d["instance"]: d["queue_length"] for d in tr.refresh().instances}
        assert back == {"w0": 9.0, "w5": 4.0}
    finally:
        db.close()


def test_history_older_than_drop_after_makes_no_instances(caplog: pytest.LogCaptureFixture) -> None:
    """A backfill or import of hours-old samples is history: it creates no instance (which the next
    rebuild would forget again, logging a drop each time); fresh samples after it are tracked."""
    clock = Clock()
    tr = CongestionTracker(CongestionConfig(), clock=clock)
    w = SimWorker("gpu-0")
    old = clock.t - 3 * 3600
    for k in range(4):
        tr.consume(SampleBatch.from_series(w.step(old + 15 * k, 15, tps=500, req_per_s=1, backlog=100, waiting=2)))
    with caplog.at_level("INFO", logger="turboprom.congestion"):
        snap = tr.refresh()
    assert snap.instances == [] and tr.samples_consumed > 0 and tr.samples_relevant == 0
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]
    tr.consume(SampleBatch.from_series(w.step(clock.t, 1, tps=500, req_per_s=1, backlog=100, waiting=2)))
    (inst,) = tr.refresh().instances
    assert inst["instance"] == "gpu-0" and inst["queue_length"] == 2 and not inst["stale"]
