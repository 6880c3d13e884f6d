"""The congestion tracker's slot table: series -> slots (rows of per-series state) and instances.

Each series is resolved once in its life to a *slot*: metric name -> schema signal
(``schema.SIGNAL_BY_SAMPLE_NAME``), identity labels -> instance; irrelevant series map to -1. Batches
from the ingest pipeline carry storage's series ids, so a known series costs one numpy gather in a
table indexed by id (one storage feeds one tracker); batches without ids (fast scrape, pushed load)
go through a label-set cache. New series are the only per-series Python.

``update`` is the per-sample path, all numpy: drop samples not newer than their slot's, per-slot
increments (counter resets handled), one EWMA rate update per slot (a fast and a 6x slower window),
newest value per slot, newest sample time per instance. ``columns`` gathers what the model reads.
Instances silent past a limit are dropped with their slots (``drop_silent``).

Not thread-safe: the tracker holds its lock around every call.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from scheduler_metrics.congestion.queueing import ewma_alpha
from scheduler_metrics.schema import COUNTER_SIGNALS, MODEL_LABELS, SIGNAL_BY_SAMPLE_NAME, SIGNAL_COMBINE, Signal
from storage.batch import SampleBatch
from storage.labels import METRIC_NAME, Labels
from storage.stale import is_stale

SIGNALS: tuple[Signal, ...] = tuple(Signal)
SIG_INDEX: dict[Signal, int] = {s: i for i, s in enumerate(SIGNALS)}
NSIG = len(SIGNALS)
IS_COUNTER = np.array([s in COUNTER_SIGNALS for s in SIGNALS])
IS_MEAN = np.array([SIGNAL_COMBINE.get(s) == "mean" for s in SIGNALS])
LORA = SIG_INDEX[Signal.LORA_INFO]
MISS = -2  # cache sentinel: not resolved yet
SLOW_FACTOR = 6.0  # slow-rate window = SLOW_FACTOR x rate_window

InstanceKey = tuple[str, str, str]  # (cluster, model, instance)


def instance_key(labels: Labels) -> InstanceKey:
    d = dict(labels)
    model = ""
    for name in MODEL_LABELS:
        if d.get(name):
            model = d[name]
            break
    return (d.get("cluster", ""), model, d.get("instance", ""))


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


@dataclass
class SlotColumns:
    """What the model reads of the table, one row per slot in use (copies, safe outside the lock)."""

    n: int  # instance ids in use: [0, n)
    slots: np.ndarray  # slot numbers of the rows
    sig: np.ndarray  # signal index
    inst: np.ndarray  # instance id
    scale: np.ndarray
    val: np.ndarray  # newest value
    rate: np.ndarray  # bias-corrected fast EWMA rate
    rate_slow: np.ndarray  # bias-corrected slow EWMA rate
    rate_ok: np.ndarray  # both rates have seen an interval
    valid: np.ndarray  # newest sample finite and not a stale marker
    newest: np.ndarray  # per instance id: newest sample time (ms), -1 none
    keys: list[InstanceKey | None]  # per instance id (None: a free id)
    stacks: list[str]  # per instance id: the serving stack its metrics name


class SlotTable:
    def __init__(self, rate_window_s: float, max_cache_entries: int):
        self.rate_window_s = rate_window_s
        self.max_cache_entries = max_cache_entries
        self.cache: dict[Labels, int] = {}
        self.sid_slot = np.full(1024, MISS, np.int32)  # storage series id -> slot (-1 irrelevant)
        cap = 64
        self.slot_sig = np.full(cap, -1, np.int16)
        self.slot_inst = np.full(cap, -1, np.int32)
        self.slot_scale = np.ones(cap, np.float64)
        self.last_ts = np.full(cap, -1, np.int64)
        self.last_val = np.full(cap, np.nan, np.float64)
        self.rate = np.zeros(cap, np.float64)
        self.rate_slow = np.zeros(cap, np.float64)  # 6x longer window: workload mix (tokens/request)
        # Bias-corrected EWMAs (value / weight, both starting at 0): early estimates are plain
        # averages of what was seen instead of being anchored to the first observation.
        self.rate_w = np.zeros(cap, np.float64)
        self.rate_slow_w = np.zeros(cap, np.float64)
        self.valid = np.zeros(cap, bool)
        self.slot_labels: list[Labels | None] = [None] * cap
        self.free_slots: list[int] = []
        self.nslots = 0
        icap = 16
        self.inst_ids: dict[InstanceKey, int] = {}
        self.inst_keys: list[InstanceKey | None] = [None] * icap
        self.inst_stack: list[str] = [""] * icap
        self.inst_newest = np.full(icap, -1, np.int64)
        self.inst_slots: list[set[int]] = [set() for _ in range(icap)]
        # model state per instance, carried between builds: busy-time service rate, peak throughput
        self.mu_busy = np.full(icap, np.nan, np.float64)
        self.peak_tps = np.zeros(icap, np.float64)
        self.free_insts: list[int] = []
        self.ninst = 0
        self.inst_version = 0  # bumped when an instance is added or dropped

    # --- resolution ---------------------------------------------------------------------------------
    def slots_of(self, batch: SampleBatch) -> np.ndarray:
        """Slot (or -1) of every entry of ``batch.series``. With storage's series ids the lookup is one
        numpy gather, each id resolved once in its life; without them (batches that did not go through
        storage: the fast scrape, pushed load, tests) a label-set cache lookup."""
        sids = batch.series_ids
        if sids is None:
            cache = self.cache
            smap = np.fromiter((cache.get(lbl, MISS) for lbl in batch.series), np.int64, len(batch.series))
            for i in np.flatnonzero(smap == MISS).tolist():
                smap[i] = self.resolve(batch.series[i])
            return smap
        top = int(sids.max()) + 1 if len(sids) else 0
        if top > len(self.sid_slot):
            grown = np.full(max(top, 2 * len(self.sid_slot)), MISS, np.int32)
            grown[: len(self.sid_slot)] = self.sid_slot
            self.sid_slot = grown
        smap = self.sid_slot[sids].astype(np.int64)
        misses = np.flatnonzero(smap == MISS)
        if len(misses):
            cache = self.cache
            for i in misses.tolist():
                lbl = batch.series[i]
                slot = cache.get(lbl, MISS)
                smap[i] = self.resolve(lbl, remember_irrelevant=False) if slot == MISS else slot
            self.sid_slot[sids[misses]] = smap[misses]
        return smap

    def resolve(self, labels: Labels, remember_irrelevant: bool = True) -> int:
        """Slot for a series seen for the first time (-1: not a congestion signal). Irrelevant series
        stay out of the label cache when the caller keeps them by series id."""
        if len(self.cache) >= self.max_cache_entries:
            # Bound memory: forget irrelevant entries; relevant ones stay (they own slots).
            self.cache = {k: v for k, v in self.cache.items() if v >= 0}
        name = ""
        for k, v in labels:
            if k == METRIC_NAME:
                name = v
                break
        src = SIGNAL_BY_SAMPLE_NAME.get(name)
        if src is None:
            if remember_irrelevant:
                self.cache[labels] = -1
            return -1
        key = instance_key(labels)
        inst = self.inst_ids.get(key)
        if inst is None:
            inst = self._new_instance(key)
        if src.stack != "turboprom" and not self.inst_stack[inst]:
            self.inst_stack[inst] = src.stack
        slot = self._new_slot()
        self.slot_sig[slot] = SIG_INDEX[src.signal]
        self.slot_inst[slot] = inst
        self.slot_scale[slot] = src.scale
        self.slot_labels[slot] = labels
        self.inst_slots[inst].add(slot)
        self.cache[labels] = slot
        return slot

    def _new_slot(self) -> int:
        if self.free_slots:
            s = self.free_slots.pop()
        else:
            s = self.nslots
            self.nslots += 1
            if s >= len(self.slot_sig):
                grow = len(self.slot_sig)
                self.slot_sig = np.concatenate([self.slot_sig, np.full(grow, -1, np.int16)])
                self.slot_inst = np.concatenate([self.slot_inst, np.full(grow, -1, np.int32)])
                self.slot_scale = np.concatenate([self.slot_scale, np.ones(grow)])
                self.last_ts = np.concatenate([self.last_ts, np.full(grow, -1, np.int64)])
                self.last_val = np.concatenate([self.last_val, np.full(grow, np.nan)])
                self.rate = np.concatenate([self.rate, np.zeros(grow)])
                self.rate_slow = np.concatenate([self.rate_slow, np.zeros(grow)])
                self.rate_w = np.concatenate([self.rate_w, np.zeros(grow)])
                self.rate_slow_w = np.concatenate([self.rate_slow_w, np.zeros(grow)])
                self.valid = np.concatenate([self.valid, np.zeros(grow, bool)])
                self.slot_labels.extend([None] * grow)
        self.last_ts[s] = -1
        self.last_val[s] = np.nan
        self.rate[s] = 0.0
        self.rate_slow[s] = 0.0
        self.rate_w[s] = 0.0
        self.rate_slow_w[s] = 0.0
        self.valid[s] = False
        return s

    def _new_instance(self, key: InstanceKey) -> int:
        if self.free_insts:
            i = self.free_insts.pop()
        else:
            i = self.ninst
            self.ninst += 1
            if i >= len(self.inst_newest):
                grow = len(self.inst_newest)
                self.inst_keys.extend([None] * grow)
                self.inst_stack.extend([""] * grow)
                self.inst_newest = np.concatenate([self.inst_newest, np.full(grow, -1, np.int64)])
                self.inst_slots.extend(set() for _ in range(grow))
                self.mu_busy = np.concatenate([self.mu_busy, np.full(grow, np.nan)])
                self.peak_tps = np.concatenate([self.peak_tps, np.zeros(grow)])
        self.inst_ids[key] = i
        self.inst_keys[i] = key
        self.inst_version += 1
        self.inst_stack[i] = ""
        self.inst_newest[i] = -1
        self.inst_slots[i] = set()
        self.mu_busy[i] = np.nan
        self.peak_tps[i] = 0.0
        return i

    # --- the per-sample path ------------------------------------------------------------------------
    def update(self, sl: np.ndarray, ts: np.ndarray, vs: np.ndarray) -> None:
        """Columnar state update for relevant samples (slots ``sl``)."""
        stale = is_stale(vs)
        # Order by (slot, time); keep only samples newer than what the slot already has.
        order = np.lexsort((ts, sl))
        sl, ts, vs, stale = sl[order], ts[order], vs[order], stale[order]
        newer = ts > self.last_ts[sl]
        if not newer.all():
            sl, ts, vs, stale = sl[newer], ts[newer], vs[newer], stale[newer]
        if len(sl) == 0:
            return
        last_of_group = np.empty(len(sl), bool)  # (np.r_ costs more than the update on a scrape's batch)
        np.not_equal(sl[1:], sl[:-1], out=last_of_group[:-1])
        last_of_group[-1] = True
        # Stale marker as a slot's newest sample: the series ended (e.g. target down).
        lsl = sl[last_of_group]
        lts = ts[last_of_group]
        ended = stale[last_of_group]
        self.valid[lsl] = ~ended
        # Rates from finite samples only.
        ok = np.isfinite(vs)
        if not ok.all():
            sl, ts, vs = sl[ok], ts[ok], vs[ok]
        if len(sl):
            first = np.empty(len(sl), bool)
            first[0] = True
            np.not_equal(sl[1:], sl[:-1], out=first[1:])
            starts = np.flatnonzero(first)
            gsl = sl[starts]
            prev_v = np.empty(len(vs))
            prev_v[0] = np.nan
            prev_v[1:] = vs[:-1]
            prev_t = np.empty(len(ts), np.int64)
            prev_t[0] = -1
            prev_t[1:] = ts[:-1]
            prev_v[starts] = self.last_val[gsl]
            prev_t[starts] = self.last_ts[gsl]
            has_prev = np.isfinite(prev_v) & (prev_t >= 0)
            inc = vs - prev_v
            counter = IS_COUNTER[self.slot_sig[sl]]
            reset = counter & (vs < prev_v)
            inc = np.where(reset, vs, inc)
            inc = np.where(has_prev, inc, 0.0)
            inc_sum = np.add.reduceat(inc, starts)
            ends = np.empty(len(starts), np.int64)
            ends[:-1] = starts[1:] - 1
            ends[-1] = len(sl) - 1
            span_start = np.where(has_prev[starts], prev_t[starts], ts[starts])
            dt_ms = ts[ends] - span_start
            got = dt_ms > 0
            if got.any():
                g = gsl[got]
                inst_rate = inc_sum[got] / (dt_ms[got] / 1000.0)
                alpha = ewma_alpha(dt_ms[got] / 1000.0, self.rate_window_s)
                self.rate[g] += alpha * (inst_rate - self.rate[g])
                self.rate_w[g] += alpha * (1.0 - self.rate_w[g])
                alpha = ewma_alpha(dt_ms[got] / 1000.0, SLOW_FACTOR * self.rate_window_s)
                self.rate_slow[g] += alpha * (inst_rate - self.rate_slow[g])
                self.rate_slow_w[g] += alpha * (1.0 - self.rate_slow_w[g])
            self.last_val[gsl] = vs[ends]
        self.last_ts[lsl] = lts
        np.maximum.at(self.inst_newest, self.slot_inst[lsl], lts)

    # --- what the model reads -----------------------------------------------------------------------
    def columns(self) -> SlotColumns:
        n, k = self.ninst, self.nslots
        used = self.slot_sig[:k] >= 0
        w = self.rate_w[:k][used]
        ws = self.rate_slow_w[:k][used]
        rate_ok = (w > 0) & (ws > 0)
        val = self.last_val[:k][used]
        return SlotColumns(
            n=n, slots=np.flatnonzero(used), sig=self.slot_sig[:k][used].astype(np.int64),
            inst=self.slot_inst[:k][used].astype(np.int64), scale=self.slot_scale[:k][used], val=val,
            rate=self.rate[:k][used] / np.where(rate_ok, w, 1.0),
            rate_slow=self.rate_slow[:k][used] / np.where(rate_ok, ws, 1.0), rate_ok=rate_ok,
            valid=self.valid[:k][used] & np.isfinite(val), newest=self.inst_newest[:n].copy(),
            keys=list(self.inst_keys[:n]), stacks=list(self.inst_stack[:n]))

    def lora_by_instance(self, c: SlotColumns) -> dict[int, dict[str, Any]]:
        """Instance id -> LoRA info from its current ``vllm:lora_requests_info`` series: of the live
        ones, the one with the newest value (vLLM sets it to the time of the change; older adapter
        sets stay exported beside it), as the Gateway API Inference Extension's picker reads it."""
        m = (c.sig == LORA) & c.valid
        if not m.any():
            return {}
        ls, li, lv = c.slots[m], c.inst[m], c.val[m]
        o = np.lexsort((lv, li))
        ls, li, lv = ls[o], li[o], lv[o]
        last = np.r_[li[1:] != li[:-1], True]
        return {i: {**lora_info(self.slot_labels[s]), "updated_at": v}
                for i, s, v in zip(li[last].tolist(), ls[last].tolist(), lv[last].tolist())}

    # --- forgetting -----------------------------------------------------------------------------------
    def drop_silent(self, limit_ms: float) -> list[InstanceKey]:
        """Forget instances whose newest sample is older than ``limit_ms``; returns their keys. The
        storage id -> slot map is cleared for all their slots in one pass, however many go at once."""
        newest = self.inst_newest[: self.ninst]
        gone = np.flatnonzero((newest >= 0) & (newest < limit_ms)).tolist()
        if not gone:
            return []
        freed: list[int] = []
        dropped: list[InstanceKey] = []
        for i in gone:
            key = self.inst_keys[i]
            if key is None:
                continue
            for s in self.inst_slots[i]:
                lbl = self.slot_labels[s]
                if lbl is not None:
                    self.cache.pop(lbl, None)
                self.slot_labels[s] = None
                freed.append(s)
            self.inst_slots[i] = set()
            del self.inst_ids[key]
            self.inst_keys[i] = None
            self.inst_newest[i] = -1
            self.free_insts.append(i)
            self.inst_version += 1
            dropped.append(key)
        if freed:
            fs = np.asarray(freed, np.int64)
            self.slot_sig[fs] = -1
            self.slot_inst[fs] = -1
            self.valid[fs] = False
            self.free_slots.extend(freed)
            is_freed = np.zeros(self.nslots, bool)
            is_freed[fs] = True
            mapped = self.sid_slot >= 0
            hit = np.zeros(len(self.sid_slot), bool)
            hit[mapped] = is_freed[self.sid_slot[mapped]]
            self.sid_slot[hit] = MISS
        return dropped
