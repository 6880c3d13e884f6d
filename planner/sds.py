"""SDS (summary data structure): scope + algorithm + params + pane width + payload per series per pane.

* scope: a metric name plus label matchers (all series matching them), optionally a grouping label
  list (informational: grouping is applied above the summary, so one SDS serves every grouping);
* algorithm: ``exact`` (moments + counter panes: sum/count/avg/min/max/stddev/stdvar/last/first/
  present_over_time, rate/increase/delta/resets/changes, all exact) or ``kll`` (quantile_over_time,
  rank error ``rank_error(k)``);
  or ``req`` (quantile_over_time with phi >= ``min_phi``, default 0.9: REQ high-rank-accuracy sketch,
  rank error ``req_rank_error(k, phi)``, shrinking with 1 - phi);
  or ``group`` (an SDS with a grouping and a fixed scope: one payload per group per pane, merged across
  the group's series; serves ``sum/max/min by (L) (sum/count/max/min_over_time(x{scope}[w]))`` exactly,
  see ``planner/group_store.py``) or ``cpc`` (distinct label tuples / active series over a window:
  one CPC sketch per pane, ``planner/distinct_store.py``) or ``fi`` (top-k label tuples by sample count:
  one frequent-items sketch per pane, served only when the top-k set is provable, ``planner/topk_store.py``);
* pane width: tumbling panes aligned to the epoch;
* coverage: panes [cov_lo, cov_hi) are complete (backfilled history + sealed live panes).

Payloads live in memory as dense arrays (exact) or sketches (kll); ``planner/persist.py`` writes
sealed panes to Parquet and the catalog to DuckDB.
"""
from __future__ import annotations

import functools
import hashlib
import statistics
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from planner.algorithm_registry import algorithm
from planner.late_samples import fold_late_sketch, rebuild_exact
from planner.served_functions import REQ_MIN_PHI
from promql.eval_context import SeriesScope
from storage.labels import Labels
from storage.matchers import Matcher

_READ_FOLD = threading.local()


def read_fold_seconds() -> tuple[float, float]:
    """(wall s, CPU s) this thread has spent, in ``SDS.coverage``, folding samples that arrived before
    the read (the summarizer's queue and an SDS's buffer). That is summarization work, counted in the
    plan's ingest CPU; the rewrite leaves it out of what serving from the summary cost, so it is not
    counted twice and a read that happened to fold a queue is not measured slower than raw for it."""
    return getattr(_READ_FOLD, "wall", 0.0), getattr(_READ_FOLD, "cpu", 0.0)


@dataclass(frozen=True)
class SDSSpec:
    metric: str
    algorithm: str  # "exact" | "kll" | "req" | "group" | "cpc" | "fi"
    pane_ms: int = 60_000
    matchers: tuple[tuple[str, str, str], ...] = ()  # extra scope matchers (name, op, value)
    params: tuple[tuple[str, Any], ...] = ()  # e.g. (("k", 200),)
    grouping: tuple[str, ...] = ()

    @functools.cached_property  # read per batch by the summarizer: hashed once
    def id(self) -> str:
        raw = f"{self.metric}|{self.algorithm}|{self.pane_ms}|{self.matchers}|{self.params}"
        if self.grouping:  # only group SDSs hold a grouping in their payload (older ids unchanged)
            raw += f"|{self.grouping}"
        return f"{self.algorithm}-{self.metric}-{hashlib.sha1(raw.encode()).hexdigest()[:8]}"

    def scope_matchers(self) -> list[Matcher]:
        return [Matcher("__name__", "=", self.metric)] + [Matcher(n, o, v) for n, o, v in self.matchers]

    def param(self, name: str, default: Any) -> Any:
        return dict(self.params).get(name, default)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        d["matchers"] = [f'{n}{o}"{v}"' for n, o, v in self.matchers]
        d["params"] = dict(self.params)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SDSSpec":
        ms = []
        for m in d.get("matchers", []):
            if isinstance(m, (list, tuple)):
                ms.append(tuple(m))
            else:  # 'name="value"' style
                for op in ("!~", "=~", "!=", "="):
                    if op in m:
                        n, v = m.split(op, 1)
                        ms.append((n.strip(), op, v.strip().strip('"')))
                        break
        return cls(metric=d["metric"], algorithm=d.get("algorithm", "exact"), pane_ms=int(d.get("pane_ms", 60_000)),
                   matchers=tuple(ms), params=tuple(sorted(dict(d.get("params", {})).items())),
                   grouping=tuple(d.get("grouping", ())))


