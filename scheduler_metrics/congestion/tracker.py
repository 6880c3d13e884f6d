"""CongestionTracker: an ingest sink turning worker metrics into live backlog/congestion signals.

Data path (``consume``, called from ingest worker threads with the samples storage accepted):

1. Each series is resolved once in its life to a *slot* (a row of the state arrays): metric name ->
   schema signal (``schema.SIGNAL_BY_SAMPLE_NAME``), identity labels -> instance; irrelevant series
   map to -1. Batches from the ingest pipeline carry storage's series ids, so a known series costs
   one numpy gather in a table indexed by id (one storage feeds one tracker); batches without ids
   (fast scrape, pushed load) go through a label-set cache. New series are the only per-series Python.
2. Everything per sample is numpy: gather slots, drop irrelevant/old samples, sort by
   (slot, time), per-slot increments (counter resets handled), one EWMA rate update per slot,
   newest value per slot, newest sample time per instance. O(1) work per relevant sample.
3. A refresher thread rebuilds a ready-to-serve snapshot (instances, cluster aggregates and the
   pre-encoded JSON body) shortly after new data (``rebuild_min_interval_s``; at once after data
   from a fast path, ``consume_now``) and at least every ``rebuild_period_s`` (ages, staleness);
   polls only read that snapshot, never storage.

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
from functools import lru_cache
from typing import Any, Callable, Iterable

import numpy as np
import orjson
from prometheus_client import Histogram

from scheduler_metrics.congestion.config import CongestionConfig
from scheduler_metrics.congestion.queueing import (SurrogateParams, congestion_price, ewma_alpha, kingman_wait,
                                                   utilization)
from scheduler_metrics.schema import (CONGESTION_FAMILIES, COUNTER_SIGNALS, MODEL_LABELS, SIGNAL_BY_SAMPLE_NAME,
                                      SIGNAL_COMBINE, Signal)
from storage.batch import SampleBatch
from storage.labels import METRIC_NAME, Labels
from storage.stale import STALE_NAN, is_stale

log = logging.getLogger("turboprom.congestion")

# Our own cost and latency, on the server's /metrics (prometheus-client default registry).
CONSUME_SECONDS = Histogram("turboprom_congestion_consume_seconds", "Time the tracker spends per ingested batch.",
                            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1))
PUBLISH_DELAY_SECONDS = Histogram("turboprom_congestion_publish_delay_seconds",
                                  "From a batch reaching the tracker to the snapshot that includes it.",
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0))
BUILD_SECONDS = Histogram("turboprom_congestion_snapshot_build_seconds", "Time to rebuild the snapshot.",
                          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1))

SIGNALS: tuple[Signal, ...] = tuple(Signal)
SIG_INDEX: dict[Signal, int] = {s: i for i, s in enumerate(SIGNALS)}
NSIG = len(SIGNALS)
_IS_COUNTER = np.array([s in COUNTER_SIGNALS for s in SIGNALS])
_IS_MEAN = np.array([SIGNAL_COMBINE.get(s) == "mean" for s in SIGNALS])
_MISS = -2  # cache sentinel: not resolved yet
SLOW_FACTOR = 6.0  # slow-rate window = SLOW_FACTOR x rate_window

InstanceKey = tuple[str, str, str]  # (cluster, model, instance)


def _instance_key(labels: Labels) -> InstanceKey:
    d = dict(labels)
    model = ""
    for name in MODEL_LABELS:
        if d.get(name):
            model = d[name]
            break
    return (d.get("cluster", ""), model, d.get("instance", ""))


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


def _jsonable(a: np.ndarray) -> list[float | None]:
    """Python floats with NaN/inf as None (JSON null)."""
    a = np.asarray(a, dtype=np.float64)
    out: list[float | None] = a.tolist()
    for i in np.flatnonzero(~np.isfinite(a)).tolist():
        out[i] = None
    return out


_INSTANCE_KEYS = ("cluster", "model_name", "instance", "stack", "queue_length", "running", "backlog_tokens",
                  "backlog_seconds", "kv_usage", "throughput_tokens_per_second", "service_rate_tokens_per_second",
                  "arrival_rate_tokens_per_second", "request_rate_per_second", "tokens_per_request", "utilization",
                  "queueing_delay_seconds", "congestion_price_seconds_per_token", "age_seconds", "backlog_reported",
                  "service_rate_source", "saturated", "newest_sample_ms", "stale", "lora")
_LORA = SIG_INDEX[Signal.LORA_INFO]


@lru_cache(maxsize=65_536)
def lora_info(labels: Labels) -> dict[str, Any]:
    """An entry's ``lora`` field from one ``vllm:lora_requests_info`` series' labels: adapter names
    (vLLM joins them with commas) and ``max_lora`` (``None`` when absent or not an integer)."""
    d = dict(labels)
    try:
        max_lora: int | None = int(d.get("max_lora", ""))
    except ValueError:
        max_lora = None
    return {"running": [a for a in d.get("running_lora_adapters", "").split(",") if a],
            "waiting": [a for a in d.get("waiting_lora_adapters", "").split(",") if a], "max_lora": max_lora}


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
        self._cache: dict[Labels, int] = {}
        self._sid_slot = np.full(1024, _MISS, np.int32)  # storage series id -> slot (-1 irrelevant)
        # slot state
        cap = 64
        self._slot_sig = np.full(cap, -1, np.int16)
        self._slot_inst = np.full(cap, -1, np.int32)
        self._slot_scale = np.ones(cap, np.float64)
        self._last_ts = np.full(cap, -1, np.int64)
        self._last_val = np.full(cap, np.nan, np.float64)
        self._rate = np.zeros(cap, np.float64)
        self._rate_slow = np.zeros(cap, np.float64)  # 6x longer window: workload mix (tokens/request)
        # Bias-corrected EWMAs (value / weight, both starting at 0): early estimates are plain
        # averages of what was seen instead of being anchored to the first observation.
        self._rate_w = np.zeros(cap, np.float64)
        self._rate_slow_w = np.zeros(cap, np.float64)
        self._valid = np.zeros(cap, bool)
        self._slot_labels: list[Labels | None] = [None] * cap
        self._free_slots: list[int] = []
        self._nslots = 0
        # instance state
        icap = 16
        self._inst_ids: dict[InstanceKey, int] = {}
        self._inst_keys: list[InstanceKey | None] = [None] * icap
        self._inst_stack: list[str] = [""] * icap
        self._inst_newest = np.full(icap, -1, np.int64)
        self._inst_slots: list[set[int]] = [set() for _ in range(icap)]
        self._mu_busy = np.full(icap, np.nan, np.float64)
        self._peak_tps = np.zeros(icap, np.float64)
        self._free_insts: list[int] = []
        self._ninst = 0
        self._inst_version = 0  # bumped when an instance is added or dropped
        # (version, live ids in key order, (cluster, model) group of each live id in id order, group names)
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer: threading.Thread | None = None
        self._written_keys: set[tuple[str, InstanceKey]] = set()
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
        now = self.clock()
        with self._lock:
            smap = self._slots_of(batch)
            self.samples_consumed += n
            if not (smap >= 0).any():
                return
            sl = smap[batch.series_index]
            m = sl >= 0
            sl = sl[m]
            ts = batch.timestamps[m]
            vs = batch.values[m]
            self.samples_relevant += len(sl)
            self._update_slots(sl, ts, vs, now)
            if self._pending_since is None:
                self._pending_since = time.perf_counter()
        self._dirty.set()

    def _slots_of(self, batch: SampleBatch) -> np.ndarray:
        """Slot (or -1) of every entry of ``batch.series`` (lock held). With storage's series ids the
        lookup is one numpy gather, each id resolved once in its life; without them (batches that
        did not go through storage: the fast scrape, pushed load, tests) a label-set cache lookup."""
        sids = batch.series_ids
        if sids is None:
            cache = self._cache
            smap = np.fromiter((cache.get(lbl, _MISS) for lbl in batch.series), np.int64, len(batch.series))
            for i in np.flatnonzero(smap == _MISS).tolist():
                smap[i] = self._resolve(batch.series[i])
            return smap
        top = int(sids.max()) + 1 if len(sids) else 0
        if top > len(self._sid_slot):
            grown = np.full(max(top, 2 * len(self._sid_slot)), _MISS, np.int32)
            grown[: len(self._sid_slot)] = self._sid_slot
            self._sid_slot = grown
        smap = self._sid_slot[sids].astype(np.int64)
        misses = np.flatnonzero(smap == _MISS)
        if len(misses):
            cache = self._cache
            for i in misses.tolist():
                lbl = batch.series[i]
                slot = cache.get(lbl, _MISS)
                smap[i] = self._resolve(lbl, remember_irrelevant=False) if slot == _MISS else slot
            self._sid_slot[sids[misses]] = smap[misses]
        return smap

    def _resolve(self, labels: Labels, remember_irrelevant: bool = True) -> int:
        """Slot for a series seen for the first time (-1: not a congestion signal). Lock held.
        Irrelevant series stay out of the label cache when the caller keeps them by series id."""
        if len(self._cache) >= self.config.max_cache_entries:
            # Bound memory: forget irrelevant entries; relevant ones stay (they own slots).
            self._cache = {k: v for k, v in self._cache.items() if v >= 0}
        name = ""
        for k, v in labels:
            if k == METRIC_NAME:
                name = v
                break
        src = SIGNAL_BY_SAMPLE_NAME.get(name)
        if src is None:
            if remember_irrelevant:
                self._cache[labels] = -1
            return -1
        key = _instance_key(labels)
        inst = self._inst_ids.get(key)
        if inst is None:
            inst = self._new_instance(key)
        if src.stack != "turboprom" and not self._inst_stack[inst]:
            self._inst_stack[inst] = src.stack
        slot = self._new_slot()
        self._slot_sig[slot] = SIG_INDEX[src.signal]
        self._slot_inst[slot] = inst
        self._slot_scale[slot] = src.scale
        self._slot_labels[slot] = labels
        self._inst_slots[inst].add(slot)
        self._cache[labels] = slot
        return slot

    def _new_slot(self) -> int:
        if self._free_slots:
            s = self._free_slots.pop()
        else:
            s = self._nslots
            self._nslots += 1
            if s >= len(self._slot_sig):
                grow = len(self._slot_sig)
                self._slot_sig = np.concatenate([self._slot_sig, np.full(grow, -1, np.int16)])
                self._slot_inst = np.concatenate([self._slot_inst, np.full(grow, -1, np.int32)])
                self._slot_scale = np.concatenate([self._slot_scale, np.ones(grow)])
                self._last_ts = np.concatenate([self._last_ts, np.full(grow, -1, np.int64)])
                self._last_val = np.concatenate([self._last_val, np.full(grow, np.nan)])
                self._rate = np.concatenate([self._rate, np.zeros(grow)])
                self._rate_slow = np.concatenate([self._rate_slow, np.zeros(grow)])
                self._rate_w = np.concatenate([self._rate_w, np.zeros(grow)])
                self._rate_slow_w = np.concatenate([self._rate_slow_w, np.zeros(grow)])
                self._valid = np.concatenate([self._valid, np.zeros(grow, bool)])
                self._slot_labels.extend([None] * grow)
        self._last_ts[s] = -1
        self._last_val[s] = np.nan
        self._rate[s] = 0.0
        self._rate_slow[s] = 0.0
        self._rate_w[s] = 0.0
        self._rate_slow_w[s] = 0.0
        self._valid[s] = False
        return s

    def _new_instance(self, key: InstanceKey) -> int:
        if self._free_insts:
            i = self._free_insts.pop()
        else:
            i = self._ninst
            self._ninst += 1
            if i >= len(self._inst_newest):
                grow = len(self._inst_newest)
                self._inst_keys.extend([None] * grow)
                self._inst_stack.extend([""] * grow)
                self._inst_newest = np.concatenate([self._inst_newest, np.full(grow, -1, np.int64)])
                self._inst_slots.extend(set() for _ in range(grow))
                self._mu_busy = np.concatenate([self._mu_busy, np.full(grow, np.nan)])
                self._peak_tps = np.concatenate([self._peak_tps, np.zeros(grow)])
        self._inst_ids[key] = i
        self._inst_keys[i] = key
        self._inst_version += 1
        self._inst_stack[i] = ""
        self._inst_newest[i] = -1
        self._inst_slots[i] = set()
        self._mu_busy[i] = np.nan
        self._peak_tps[i] = 0.0
        return i

    def _update_slots(self, sl: np.ndarray, ts: np.ndarray, vs: np.ndarray, now: float) -> None:
        """Columnar state update for relevant samples (lock held)."""
        stale = is_stale(vs)
        # Order by (slot, time); keep only samples newer than what the slot already has.
        order = np.lexsort((ts, sl))
        sl, ts, vs, stale = sl[order], ts[order], vs[order], stale[order]
        newer = ts > self._last_ts[sl]
        if not newer.all():
            sl, ts, vs, stale = sl[newer], ts[newer], vs[newer], stale[newer]
        if len(sl) == 0:
            return
        last_of_group = np.r_[sl[1:] != sl[:-1], True]
        # Stale marker as a slot's newest sample: the series ended (e.g. target down).
        lsl = sl[last_of_group]
        lts = ts[last_of_group]
        ended = stale[last_of_group]
        self._valid[lsl] = ~ended
        # Rates from finite samples only.
        ok = np.isfinite(vs)
        if not ok.all():
            sl, ts, vs = sl[ok], ts[ok], vs[ok]
        if len(sl):
            starts = np.flatnonzero(np.r_[True, sl[1:] != sl[:-1]])
            gsl = sl[starts]
            prev_v = np.r_[np.nan, vs[:-1]]
            prev_t = np.r_[-1, ts[:-1]]
            prev_v[starts] = self._last_val[gsl]
            prev_t[starts] = self._last_ts[gsl]
            has_prev = np.isfinite(prev_v) & (prev_t >= 0)
            inc = vs - prev_v
            counter = _IS_COUNTER[self._slot_sig[sl]]
            reset = counter & (vs < prev_v)
            inc = np.where(reset, vs, inc)
            inc = np.where(has_prev, inc, 0.0)
            inc_sum = np.add.reduceat(inc, starts)
            ends = np.r_[starts[1:], len(sl)] - 1
            span_start = np.where(has_prev[starts], prev_t[starts], ts[starts])
            dt_ms = ts[ends] - span_start
            got = dt_ms > 0
            if got.any():
                g = gsl[got]
                inst_rate = inc_sum[got] / (dt_ms[got] / 1000.0)
                alpha = ewma_alpha(dt_ms[got] / 1000.0, self.config.rate_window_s)
                self._rate[g] += alpha * (inst_rate - self._rate[g])
                self._rate_w[g] += alpha * (1.0 - self._rate_w[g])
                alpha = ewma_alpha(dt_ms[got] / 1000.0, SLOW_FACTOR * self.config.rate_window_s)
                self._rate_slow[g] += alpha * (inst_rate - self._rate_slow[g])
                self._rate_slow_w[g] += alpha * (1.0 - self._rate_slow_w[g])
            self._last_val[gsl] = vs[ends]
        self._last_ts[lsl] = lts
        np.maximum.at(self._inst_newest, self._slot_inst[lsl], lts)

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
        """The latest ready-to-serve snapshot (rebuilt here only when no refresher thread runs)."""
        if self._thread is None and self._dirty.is_set():
            self.refresh()
        return self._snapshot

    def subscribe(self, fn: Callable[[CongestionSnapshot], None]) -> Callable[[], None]:
        """Call ``fn(snapshot)`` after every rebuild (from the refresher thread). Returns an unsubscribe."""
        self._subscribers.append(fn)

        def unsubscribe() -> None:
            try:
                self._subscribers.remove(fn)
            except ValueError:
                pass

        return unsubscribe

    def refresh(self, now: float | None = None) -> CongestionSnapshot:
        """Rebuild the snapshot now (also drops long-silent instances)."""
        now = self.clock() if now is None else now
        t_build = time.perf_counter()
        self._dirty.clear()
        with self._lock:
            pending, self._pending_since = self._pending_since, None
            self._drop_silent(now)
            n = self._ninst
            used = self._slot_sig[: self._nslots] >= 0
            sig = self._slot_sig[: self._nslots][used].astype(np.int64)
            inst = self._slot_inst[: self._nslots][used].astype(np.int64)
            scale = self._slot_scale[: self._nslots][used]
            val = self._last_val[: self._nslots][used]
            w = self._rate_w[: self._nslots][used]
            ws = self._rate_slow_w[: self._nslots][used]
            rate_ok = (w > 0) & (ws > 0)
            rate = self._rate[: self._nslots][used] / np.where(rate_ok, w, 1.0)
            rate_slow = self._rate_slow[: self._nslots][used] / np.where(rate_ok, ws, 1.0)
            valid = self._valid[: self._nslots][used] & np.isfinite(val)
            newest = self._inst_newest[:n].copy()
            keys = list(self._inst_keys[:n])
            if self._order[0] != self._inst_version:  # once per change of the instance set
                live_ids = [i for i in range(n) if keys[i] is not None]
                gid_of: dict[tuple[str, str], int] = {}
                gid = np.fromiter((gid_of.setdefault(keys[i][:2], len(gid_of)) for i in live_ids), np.int64,  # type: ignore[index]
                                  len(live_ids))
                self._order = (self._inst_version, np.array(sorted(live_ids, key=keys.__getitem__), np.int64), gid,
                               list(gid_of))
            _, order, groups, group_names = self._order
            stacks = list(self._inst_stack[:n])
            mu_busy = self._mu_busy[:n]
            peak = self._peak_tps[:n]
            last_build = self._last_build
            self._last_build = now
            lora = self._lora_by_instance(np.flatnonzero(used), sig, inst, val, valid)
            snap = self._build(now, n, sig, inst, scale, val, rate, rate_slow, rate_ok, valid, newest, keys, order,
                               groups, group_names, stacks, mu_busy, peak, now - last_build if last_build else 0.0,
                               lora)
        self._snapshot = snap
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

    def _lora_by_instance(self, slots: np.ndarray, sig: np.ndarray, inst: np.ndarray, val: np.ndarray,
                          valid: np.ndarray) -> dict[int, dict[str, Any]]:
        """Instance id -> LoRA info from its current ``vllm:lora_requests_info`` series: of the live
        ones, the one with the newest value (vLLM sets it to the time of the change; older adapter
        sets stay exported beside it), as the Gateway API Inference Extension's picker reads it. Lock held."""
        m = (sig == _LORA) & valid
        if not m.any():
            return {}
        ls, li, lv = slots[m], inst[m], val[m]
        o = np.lexsort((lv, li))
        ls, li, lv = ls[o], li[o], lv[o]
        last = np.r_[li[1:] != li[:-1], True]
        return {i: {**lora_info(self._slot_labels[s]), "updated_at": v}
                for i, s, v in zip(li[last].tolist(), ls[last].tolist(), lv[last].tolist())}

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
        """Forget instances silent for longer than ``drop_after_s`` (lock held). The storage id -> slot
        map is cleared for all their slots in one pass, however many instances go at once."""
        limit_ms = (now - self.config.drop_after_s) * 1000.0
        newest = self._inst_newest[: self._ninst]
        gone = np.flatnonzero((newest >= 0) & (newest < limit_ms)).tolist()
        if not gone:
            return
        freed: list[int] = []
        dropped: list[InstanceKey] = []
        for i in gone:
            key = self._inst_keys[i]
            if key is None:
                continue
            for s in self._inst_slots[i]:
                lbl = self._slot_labels[s]
                if lbl is not None:
                    self._cache.pop(lbl, None)
                self._slot_labels[s] = None
                freed.append(s)
            self._inst_slots[i] = set()
            del self._inst_ids[key]
            self._inst_keys[i] = None
            self._inst_newest[i] = -1
            self._free_insts.append(i)
            self._inst_version += 1
            dropped.append(key)
        if freed:
            fs = np.asarray(freed, np.int64)
            self._slot_sig[fs] = -1
            self._slot_inst[fs] = -1
            self._valid[fs] = False
            self._free_slots.extend(freed)
            is_freed = np.zeros(self._nslots, bool)
            is_freed[fs] = True
            mapped = self._sid_slot >= 0
            hit = np.zeros(len(self._sid_slot), bool)
            hit[mapped] = is_freed[self._sid_slot[mapped]]
            self._sid_slot[hit] = _MISS
        if dropped:
            log.info("congestion: dropped %d instance(s) silent for > %.0fs: %s%s", len(dropped), self.config.drop_after_s,
                     ", ".join(map(str, dropped[:5])), " ..." if len(dropped) > 5 else "")

    def _build(self, now: float, n: int, sig: np.ndarray, inst: np.ndarray, scale: np.ndarray, val: np.ndarray,
               rate: np.ndarray, rate_slow: np.ndarray, rate_ok: np.ndarray, valid: np.ndarray, newest: np.ndarray,
               keys: list[InstanceKey | None], order: np.ndarray, groups: np.ndarray, group_names: list[tuple[str, str]],
               stacks: list[str], mu_busy: np.ndarray, peak: np.ndarray, dt_build: float,
               lora: dict[int, dict[str, Any]] | None = None) -> CongestionSnapshot:
        """The snapshot. ``order``: the live instance ids sorted by key (the order of ``instances``);
        ``groups``: each live instance's (cluster, model) group in id order, named by ``group_names``;
        ``lora``: instance id -> LoRA adapter info (instances without it get ``None``)."""
        cfg, p = self.config, self.params
        flat = inst * NSIG + sig
        size = max(n, 1) * NSIG
        lvl_sum = np.bincount(flat[valid], weights=(val * scale)[valid], minlength=size)[:size].reshape(-1, NSIG)
        lvl_cnt = np.bincount(flat[valid], minlength=size)[:size].reshape(-1, NSIG)
        rv = rate_ok & valid
        rate_sum = np.bincount(flat[rv], weights=(rate * scale)[rv], minlength=size)[:size].reshape(-1, NSIG)
        rate_cnt = np.bincount(flat[rv], minlength=size)[:size].reshape(-1, NSIG)
        slow_sum = np.bincount(flat[rv], weights=(rate_slow * scale)[rv], minlength=size)[:size].reshape(-1, NSIG)
        with np.errstate(invalid="ignore", divide="ignore"):
            level = np.where(_IS_MEAN, lvl_sum / np.maximum(lvl_cnt, 1), lvl_sum)
        level = np.where(lvl_cnt > 0, level, np.nan)[:n]
        drate = np.where(rate_cnt > 0, rate_sum, np.nan)[:n]
        srate = np.where(rate_cnt > 0, slow_sum, np.nan)[:n]
        lvl_cnt = lvl_cnt[:n]

        def L(s: Signal) -> np.ndarray:
            return level[:, SIG_INDEX[s]]

        def R(s: Signal) -> np.ndarray:
            return drate[:, SIG_INDEX[s]]

        queue, running, kv = L(Signal.QUEUE_LENGTH), L(Signal.RUNNING), L(Signal.KV_USAGE)
        # Throughput of computed prefill tokens (departures), best source first.
        thr = R(Signal.PREFILL_COMPUTED)
        derived = np.maximum(R(Signal.PROMPT_TOKENS) - np.nan_to_num(R(Signal.PREFIX_HITS)), 0.0)
        thr = np.where(np.isnan(thr), derived, thr)
        thr = np.where(np.isnan(thr), L(Signal.PREFILL_TPS_GAUGE), thr)
        thr = np.maximum(thr, 0.0)
        # Tokens per request is a workload-mix property: ratio of the slow (6x window) rates, which
        # quantized request counters (0 or 1 finish per scrape) would otherwise make noisy.
        slow_thr = srate[:, SIG_INDEX[Signal.PREFILL_COMPUTED]]
        slow_derived = np.maximum(srate[:, SIG_INDEX[Signal.PROMPT_TOKENS]]
                                  - np.nan_to_num(srate[:, SIG_INDEX[Signal.PREFIX_HITS]]), 0.0)
        slow_thr = np.where(np.isnan(slow_thr), slow_derived, slow_thr)
        req_done = srate[:, SIG_INDEX[Signal.REQUESTS_DONE]]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpr = np.where((req_done > 0) & (slow_thr > 0), slow_thr / req_done, np.nan)
        tpr = np.where(np.isfinite(tpr), tpr, cfg.default_tokens_per_request)
        # Backlog: reported, else queued requests x tokens per request.
        backlog_rep = L(Signal.BACKLOG_TOKENS)
        has_backlog = ~np.isnan(backlog_rep)
        backlog = np.where(has_backlog, backlog_rep, queue * tpr)
        growth = np.where(has_backlog, R(Signal.BACKLOG_TOKENS), R(Signal.QUEUE_LENGTH) * tpr)
        lam = np.maximum(np.nan_to_num(thr) + np.nan_to_num(growth), 0.0)
        lam = np.where(np.isnan(thr) & np.isnan(growth), np.nan, lam)
        # Service rate mu.
        cap = L(Signal.CAPACITY_TPS)
        busy = (np.nan_to_num(backlog) > 0) | (np.nan_to_num(queue) > 0)
        thr0 = np.nan_to_num(thr)
        a = ewma_alpha(dt_build, cfg.rate_window_s)
        upd = busy & (thr0 > 0)
        mu_busy[upd] = np.where(np.isnan(mu_busy[upd]), thr0[upd], mu_busy[upd] + a * (thr0[upd] - mu_busy[upd]))
        np.maximum(peak, thr0, out=peak)
        mu = np.where(cap > 0, cap, np.nan)
        src = np.where(cap > 0, 1, 0)
        mb = np.maximum(mu_busy, thr0)
        use_busy = np.isnan(mu) & (mb > 0)
        mu = np.where(use_busy, mb, mu)
        src = np.where(use_busy, 2, src)
        use_peak = np.isnan(mu) & (peak > 0)
        mu = np.where(use_peak, 2.0 * peak, mu)
        src = np.where(use_peak, 3, src)
        rho = utilization(lam, mu)
        with np.errstate(invalid="ignore", divide="ignore"):
            backlog_s = np.where(mu > 0, backlog / mu, np.nan)
            mean_service = np.where(mu > 0, tpr / mu, np.nan)
            req_rate = lam / tpr
        wq = kingman_wait(rho, mean_service, p)
        unfinished = np.where(np.isnan(backlog_s), wq, backlog_s)
        price = congestion_price(req_rate, mu, rho, unfinished, mean_service, p)
        price = np.where(np.isnan(rho), np.nan, price)
        age = np.where(newest >= 0, now - newest / 1000.0, np.inf)
        load_cnt = lvl_cnt.sum(axis=1) - lvl_cnt[:, _LORA]
        stale = (age > cfg.stale_after_s) | (load_cnt == 0)
        if lora:
            order, lora = self._attach_lora(order, lora, keys, load_cnt)

        live = np.array([k is not None for k in keys], dtype=bool)
        idx = np.flatnonzero(live)
        src_names = np.array(["none", "capacity", "busy_throughput", "peak_bound"], dtype=object)
        cols = [_jsonable(a[order]) for a in (queue, running, backlog, backlog_s, kv, thr, mu, lam, req_rate, tpr, rho,
                                                wq, price, age)]
        ident = [(*keys[i], stacks[i] or "turboprom") for i in order.tolist()]  # type: ignore[misc]
        newest_l = [int(x) if x >= 0 else None for x in newest[order].tolist()]
        order_l = order.tolist()
        lora_l = [lora.get(i) for i in order_l] if lora else [None] * len(order_l)
        rows = zip(ident, zip(*cols), has_backlog[order].tolist(), src_names[src[order]].tolist(),
                   (rho[order] >= 1.0).tolist(), newest_l, stale[order].tolist(), lora_l)
        instances = [dict(zip(_INSTANCE_KEYS, (*idt, *vals, hb, sname, sat, nw, st, lo)))
                     for idt, vals, hb, sname, sat, nw, st, lo in rows]
        clusters = self._clusters(groups, group_names, stale[idx], queue[idx], running[idx], backlog[idx], kv[idx], mu[idx],
                                  lam[idx], req_rate[idx], price[idx])
        self._version += 1
        snap = CongestionSnapshot(self._version, now, instances, clusters, self._model_info())
        snap.body = self._encode(snap)
        return snap

    def _clusters(self, gid: np.ndarray, names: list[tuple[str, str]], stale: np.ndarray, queue: np.ndarray, running: np.ndarray,
                  backlog: np.ndarray, kv: np.ndarray, mu: np.ndarray, lam: np.ndarray, req: np.ndarray,
                  price: np.ndarray) -> list[dict[str, Any]]:
        """Per (cluster, model) aggregates over fresh instances, vectorized with bincount."""
        if not len(gid):
            return []
        g = len(names)
        fresh = ~stale

        def tot(a: np.ndarray) -> np.ndarray:
            return np.bincount(gid[fresh], weights=np.nan_to_num(a[fresh], nan=0.0, posinf=0.0), minlength=g)

        n_fresh = np.bincount(gid[fresh], minlength=g)
        n_all = np.bincount(gid, minlength=g)
        q_t, r_t, b_t, mu_t, lam_t, req_t = tot(queue), tot(running), tot(backlog), tot(mu), tot(lam), tot(req)
        kv_ok = fresh & np.isfinite(kv)
        kv_n = np.bincount(gid[kv_ok], minlength=g)
        kv_s = np.bincount(gid[kv_ok], weights=kv[kv_ok], minlength=g)
        p_ok = fresh & np.isfinite(price)
        pmin = np.full(g, np.inf)
        pmax = np.full(g, -np.inf)
        np.minimum.at(pmin, gid[p_ok], price[p_ok])
        np.maximum.at(pmax, gid[p_ok], price[p_ok])
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = utilization(lam_t, mu_t)
            tpr = np.where(req_t > 0, lam_t / req_t, self.config.default_tokens_per_request)
            # Pooled surrogate: the cluster as one server of rate sum(mu) (optimistic for an M/G/c).
            backlog_s = np.where(mu_t > 0, b_t / mu_t, np.nan)
            mean_s = np.where(mu_t > 0, tpr / mu_t, np.nan)
            kv_mean = np.where(kv_n > 0, kv_s / np.maximum(kv_n, 1), np.nan)
        cprice = congestion_price(req_t, mu_t, rho, backlog_s, mean_s, self.params)
        spare = np.where(mu_t > 0, mu_t - lam_t, np.nan)
        cols = [_jsonable(a) for a in (backlog_s, kv_mean, spare, rho, cprice, pmin, pmax)]
        out = []
        for k, (c, mdl) in enumerate(names):
            bs, kvm, sp, rh, cp, lo, hi = (col[k] for col in cols)
            out.append({
                "cluster": c, "model_name": mdl, "instances": int(n_fresh[k]), "stale_instances": int(n_all[k] - n_fresh[k]),
                "queue_length": float(q_t[k]), "running": float(r_t[k]), "backlog_tokens": float(b_t[k]),
                "backlog_seconds": bs, "kv_usage_mean": kvm,
                "service_rate_tokens_per_second": float(mu_t[k]), "arrival_rate_tokens_per_second": float(lam_t[k]),
                "spare_capacity_tokens_per_second": sp, "utilization": rh, "congestion_price_seconds_per_token": cp,
                "min_instance_price": lo, "max_instance_price": hi,
            })
        out.sort(key=lambda d: (d["cluster"], d["model_name"]))
        return out

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

        def add(name: str, ident: InstanceKey, v: Any) -> None:
            if v is None:
                return
            c, mdl, ins = ident
            lbl = [("__name__", name), ("cluster", c), ("model_name", mdl), ("instance", ins)]
            series.append(tuple(sorted((k, x) for k, x in lbl if x != "")))
            values.append(float(v))
            seen.add((name, ident))

        for d in snap.instances:
            ident = (d["cluster"], d["model_name"], d["instance"])
            for name, f in self._INSTANCE_FIELDS.items():
                add(name, ident, d[f])
        for d in snap.clusters:
            ident = (d["cluster"], d["model_name"], "")
            for name, f in self._CLUSTER_FIELDS.items():
                add(name, ident, d[f])
        for name, ident in self._written_keys - seen:
            c, mdl, ins = ident
            lbl = [("__name__", name), ("cluster", c), ("model_name", mdl), ("instance", ins)]
            series.append(tuple(sorted((k, x) for k, x in lbl if x != "")))
            values.append(STALE_NAN)
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
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=5)
        w, self._writer = self._writer, None
        if w is not None:
            w.join(timeout=10)


__all__ = ["CongestionSnapshot", "CongestionTracker"]
