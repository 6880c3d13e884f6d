"""CongestionTracker: an ingest sink turning worker metrics into live backlog/congestion signals.

Data path (``consume``, called from ingest worker threads with the samples storage accepted): the
slot table (``slot_table.py``) resolves each series once in its life to a slot and updates the slots'
values and rates with numpy per batch; a refresher thread rebuilds a ready-to-serve snapshot
(instances, cluster aggregates and the pre-encoded JSON body) from the table's columns through the
pure model (``model.py``) shortly after new data (``rebuild_min_interval_s``; at once after data from
a fast path, ``consume_now``) and at least every ``rebuild_period_s`` (ages, staleness); polls only
read that snapshot, never storage. This module is the publisher: the snapshot, its subscribers, the
write-back of the signals as series, and the threads.

Publishing follows demand. While something reads the signals (a poll, a stream, a policy check, the
poll process's board) the snapshot is rebuilt as above. After ``idle_after_s`` without a reader it is
rebuilt only every ``idle_rebuild_period_s`` (for the write-back), so a server that scrapes a fleet
nobody routes on does not pay a rebuild per scrape. The first read after such a spell wakes the
refresher; ``catch_up`` / ``wait_newer`` let a reader wait for that rebuild instead of taking the older
snapshot.

Per instance (key: ``cluster``, ``model_name`` (else ``model``), ``instance`` labels; entries and written-back
series are labelled ``model_name``) it keeps: queue
length, running, backlog tokens (reported, else queue x tokens/request) and seconds, KV usage,
throughput and service rate, arrival rate (throughput + backlog growth), utilization, queueing
delay and congestion price from the surrogate in ``queueing.py``, freshness. Instances whose
newest sample is older than ``stale_after_s`` (or whose series all ended with stale markers) are
marked stale and left out of cluster aggregates; after ``drop_after_s`` they are forgotten.

Service rate ``mu`` (tokens/s), in order of preference: the worker's offline-calibrated capacity
gauge; an EWMA of measured prefill throughput taken only while the instance was busy (backlog or
queue non-empty, so throughput equals service rate); twice the peak throughput seen (a stated
guess: the instance has never been seen busy). ``service_rate_source`` says which.

The same signals are written back as ``turboprom_congestion_*`` series every ``resolution_s``
through a ``write`` callable (the ingest pipeline's ``submit_sync`` or ``storage.append``).
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import orjson
from prometheus_client import Histogram

from scheduler_metrics.congestion.config import CongestionConfig
from scheduler_metrics.congestion.model import MU_SOURCES, cluster_signals, congestion_model, jsonable, signal_matrices
from scheduler_metrics.congestion.queueing import SurrogateParams
from scheduler_metrics.congestion.slot_table import InstanceKey, SlotColumns, SlotTable
from storage.batch import SampleBatch
from storage.labels import Labels
from storage.stale import STALE_NAN

log = logging.getLogger("turboprom.congestion")

# Our own cost and latency, on the server's /metrics (prometheus-client default registry).
CONSUME_SECONDS = Histogram("turboprom_congestion_consume_seconds", "Time the tracker spends per ingested batch.",
                            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1))
PUBLISH_DELAY_SECONDS = Histogram("turboprom_congestion_publish_delay_seconds",
                                  "From a batch reaching the tracker to the snapshot that includes it.",
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0))
BUILD_SECONDS = Histogram("turboprom_congestion_snapshot_build_seconds", "Time to rebuild the snapshot.",
                          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1))

@dataclass
class CongestionSnapshot:
    version: int
    generated_at: float  # unix seconds
    instances: list[dict[str, Any]]
    clusters: list[dict[str, Any]]
    model: dict[str, Any]
    body: bytes = b""  # the unfiltered success JSON, pre-encoded

    def __post_init__(self) -> None:
        # Schedulers poll the same filter over and over: encode each filter once per snapshot.
        self._bodies: dict[tuple, bytes] = {}

    def body_for(self, clusters: Iterable[str] = (), models: Iterable[str] = (), instances: Iterable[str] = (),
                 include_stale: bool = True) -> bytes:
        """The success JSON for a filter, cached on this (immutable) snapshot."""
        key = (tuple(sorted(clusters)), tuple(sorted(models)), tuple(sorted(instances)), include_stale)
        if key == ((), (), (), True) and self.body:
            return self.body
        body = self._bodies.get(key)
        if body is None:
            body = orjson.dumps({"status": "success", "data": self.filtered(*key)})
            if len(self._bodies) < 256:
                self._bodies[key] = body
        return body

    def filtered(self, clusters: Iterable[str] = (), models: Iterable[str] = (), instances: Iterable[str] = (),
                 include_stale: bool = True) -> dict[str, Any]:
        cs, ms, ins = set(clusters), set(models), set(instances)

        def keep(d: dict[str, Any], use_instance: bool) -> bool:
            return ((not cs or d["cluster"] in cs) and (not ms or d["model_name"] in ms)
                    and (not use_instance or not ins or d["instance"] in ins))

        return {
            "generated_at": self.generated_at,
            "version": self.version,
            "model": self.model,
            "instances": [d for d in self.instances if keep(d, True) and (include_stale or not d["stale"])],
            "clusters": [d for d in self.clusters if keep(d, False)],
        }


_INSTANCE_KEYS = ("cluster", "model_name", "instance", "stack", "queue_length", "running", "backlog_tokens",
                  "backlog_seconds", "kv_usage", "throughput_tokens_per_second", "service_rate_tokens_per_second",
                  "arrival_rate_tokens_per_second", "request_rate_per_second", "tokens_per_request", "utilization",
                  "queueing_delay_seconds", "congestion_price_seconds_per_token", "age_seconds", "backlog_reported",
                  "service_rate_source", "saturated", "newest_sample_ms", "stale", "lora")
class CongestionTracker:
    def __init__(self, config: CongestionConfig | None = None, *, write: Callable[[SampleBatch], Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config or CongestionConfig()
        self.params = SurrogateParams(self.config.ca2, self.config.cs2, self.config.rho_max)
        self.write = write
        self.clock = clock
        self._lock = threading.Lock()
        # Versions restart at 0 with the process: the epoch tells one run's snapshots from another's.
        self.epoch = secrets.randbits(63)
        self.table = SlotTable(self.config.rate_window_s, self.config.max_cache_entries)
        # (instance version, live ids in key order, (cluster, model) group of each live id in id order, group names)
        self._order: tuple[int, np.ndarray, np.ndarray, list[tuple[str, str]]] = (-1, np.zeros(0, np.int64),
                                                                                 np.zeros(0, np.int64), [])
        # snapshot
        self._dirty = threading.Event()
        self._urgent = threading.Event()  # the pending data came by a fast path: rebuild at once
        self._version = 0
        self._last_build = 0.0
        self._snapshot = CongestionSnapshot(0, self.clock(), [], [], self._model_info())
        self._snapshot.body = self._encode(self._snapshot)
        self._subscribers: list[Callable[[CongestionSnapshot], None]] = []
        self._readers_subscribed = 0  # subscribers that are readers (streams), not relays
        self._reader_clocks: list[Callable[[], float]] = []  # monotonic time of a relay's last read
        self._last_read = -float("inf")  # time.monotonic() of the last read here
        self._read_wake = threading.Event()  # a read ended an idle spell: rebuild now
        self._built = threading.Condition()
        self._last_build_mono = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer: threading.Thread | None = None
        self._written_keys: set[tuple[str, InstanceKey]] = set()
        self._signal_labels: dict[tuple[str, InstanceKey], Labels] = {}
        self.samples_consumed = 0
        self.last_build_s = 0.0
        self._pending_since: float | None = None  # perf_counter of the oldest unpublished relevant batch
        self.samples_relevant = 0

    # ------------------------------------------------------------------ ingest side
    def consume(self, batch: SampleBatch) -> None:
        n = len(batch)
        if n == 0:
            return
        t0 = time.perf_counter()
        try:
            self._consume(batch, n)
        finally:
            CONSUME_SECONDS.observe(time.perf_counter() - t0)

    def consume_now(self, batch: SampleBatch) -> None:
        """``consume``, and the next snapshot is built without the coalescing wait: for the fast
        paths (a whole fast-scrape round, an engine's own push), which arrive a few times a second
        per source and exist to be fresh; bulk ingest keeps coalescing."""
        self.consume(batch)
        self._urgent.set()

    def _consume(self, batch: SampleBatch, n: int) -> None:
        if int(batch.timestamps.max()) < (self.clock() - self.config.drop_after_s) * 1000.0:
            # history (a backfill, an import, a sender catching up): older than an instance may stay
            # silent, so it would only make instances that the next rebuild forgets again
            with self._lock:
                self.samples_consumed += n
            return
        with self._lock:
            smap = self.table.slots_of(batch)
            self.samples_consumed += n
            if not (smap >= 0).any():
                return
            sl = smap[batch.series_index]
            m = sl >= 0
            sl = sl[m]
            ts = batch.timestamps[m]
            vs = batch.values[m]
            self.samples_relevant += len(sl)
            self.table.update(sl, ts, vs)
            if self._pending_since is None:
                self._pending_since = time.perf_counter()
        self._dirty.set()

    # ------------------------------------------------------------------ snapshot side
    def _model_info(self) -> dict[str, Any]:
        p = self.params
        return {"surrogate": p.name, "ca2": p.ca2, "cs2": p.cs2, "rho_max": p.rho_max,
                "price_unit": "seconds of delay imposed on later requests per added prefill token",
                "stale_after_seconds": self.config.stale_after_s, "drop_after_seconds": self.config.drop_after_s,
                "resolution_seconds": self.config.resolution_s}

    @staticmethod
    def _encode(s: CongestionSnapshot) -> bytes:
        return orjson.dumps({"status": "success", "data": s.filtered()})

    def snapshot(self) -> CongestionSnapshot:
        """The latest ready-to-serve snapshot (rebuilt here only when no refresher thread runs); a read."""
        self._last_read = time.monotonic()
        if self._thread is None and self._dirty.is_set():
            self.refresh()
        return self._snapshot

    def idle(self, now: float | None = None) -> bool:
        """True when nothing has read the signals for ``idle_after_s`` (no reader subscribed either)."""
        limit = self.config.idle_after_s
        if limit <= 0 or self._readers_subscribed:
            return False
        now = time.monotonic() if now is None else now
        last = self._last_read
        for clock in self._reader_clocks:
            try:
                last = max(last, clock())
            except Exception:  # noqa: BLE001 - a closed relay reads as no reader
                pass
        return now - last > limit

    def catch_up(self) -> int | None:
        """Note a read about to happen. When it ends an idle spell with data not yet published (or
        ages older than ``rebuild_period_s``), wake the refresher and return the current version
        (``wait_newer`` it for the fresh snapshot); otherwise None (the current snapshot is as fresh
        as a busy tracker's)."""
        idle = self.idle()
        now = self._last_read = time.monotonic()
        if idle and self._thread is not None and (self._dirty.is_set()
                                                  or now - self._last_build_mono > self.config.rebuild_period_s):
            v = self._snapshot.version
            self._read_wake.set()
            return v
        return None

    def wait_newer(self, version: int, timeout_s: float) -> CongestionSnapshot:
        """Block (a worker thread, never the event loop) until a snapshot newer than ``version`` is out."""
        with self._built:
            self._built.wait_for(lambda: self._snapshot.version != version or self._stop.is_set(), timeout_s)
        return self._snapshot

    def fresh_snapshot(self, timeout_s: float = 1.0) -> CongestionSnapshot:
        """A read from a worker thread (never the event loop): after an idle spell, the snapshot the
        read's wake-up rebuilds (waiting up to ``timeout_s``), else the current one."""
        v = self.catch_up()
        return self.snapshot() if v is None else self.wait_newer(v, timeout_s)

    def add_reader_clock(self, clock: Callable[[], float]) -> Callable[[], None]:
        """A relay of the snapshot (the poll process's board) reports its readers: ``clock()`` is the
        ``time.monotonic()`` of its last read. Returns a remove."""
        self._reader_clocks.append(clock)

        def remove() -> None:
            try:
                self._reader_clocks.remove(clock)
            except ValueError:
                pass

        return remove

    def subscribe(self, fn: Callable[[CongestionSnapshot], None], *, reader: bool = True) -> Callable[[], None]:
        """Call ``fn(snapshot)`` after every rebuild (from the refresher thread). Returns an unsubscribe.
        A ``reader`` (a stream) keeps publishing prompt while subscribed; a relay passes ``reader=False``
        and reports its own readers through ``add_reader_clock``."""
        self._subscribers.append(fn)
        if reader:
            self._readers_subscribed += 1
        done = False

        def unsubscribe() -> None:
            nonlocal done
            try:
                self._subscribers.remove(fn)
            except ValueError:
                pass
            if reader and not done:
                self._readers_subscribed -= 1
            done = True

        return unsubscribe

    def refresh(self, now: float | None = None) -> CongestionSnapshot:
        """Rebuild the snapshot now (also drops long-silent instances)."""
        now = self.clock() if now is None else now
        t_build = time.perf_counter()
        self._dirty.clear()
        with self._lock:
            pending, self._pending_since = self._pending_since, None
            self._drop_silent(now)
            t = self.table
            cols = t.columns()
            if self._order[0] != t.inst_version:  # once per change of the instance set
                keys = cols.keys
                live_ids = [i for i in range(cols.n) if keys[i] is not None]
                gid_of: dict[tuple[str, str], int] = {}
                gid = np.fromiter((gid_of.setdefault(keys[i][:2], len(gid_of)) for i in live_ids), np.int64,  # type: ignore[index]
                                  len(live_ids))
                self._order = (t.inst_version, np.array(sorted(live_ids, key=keys.__getitem__), np.int64), gid,
                               list(gid_of))
            last_build = self._last_build
            self._last_build = now
            snap = self._build(now, cols, now - last_build if last_build else 0.0, t.lora_by_instance(cols))
        with self._built:
            self._snapshot = snap
            self._last_build_mono = time.monotonic()
            self._built.notify_all()
        done = time.perf_counter()
        BUILD_SECONDS.observe(done - t_build)
        if pending is not None:
            PUBLISH_DELAY_SECONDS.observe(done - pending)
        for fn in list(self._subscribers):
            try:
                fn(snap)
            except Exception:  # noqa: BLE001 - a subscriber must not stop the refresher
                log.exception("congestion subscriber failed")
        return snap

    @staticmethod
    def _attach_lora(order: np.ndarray, lora: dict[int, dict[str, Any]], keys: list[InstanceKey | None],
                     load_cnt: np.ndarray) -> tuple[np.ndarray, dict[int, dict[str, Any]]]:
        """vLLM's ``vllm:lora_requests_info`` has no ``model_name`` label, so its series key to
        (cluster, "", instance) while the engine's other series carry the model. Such a LoRA-only
        instance is not an entry of its own: its info goes to the entries of the same cluster and
        instance, and it leaves ``order`` (it is also stale, so cluster rows skip it)."""
        aux = {i for i in lora if load_cnt[i] == 0 and keys[i] is not None and keys[i][1] == ""}  # type: ignore[index]
        if not aux:
            return order, lora
        by_host = {(keys[i][0], keys[i][2]): lora[i] for i in aux}  # type: ignore[index]
        out = {i: v for i, v in lora.items() if i not in aux}
        kept = [i for i in order.tolist() if i not in aux]
        for i in kept:
            k = keys[i]
            if i not in out and k is not None and (k[0], k[2]) in by_host:
                out[i] = by_host[(k[0], k[2])]
        return np.array(kept, np.int64), out

    def _drop_silent(self, now: float) -> None:
        """Forget instances silent for longer than ``drop_after_s`` (lock held)."""
        dropped = self.table.drop_silent((now - self.config.drop_after_s) * 1000.0)
        if dropped:
            log.info("congestion: dropped %d instance(s) silent for > %.0fs: %s%s", len(dropped), self.config.drop_after_s,
                     ", ".join(map(str, dropped[:5])), " ..." if len(dropped) > 5 else "")

    def _build(self, now: float, c: SlotColumns, dt_build: float, lora: dict[int, dict[str, Any]]) -> CongestionSnapshot:
        """The snapshot from the table's columns (lock held: the model's carried state is written back).
        Entries in key order; ``lora``: instance id -> LoRA adapter info (others get ``None``)."""
        _, order, groups, group_names = self._order
        t, n = self.table, c.n
        sig = congestion_model(signal_matrices(c), c.newest, t.mu_busy[:n], t.peak_tps[:n], now=now, dt_build=dt_build,
                               config=self.config, params=self.params)
        t.mu_busy[:n], t.peak_tps[:n] = sig.mu_busy, sig.peak
        keys = c.keys
        if lora:
            order, lora = self._attach_lora(order, lora, keys, sig.load_count)
        idx = np.flatnonzero(np.array([k is not None for k in keys], dtype=bool))
        cols = [jsonable(a[order]) for a in (sig.queue, sig.running, sig.backlog, sig.backlog_s, sig.kv, sig.throughput,
                                              sig.mu, sig.arrival, sig.req_rate, sig.tokens_per_request, sig.rho,
                                              sig.wait, sig.price, sig.age)]
        ident = [(*keys[i], c.stacks[i] or "turboprom") for i in order.tolist()]  # type: ignore[misc]
        newest_l = [int(x) if x >= 0 else None for x in c.newest[order].tolist()]
        order_l = order.tolist()
        lora_l = [lora.get(i) for i in order_l] if lora else [None] * len(order_l)
        rows = zip(ident, zip(*cols), sig.backlog_reported[order].tolist(), MU_SOURCES[sig.mu_source[order]].tolist(),
                   (sig.rho[order] >= 1.0).tolist(), newest_l, sig.stale[order].tolist(), lora_l)
        instances = [dict(zip(_INSTANCE_KEYS, (*idt, *vals, hb, sname, sat, nw, st, lo)))
                     for idt, vals, hb, sname, sat, nw, st, lo in rows]
        clusters = cluster_signals(groups, group_names, sig, idx, self.params, self.config.default_tokens_per_request)
        self._version += 1
        snap = CongestionSnapshot(self._version, now, instances, clusters, self._model_info())
        snap.body = self._encode(snap)
        return snap

    # ------------------------------------------------------------------ write-back
    _INSTANCE_FIELDS = {
        "turboprom_congestion_queue_length": "queue_length",
        "turboprom_congestion_running": "running",
        "turboprom_congestion_backlog_tokens": "backlog_tokens",
        "turboprom_congestion_backlog_seconds": "backlog_seconds",
        "turboprom_congestion_kv_usage_ratio": "kv_usage",
        "turboprom_congestion_service_rate_tokens_per_second": "service_rate_tokens_per_second",
        "turboprom_congestion_arrival_rate_tokens_per_second": "arrival_rate_tokens_per_second",
        "turboprom_congestion_utilization_ratio": "utilization",
        "turboprom_congestion_queueing_delay_seconds": "queueing_delay_seconds",
        "turboprom_congestion_price_seconds_per_token": "congestion_price_seconds_per_token",
        "turboprom_congestion_age_seconds": "age_seconds",
        "turboprom_congestion_stale": "stale",
    }
    _CLUSTER_FIELDS = {
        "turboprom_congestion_cluster_instances": "instances",
        "turboprom_congestion_cluster_queue_length": "queue_length",
        "turboprom_congestion_cluster_backlog_tokens": "backlog_tokens",
        "turboprom_congestion_cluster_utilization_ratio": "utilization",
        "turboprom_congestion_cluster_price_seconds_per_token": "congestion_price_seconds_per_token",
    }

    def signal_batch(self, snap: CongestionSnapshot, ts_ms: int) -> SampleBatch:
        """The snapshot as ``turboprom_congestion_*`` samples at ``ts_ms``; series that vanished get stale markers."""
        series: list[Labels] = []
        values: list[float] = []
        seen: set[tuple[str, InstanceKey]] = set()
        known = self._signal_labels  # (name, ident) -> labels, built once per written series

        def labels_of(key: tuple[str, InstanceKey]) -> Labels:
            lbl = known.get(key)
            if lbl is None:
                name, (c, mdl, ins) = key
                pairs = [("__name__", name), ("cluster", c), ("model_name", mdl), ("instance", ins)]
                lbl = known[key] = tuple(sorted((k, x) for k, x in pairs if x != ""))
            return lbl

        def add(name: str, ident: InstanceKey, v: Any) -> None:
            if v is None:
                return
            key = (name, ident)
            series.append(labels_of(key))
            values.append(float(v))
            seen.add(key)

        for d in snap.instances:
            ident = (d["cluster"], d["model_name"], d["instance"])
            for name, f in self._INSTANCE_FIELDS.items():
                add(name, ident, d[f])
        for d in snap.clusters:
            ident = (d["cluster"], d["model_name"], "")
            for name, f in self._CLUSTER_FIELDS.items():
                add(name, ident, d[f])
        for key in self._written_keys - seen:
            series.append(labels_of(key))
            values.append(STALE_NAN)
            del known[key]
        self._written_keys = seen
        k = len(series)
        return SampleBatch(series, np.arange(k, dtype=np.int64), np.full(k, ts_ms, np.int64),
                           np.array(values, dtype=np.float64))

    def write_back(self, now: float | None = None) -> int:
        """Write the current snapshot as series at the resolution-aligned timestamp; returns samples written."""
        if self.write is None:
            return 0
        now = self.clock() if now is None else now
        res_ms = max(int(self.config.resolution_s * 1000), 1)
        ts_ms = int(now * 1000) // res_ms * res_ms
        batch = self.signal_batch(self._snapshot, ts_ms)
        if len(batch) == 0:
            return 0
        try:
            self.write(batch)
        except Exception as e:  # noqa: BLE001 - overload or shutdown: the next tick writes again
            log.warning("congestion write-back of %d samples failed: %s", len(batch), e)
            return 0
        return len(batch)

    # ------------------------------------------------------------------ lifecycle
    def attach(self, ingest: Any, storage: Any) -> None:
        """Become a sink of the ingest pipeline (if there is one) and write signals back through it,
        else straight to storage. Idempotent: wiring and the route setup both call it."""
        if ingest is not None:
            if self not in getattr(ingest, "sinks", []):
                ingest.add_sink(self)
            self.write = ingest.submit_sync
        elif storage is not None and self.write is None:
            self.write = storage.append

    def _run(self) -> None:
        cfg = self.config
        while not self._stop.is_set():
            if self.idle():
                # Nobody reads: rebuild every idle_rebuild_period_s (the write-back's signals), checking
                # for readers every rebuild_period_s (a relay's readers are seen only by looking).
                due = self._last_build_mono + cfg.idle_rebuild_period_s - time.monotonic()
                if due > 0:
                    self._read_wake.wait(min(due, cfg.rebuild_period_s))
                    if self._stop.is_set():
                        break
                    if not self._read_wake.is_set() and (self.idle() or not self._dirty.is_set()) \
                            and time.monotonic() < self._last_build_mono + cfg.idle_rebuild_period_s:
                        continue
                self._read_wake.clear()
                self._urgent.clear()
                self._rebuild()
                continue
            self._dirty.wait(timeout=cfg.rebuild_period_s)
            if self._stop.is_set():
                break
            now = self.clock()
            # Coalesce under heavy ingest: at most ~1/4 of the time rebuilding (a wait of 3x the last
            # build, which is wall time and so grows when the GIL is contended), never longer than
            # rebuild_period_s. Small fleets (builds of a few ms) still publish within ~10-20 ms; a
            # 1000-instance fleet (~15 ms builds) every ~60 ms instead of taking half a core from ingest.
            # Data from a fast path (consume_now) is published at once.
            wait = max(cfg.rebuild_min_interval_s, min(3.0 * self.last_build_s, cfg.rebuild_period_s)) - (now - self._last_build)
            if wait > 0 and not self._urgent.is_set():
                self._urgent.wait(wait)
            self._urgent.clear()
            self._read_wake.clear()
            self._rebuild()

    def _rebuild(self) -> None:
        try:
            t = time.perf_counter()
            self.refresh()
            self.last_build_s = time.perf_counter() - t
        except Exception:  # noqa: BLE001 - keep serving the last snapshot
            log.exception("congestion snapshot rebuild failed")

    def _run_writer(self) -> None:
        """Write-back on its own thread: a slow storage append (WAL fsync) must not delay snapshots."""
        res = self.config.resolution_s
        while not self._stop.wait(res - (self.clock() % res) + 0.001 if res > 0 else 1.0):
            if self.write is not None:
                self.write_back()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="congestion-refresher", daemon=True)
        self._thread.start()
        if self.config.resolution_s > 0:
            self._writer = threading.Thread(target=self._run_writer, name="congestion-writer", daemon=True)
            self._writer.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._urgent.set()
        self._read_wake.set()
        with self._built:
            self._built.notify_all()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=5)
        w, self._writer = self._writer, None
        if w is not None:
            w.join(timeout=10)


__all__ = ["CongestionSnapshot", "CongestionTracker"]