class SeriesRegistry:
    """Series in an SDS's scope <-> dense local ids (per-series Python, cached by labels)."""

    def __init__(self, scope: Sequence[Matcher]):
        self.scope = list(scope)
        self.labels: list[Labels] = []
        self.index: dict[Labels, int] = {}
        self._in_scope: dict[Labels, bool] = {}
        self._match_cache: dict[tuple, tuple[int, np.ndarray]] = {}
        self.lock = threading.Lock()

    def in_scope(self, lbl: Labels) -> bool:
        hit = self._in_scope.get(lbl)
        if hit is None:
            d = dict(lbl)
            hit = all(m.matches(d.get(m.name, "")) for m in self.scope)
            self._in_scope[lbl] = hit
        return hit

    def sid(self, lbl: Labels) -> int:
        s = self.index.get(lbl)
        if s is None:
            with self.lock:
                s = self.index.get(lbl)
                if s is None:
                    s = len(self.labels)
                    self.labels.append(lbl)
                    self.index[lbl] = s
        return s

    def match(self, matchers: Sequence[Matcher], scope: SeriesScope | None = None) -> np.ndarray:
        """Local ids of registered series matching all matchers and kept by ``scope`` (the series an
        evaluation is restricted to, e.g. a cluster ingester's asked partitions); cached per registry
        size."""
        key = (tuple(matchers), None if scope is None else scope.key)
        n = len(self.labels)
        hit = self._match_cache.get(key)
        if hit is not None and hit[0] == n:
            return hit[1]
        if scope is not None:
            arr = self.match(matchers)
            arr = arr[scope.keep(self.labels, arr)] if len(arr) else arr
        else:
            out = [i for i, lbl in enumerate(self.labels[:n])
                   if all(m.matches(dict(lbl).get(m.name, "")) for m in matchers)]
            arr = np.asarray(out, dtype=np.int64)
        self._match_cache[key] = (n, arr)
        return arr


@dataclass
class SDSStats:
    hits: int = 0
    windows_served: int = 0
    saved_samples: int = 0  # raw samples the summary path did not read
    raw_edge_samples: int = 0
    last_hit: float = 0.0
    created: float = field(default_factory=time.time)
    ingest_cpu_s: float = 0.0  # live folds (and late rebuilds): what the plan costs while it exists
    ingested_samples: int = 0
    backfill_cpu_s: float = 0.0  # the one-time fill of its history from storage (a sunk cost: never a reason to retire)
    backfilled_samples: int = 0
    late_dropped: int = 0  # late samples that could not be folded (no raw storage to rebuild exact panes from)
    late_folded: int = 0  # late samples folded into their panes (sketches) or whose panes were rebuilt (exact)
    late_rebuilt_samples: int = 0  # raw samples re-read to rebuild exact panes after late samples
    # shadow runs (the canary): (served wall s, served CPU s, raw wall s, raw CPU s) of the same sub-tree
    shadow: deque = field(default_factory=lambda: deque(maxlen=64))
    shadow_runs: int = 0
    serving_since: float = 0.0  # when the summary first answered a reader (0: not yet)
    # the same per shape of use (function, range, steps bucket): (time, served wall s, raw wall s)
    shapes: dict = field(default_factory=dict)
    # served sub-trees per shape of use: the measured saving is each shape's own, times its hits (a
    # shape measured slower is answered raw from then on and stops adding hits)
    shape_hits: dict = field(default_factory=dict)

    # shapes of use whose last summary answer fell outside the exactness bound (moment sums out of the
    # float range or cancelling): shape -> time; answered raw for SHAPE_TTL_S, then tried again
    imprecise: dict = field(default_factory=dict)
    # the last verdict each shape of use had (kept after its runs age out): a shape last measured faster
    # keeps being served while it is measured again; any other is answered raw while it is measured
    known: dict = field(default_factory=dict)

    SHAPE_TTL_S = 900.0  # a shape's verdict is re-measured after this long (data and load change)
    SHAPE_MIN_RUNS = 3
    # "faster" before SHAPE_MIN_RUNS runs when every run so far was faster by this factor in wall *and*
    # CPU time: a 24 h panel refreshed once a minute otherwise waits three minutes (three raw answers)
    # for a summary measured ten times faster on its first run; the remaining runs still come (the
    # shape keeps being measured until it has SHAPE_MIN_RUNS) and the full medians decide from then on.
    # Not "slower": a summary path's first run in a shape pays for cold caches (series matches, merged
    # sketches) the raw path it is compared with does not, and a shape measured slower is not measured
    # again before its runs age out
    SHAPE_DECISIVE = 2.0

    def refuse(self, shape: tuple) -> None:
        """The summary could not answer ``shape`` within the exactness bound just now."""
        self.imprecise[shape] = time.time()

    def refused(self, shape: tuple) -> bool:
        t = self.imprecise.get(shape)
        return t is not None and time.time() - t < self.SHAPE_TTL_S

    def hit(self, shape: tuple) -> None:
        """One sub-tree served from the summary in ``shape``."""
        if not self.hits:
            self.serving_since = time.time()
        self.hits += 1
        self.shape_hits[shape] = self.shape_hits.get(shape, 0) + 1

    def record(self, shape: tuple, served_wall: float, served_cpu: float, raw_wall: float, raw_cpu: float) -> None:
        self.shadow.append((served_wall, served_cpu, raw_wall, raw_cpu))
        self.shapes.setdefault(shape, deque(maxlen=16)).append((time.time(), served_wall, raw_wall, served_cpu, raw_cpu))
        v = self.verdict(shape)
        if v is not None:
            self.known[shape] = v

    def _recent(self, shape: tuple) -> list[tuple[float, float, float]]:
        d = self.shapes.get(shape)
        if not d:
            return []
        now = time.time()
        return [x for x in d if now - x[0] < self.SHAPE_TTL_S]

    def verdict(self, shape: tuple) -> str | None:
        """"faster" / "slower" than raw for this shape of use (medians of its recent shadow runs), or,
        while fewer than ``SHAPE_MIN_RUNS`` are known, "faster" if those are decisive (``_decisive``) or
        None.

        "slower" needs the summary's median wall time *and* its median CPU time at or above the raw
        path's. The two halves of a shadow pair run at different moments (the served one on the query's
        thread, the raw one later on the canary's), so on a busy machine their wall times also measure
        whatever else ran then; CPU time measures the work itself. A summary that does less work than
        the raw path is not retired on a wall-clock difference the load made, and one that does more
        work and is no faster goes."""
        r = self._recent(shape)
        if not r:
            return None
        if len(r) < self.SHAPE_MIN_RUNS:
            return self._decisive(r)
        # statistics.median: on these few values it is ~100x cheaper than numpy's, and this runs on
        # every query the summary could serve
        slower_wall = statistics.median([x[1] for x in r]) >= statistics.median([x[2] for x in r])
        slower_cpu = statistics.median([x[3] for x in r]) >= statistics.median([x[4] for x in r])
        return "slower" if slower_wall and slower_cpu else "faster"

    def _decisive(self, runs: list[tuple]) -> str | None:
        """The verdict of fewer runs than a full one needs: "faster" when every run's summary path took
        at most 1/SHAPE_DECISIVE of the raw path's wall and CPU time, else None."""
        k = self.SHAPE_DECISIVE
        return "faster" if all(x[1] * k <= x[2] and x[3] * k <= x[4] for x in runs) else None

    def shape_medians(self) -> dict[str, tuple[float, float, float, float]]:
        """Per shape of use with a verdict: medians of its recent runs (served wall s, raw wall s,
        served CPU s, raw CPU s)."""
        out = {}
        for sh in list(self.shapes):
            r = self._recent(sh)
            if len(r) >= self.SHAPE_MIN_RUNS:
                out[shape_label(sh)] = tuple(statistics.median(x[i] for x in r) for i in (1, 2, 3, 4))
        return out

    def shapes_in_measurement(self) -> int:
        """Shapes of use seen lately whose shadow runs are still too few for a verdict."""
        return sum(1 for sh in list(self.shapes) if 0 < len(self._recent(sh)) < self.SHAPE_MIN_RUNS)

    def needs_probe(self, shape: tuple) -> bool:
        return len(self._recent(shape)) < self.SHAPE_MIN_RUNS

    def measuring(self, shape: tuple) -> bool:
        """Whether ``shape`` is answered raw while the summary path is measured beside it: its recent runs
        are too few for a verdict and its last verdict (if it had one) was not "faster". A new shape of
        use is never answered from the summary before the summary has been measured faster than raw in
        it, so a plan slower than raw in some shape never makes a reader wait for the measurement."""
        return self.needs_probe(shape) and self.known.get(shape) != "faster"

    def measured(self) -> dict[str, Any] | None:
        """Medians of the shadow runs (the summary path against the raw path, same sub-tree and steps),
        the measured CPU saving and the verdict per shape of use.

        The saving is summed per shape of use: its shadow pairs' mean CPU saving times the sub-trees
        served in that shape (a shape without pairs of its own gets the mean over all pairs), less the
        summarization CPU. One mean over every pair times all hits would charge a plan for the cheap
        refresh shapes it stopped serving once they measured slower (each keeps its probe pairs) and
        retire a plan whose remaining shapes pay."""
        if not self.shadow:
            return None
        a = np.asarray(self.shadow, dtype=np.float64)
        med = np.median(a, axis=0)
        overall = float(np.mean(a[:, 3] - a[:, 1]))
        saved = 0.0
        counted = 0
        for sh, n in list(self.shape_hits.items()):
            pairs = self.shapes.get(sh)
            per = statistics.fmean(x[4] - x[3] for x in pairs) if pairs else overall
            saved += per * n
            counted += n
        saved += overall * max(self.hits - counted, 0)  # hits not attributed to a shape (restored stats)
        shapes = {shape_label(s): self.verdict(s) for s in list(self.shapes)}
        return {"runs": len(a), "served_p50_s": float(med[0]), "served_cpu_p50_s": float(med[1]),
                "raw_p50_s": float(med[2]), "raw_cpu_p50_s": float(med[3]),
                "cpu_saved_s": saved - self.ingest_cpu_s, "shapes": shapes}


def shape_label(shape: tuple[str, int, int]) -> str:
    return f"{shape[0]}[{shape[1] // 1000}s] ~{1 << (2 * shape[2])} steps"


def shape_of(func: str, range_ms: int, steps: int) -> tuple[str, int, int]:
    """A shape of use of a summary: the function, its range and the number of steps (by powers of 4),
    which is what decides whether the summary beats the raw path."""
    return (func, int(range_ms), max(int(steps), 1).bit_length() // 2)


class SDS:
    def __init__(self, spec: SDSSpec, pinned: bool = False, reason: str = ""):
        self.spec = spec
        self.pinned = pinned
        self.reason = reason
        self.registry = SeriesRegistry(spec.scope_matchers())
        self.algorithm = algorithm(spec.algorithm)  # the registry entry (planner/algorithm_registry.py)
        self.store: Any = self.algorithm.make_store(spec)
        # Live panes start at live_from; history [cov_lo, live_from) is backfilled from raw storage.
        self.live_from: int | None = None
        self.cov_lo: int | None = None
        # the history this plan keeps behind its newest sample (``trim``); None: all it has
        self.history_ms: int | None = None
        self._trimmed_to_ms = np.iinfo(np.int64).min  # live ingest folds nothing older (``fold_floor_ms``)
        self.max_ts: int = np.iinfo(np.int64).min
        self.seal_delay_ms = 0
        self.backfill_total = 0
        self.backfill_done = 0
        self.backfill_state = "pending"
        self.stats = SDSStats()
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_n = 0
        self._pending_kmin: int | None = None
        self._held: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # see ``offer``
        self._held_n = 0
        self._flushed_k = np.iinfo(np.int64).min  # newest pane among the samples folded so far
        self._flush_lock = threading.RLock()
        self.flush_cpu_s = 0.0  # CPU of every fold of buffered samples (the summarizer reads it around a batch)
        self.raw_source: Any = None  # raw storage (set by the summarizer): exact panes hit by late samples are rebuilt from it
        # set by the summarizer: folds what it queued when a sample older than the given time waits
        self.before_read: Callable[[int], None] | None = None

    FLUSH_SAMPLES = 50_000
    HELD_MAX = 4_000_000  # samples held below the fold floor while a backfill runs (beyond: dropped, counted)

    def offer(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, arrival_floor: Any = None) -> None:
        """Live samples of this SDS's series (stale markers removed). Those at or above the fold floor
        are buffered. Older ones that arrive while the backfill runs are held until the backfill has
        read past them (``widen``): its storage read of their range may have been taken just before
        they were stored, and the floor only reaches them once that chunk is folded. Only for payloads
        rebuilt from storage (an idempotent refold); order-independent payloads would count twice a
        sample the backfill did read, so there they are left to the backfill as before; for them the
        floor is the one the samples met on arrival (``arrival_floor``, one or per sample, when the
        summarizer queued them), as the backfill may have read them since."""
        with self._flush_lock:
            floor = self.fold_floor_ms()
            if floor is None:
                return
            if arrival_floor is not None and self.algorithm.order_independent:
                floor = arrival_floor
            up = ts >= floor
            if up.all():
                self.buffer(sid, ts, vals)
                return
            if up.any():
                self.buffer(sid[up], ts[up], vals[up])
            if self.backfill_state in ("pending", "running") and not self.algorithm.order_independent:
                down = ~up
                n = int(down.sum())
                if self._held_n + n > self.HELD_MAX:
                    self.stats.late_dropped += n
                    return
                self._held.append((sid[down], ts[down], vals[down]))
                self._held_n += n

    def widen(self, cov_lo: int) -> None:
        """The backfill has folded panes from ``cov_lo`` on: widen coverage and fold the held samples
        the floor now reaches (as late samples: exact panes are rebuilt from storage, which has them)."""
        with self._flush_lock:
            self.cov_lo = cov_lo
            self._release_held()

    def end_backfill(self, state: str) -> None:
        """The backfill stopped (``done``, ``stopped`` or ``failed``): held samples the floor reaches are
        folded; the rest are older than the history this SDS keeps."""
        with self._flush_lock:
            self.backfill_state = state
            self._release_held()
            self._held, self._held_n = [], 0

    def _release_held(self) -> None:
        if not self._held:
            return
        floor = self.fold_floor_ms()
        sid = np.concatenate([h[0] for h in self._held])
        ts = np.concatenate([h[1] for h in self._held])
        vals = np.concatenate([h[2] for h in self._held])
        up = ts >= floor if floor is not None else np.zeros(len(ts), bool)
        self._held = [(sid[~up], ts[~up], vals[~up])] if (~up).any() else []
        self._held_n = int((~up).sum())
        if up.any():
            self.buffer(sid[up], ts[up], vals[up])
            self.flush_pending()

    def buffer(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
        """Queue live samples (any order); folded in bulk by ``flush_pending``."""
        P = self.spec.pane_ms
        kmax = int(ts.max()) // P
        with self._flush_lock:
            self._pending.append((sid, ts, vals))
            self._pending_n += len(ts)
            kmin = int(ts.min()) // P
            self._pending_kmin = kmin if self._pending_kmin is None else min(self._pending_kmin, kmin)
            # fold when the stream reaches a pane newer than any folded so far (late samples ride along
            # to the next such flush instead of forcing one per batch), or the buffer is full
            crossed = kmax > self._flushed_k
            if self._pending_n >= self.FLUSH_SAMPLES or crossed:
                self.flush_pending()

    def fold_floor_ms(self) -> int | None:
        """Oldest sample time live ingest may fold: the live start, or below it the history the
        backfill has already folded (a late sample there is folded / rebuilt; older ones are left to
        the running backfill, which reads raw storage)."""
        if self.live_from is None:
            return None
        if self.cov_lo is None:
            return self.live_from
        return max(min(self.live_from, self.cov_lo * self.spec.pane_ms), self._trimmed_to_ms)

    TRIM_MIN_PANES = 64  # panes past the history before a trim runs (each one clears sketch caches)

    def trim(self) -> int:
        """Forget panes older than the history this plan keeps (``history_ms`` behind its newest
        sample), so a plan's payload stays the size of its history however long the server runs
        (it grew by a day's panes a day until the storage budget retired it, and the next recurrence
        adopted and backfilled it again). Coverage starts at the first kept pane; windows reaching
        further back read raw edges there, as before the backfill reached them. Returns panes dropped."""
        if (self.history_ms is None or self.cov_lo is None or self.backfill_state not in ("done", "restored")
                or self.max_ts == np.iinfo(np.int64).min):
            return 0
        P = self.spec.pane_ms
        keep = int((self.max_ts - self.history_ms) // P)
        if keep - self.cov_lo < self.TRIM_MIN_PANES:
            return 0
        with self._flush_lock:
            n = keep - self.cov_lo
            self.cov_lo = keep
            self._trimmed_to_ms = keep * P
            self.store.drop_before(keep)
        return n

    def flush_pending(self) -> None:
        """Fold queued live samples into the panes: sort by (series, time); samples newer than each
        series' last folded one continue its chain (one bulk ``ingest_sorted``); late samples (older
        than that, or older than the live start) are folded order-independently into sketch panes, or
        rebuild the exact panes they touch from raw storage (``planner/late_samples.py``). A sample
        equal in time to the last folded one is a duplicate storage did not store again."""
        with self._flush_lock:
            if not self._pending:
                return
            t0 = time.thread_time()
            parts, self._pending, self._pending_n, self._pending_kmin = self._pending, [], 0, None
            sid = np.concatenate([p[0] for p in parts])
            ts = np.concatenate([p[1] for p in parts])
            vals = np.concatenate([p[2] for p in parts])
            self._flushed_k = max(self._flushed_k, int(ts.max()) // self.spec.pane_ms)
            order = np.lexsort((ts, sid))
            sid, ts, vals = sid[order], ts[order], vals[order]
            live_from = self.live_from if self.live_from is not None else np.iinfo(np.int64).min
            floor = self.fold_floor_ms()
            floor = live_from if floor is None else floor
            dup = np.zeros(len(ts), bool)
            dup[1:] = (sid[1:] == sid[:-1]) & (ts[1:] == ts[:-1])
            if self.algorithm.scope == "fixed":  # payloads per group / item: every sample folds as is
                keep = ~dup & (ts >= floor)
                self.store.ingest_sorted(sid[keep], ts[keep], vals[keep], live=True)
                n_keep = int(keep.sum())
                self.stats.late_folded += int((keep & (ts < live_from)).sum())
                dt = time.thread_time() - t0
                self.stats.ingest_cpu_s += dt
                self.flush_cpu_s += dt
                self.stats.ingested_samples += n_keep
                return
            with self.store.lock:
                last = self.store.last_t[sid]
                ok = (ts > last) & (ts >= live_from) & ~dup
                late = ((ts < last) | (ts < live_from)) & (ts >= floor) & ~dup
                self.store.ingest_sorted(sid[ok], ts[ok], vals[ok], live=True)
            n_ok, n_late = int(ok.sum()), int(late.sum())
            if n_late:
                self._fold_late(sid[late], ts[late], vals[late])
            dt = time.thread_time() - t0
            self.stats.ingest_cpu_s += dt
            self.flush_cpu_s += dt
            self.stats.ingested_samples += n_ok

    def _fold_late(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
        if self.algorithm.order_independent:
            fold_late_sketch(self.store, sid, ts, vals)
            self.stats.late_folded += len(ts)
            self.stats.ingested_samples += len(ts)
            return
        floor = self.fold_floor_ms()
        if self.raw_source is None or floor is None:
            self.stats.late_dropped += len(ts)
            return
        self.stats.late_rebuilt_samples += rebuild_exact(self, self.raw_source, sid, ts, floor)
        self.stats.late_folded += len(ts)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def metric(self) -> str:
        return self.spec.metric

    def error_bound(self, phi: float | None = None) -> str:
        return self.algorithm.bound(self, phi)

    def relative_bound(self) -> float:
        """Stated relative error of a cpc distinct count (3 RSE) / an fi count (epsilon of the window)."""
        f = self.algorithm.relative_error
        if f is None:
            raise ValueError(f"{self.spec.algorithm} states no relative count error")
        return f(self.store)

    def rank_bound(self, phi: float) -> float:
        """Stated normalized rank error at ``phi`` (sketch algorithms)."""
        f = self.algorithm.rank_error
        if f is None:
            raise ValueError(f"{self.spec.algorithm} states no rank error")
        return f(self.store, phi)

    @property
    def min_phi(self) -> float:
        return float(self.spec.param("min_phi", REQ_MIN_PHI))

    def coverage(self) -> tuple[int, int]:
        """Complete panes [lo, hi) usable for queries.

        Taken under the fold lock: a fold in flight has already moved its samples out of the buffer,
        so checking the buffer alone would let a read see panes the fold has not reached yet."""
        w0, c0 = time.perf_counter(), time.thread_time()
        if self.before_read is not None and self.live_from is not None:
            # batches the summarizer still queues: folded first when one holds a sample of a pane this
            # read would take as sealed (newer samples only seal panes once folded); outside the lock
            P = self.spec.pane_ms
            self.before_read(max((self.max_ts - self.seal_delay_ms) // P, self.live_from // P) * P)
        with self._flush_lock:
            # panes about to be read must hold every buffered sample (flushing only those of sealed
            # panes measured faster but let live answers differ from raw: not done)
            self.flush_pending()
            max_ts = self.max_ts
        _READ_FOLD.wall = getattr(_READ_FOLD, "wall", 0.0) + time.perf_counter() - w0
        _READ_FOLD.cpu = getattr(_READ_FOLD, "cpu", 0.0) + time.thread_time() - c0
        if self.live_from is None or self.cov_lo is None:
            return 0, 0
        sealed = (max_ts - self.seal_delay_ms) // self.spec.pane_ms  # panes before this are sealed
        # panes before the live start were filled by backfill from storage: complete once backfilled
        sealed = max(sealed, self.live_from // self.spec.pane_ms)
        return self.cov_lo, int(max(min(sealed, 1 << 60), self.cov_lo))

    def nbytes(self) -> int:
        return self.store.nbytes()

    def serves(self, func: str) -> bool:
        """Whether this SDS's store can answer ``func`` (e.g. an exact plan adopted for ``rate`` keeps no
        min / max fields, so ``max_over_time`` goes raw or to a wider plan)."""
        return self.algorithm.serves(self.store, func)

    def register(self, labels: list[Labels]) -> np.ndarray:
        found = list(map(self.registry.index.get, labels))  # known series (nearly all): one C-level pass
        if None in found:
            sid = self.registry.sid
            found = [sid(l) if i is None else i for i, l in zip(found, labels)]
        ids = np.array(found, dtype=np.int64) if found else np.zeros(0, np.int64)
        # under the store's lock: growing reallocates the per-series arrays, and a fold running in
        # another ingest thread (or the backfill) would write into the old ones and be lost
        with self.store.lock:
            self.store.ensure_series(len(self.registry.labels))
            self.store.assign(ids, labels)  # fixed-scope stores: series -> group / item (new series only)
        return ids

    def describe(self) -> dict[str, Any]:
        lo, hi = self.coverage()
        P = self.spec.pane_ms
        return {
            **self.spec.to_json(),
            "pinned": self.pinned,
            "reason": self.reason,
            "error_bound": self.error_bound(),
            "series": len(self.registry.labels),
            "bytes": self.nbytes(),
            "coverage": {"from_ms": lo * P, "to_ms": hi * P, "panes": max(hi - lo, 0)},
            "backfill": {"state": self.backfill_state, "done_panes": self.backfill_done, "total_panes": self.backfill_total},
            "hits": self.stats.hits,
            "windows_served": self.stats.windows_served,
            "saved_samples": self.stats.saved_samples,
            "raw_edge_samples": self.stats.raw_edge_samples,
            "ingest_cpu_seconds": round(self.stats.ingest_cpu_s, 6),
            "backfill_cpu_seconds": round(self.stats.backfill_cpu_s, 6),
            "ingested_samples": self.stats.ingested_samples,
            "late_dropped": self.stats.late_dropped,
            "late_folded": self.stats.late_folded,
            "late_rebuilt_samples": self.stats.late_rebuilt_samples,
            "measured": self.stats.measured(),
        }
