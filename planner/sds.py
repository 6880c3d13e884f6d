"""SDS (summary data structure): scope + algorithm + params + pane width + payload per series per pane.

* scope: a metric name plus label matchers (all series matching them), optionally a grouping label
  list (informational: grouping is applied above the summary, so one SDS serves every grouping);
* algorithm: ``exact`` (moments + counter panes: sum/count/avg/min/max/stddev/stdvar/last/first/
  present_over_time, rate/increase/delta/resets/changes, all exact) or ``kll`` (quantile_over_time,
  rank error ``rank_error(k)``);
* pane width: tumbling panes aligned to the epoch;
* coverage: panes [cov_lo, cov_hi) are complete (backfilled history + sealed live panes).

Payloads live in memory as dense arrays (exact) or sketches (kll); ``planner/persist.py`` writes
sealed panes to Parquet and the catalog to DuckDB.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from planner.exact_store import ExactPaneStore
from planner.kll_store import DEFAULT_K, KLLPaneStore, rank_error
from storage.labels import Labels, metric_name
from storage.matchers import Matcher

EXACT_FUNCS = {
    "sum_over_time", "count_over_time", "avg_over_time", "min_over_time", "max_over_time",
    "stddev_over_time", "stdvar_over_time", "last_over_time", "first_over_time", "present_over_time",
    "rate", "increase", "delta", "resets", "changes",
}
KLL_FUNCS = {"quantile_over_time"}
ALGORITHMS = ("exact", "kll")


def algorithm_for(func: str) -> str | None:
    if func in EXACT_FUNCS:
        return "exact"
    if func in KLL_FUNCS:
        return "kll"
    return None


@dataclass(frozen=True)
class SDSSpec:
    metric: str
    algorithm: str  # "exact" | "kll"
    pane_ms: int = 60_000
    matchers: tuple[tuple[str, str, str], ...] = ()  # extra scope matchers (name, op, value)
    params: tuple[tuple[str, Any], ...] = ()  # e.g. (("k", 200),)
    grouping: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        raw = f"{self.metric}|{self.algorithm}|{self.pane_ms}|{self.matchers}|{self.params}"
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

    def match(self, matchers: Sequence[Matcher]) -> np.ndarray:
        """Local ids of registered series matching all matchers (cached per registry size)."""
        key = tuple(matchers)
        n = len(self.labels)
        hit = self._match_cache.get(key)
        if hit is not None and hit[0] == n:
            return hit[1]
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
    ingest_cpu_s: float = 0.0
    ingested_samples: int = 0
    late_dropped: int = 0  # live samples not newer than the series' last one (out of order / concurrent)


class SDS:
    def __init__(self, spec: SDSSpec, pinned: bool = False, reason: str = ""):
        self.spec = spec
        self.pinned = pinned
        self.reason = reason
        self.registry = SeriesRegistry(spec.scope_matchers())
        if spec.algorithm == "exact":
            self.store: Any = ExactPaneStore(spec.pane_ms)
        elif spec.algorithm == "kll":
            self.store = KLLPaneStore(spec.pane_ms, int(spec.param("k", DEFAULT_K)))
        else:
            raise ValueError(f"unknown SDS algorithm {spec.algorithm!r}")
        # Live panes start at live_from; history [cov_lo, live_from) is backfilled from raw storage.
        self.live_from: int | None = None
        self.cov_lo: int | None = None
        self.max_ts: int = np.iinfo(np.int64).min
        self.seal_delay_ms = 0
        self.backfill_total = 0
        self.backfill_done = 0
        self.backfill_state = "pending"
        self.stats = SDSStats()
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_n = 0
        self._pending_kmin: int | None = None
        self._flush_lock = threading.RLock()

    FLUSH_SAMPLES = 50_000

    def buffer(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
        """Queue live samples (any order); folded in bulk by ``flush_pending``."""
        P = self.spec.pane_ms
        kmax = int(ts.max()) // P
        with self._flush_lock:
            self._pending.append((sid, ts, vals))
            self._pending_n += len(ts)
            kmin = int(ts.min()) // P
            self._pending_kmin = kmin if self._pending_kmin is None else min(self._pending_kmin, kmin)
            crossed = kmax > self._pending_kmin
            if self._pending_n >= self.FLUSH_SAMPLES or crossed:
                self.flush_pending()

    def flush_pending(self) -> None:
        """Fold queued live samples into the panes: sort by (series, time), keep only samples newer
        than each series' last folded one (storage's in-order rule), then one bulk ``ingest_sorted``."""
        with self._flush_lock:
            if not self._pending:
                return
            t0 = time.thread_time()
            parts, self._pending, self._pending_n, self._pending_kmin = self._pending, [], 0, None
            sid = np.concatenate([p[0] for p in parts])
            ts = np.concatenate([p[1] for p in parts])
            vals = np.concatenate([p[2] for p in parts])
            order = np.lexsort((ts, sid))
            sid, ts, vals = sid[order], ts[order], vals[order]
            with self.store.lock:
                ok = ts > self.store.last_t[sid]
                ok[1:] &= ~((sid[1:] == sid[:-1]) & (ts[1:] == ts[:-1]))
                self.store.ingest_sorted(sid[ok], ts[ok], vals[ok], live=True)
            n_ok = int(ok.sum())
            self.stats.ingest_cpu_s += time.thread_time() - t0
            self.stats.ingested_samples += n_ok
            self.stats.late_dropped += len(ok) - n_ok

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def metric(self) -> str:
        return self.spec.metric

    def error_bound(self) -> str:
        if self.spec.algorithm == "kll":
            return f"rank error <= {rank_error(self.store.k):.4f} (99% confidence)"
        return "exact"

    def coverage(self) -> tuple[int, int]:
        """Complete panes [lo, hi) usable for queries."""
        if self._pending_n:
            self.flush_pending()  # panes about to be read must hold every buffered sample
        if self.live_from is None or self.cov_lo is None:
            return 0, 0
        sealed = (self.max_ts - self.seal_delay_ms) // self.spec.pane_ms  # panes before this are sealed
        # panes before the live start were filled by backfill from storage: complete once backfilled
        sealed = max(sealed, self.live_from // self.spec.pane_ms)
        return self.cov_lo, int(max(min(sealed, 1 << 60), self.cov_lo))

    def nbytes(self) -> int:
        return self.store.nbytes()

    def register(self, labels: list[Labels]) -> np.ndarray:
        ids = np.fromiter((self.registry.sid(l) for l in labels), dtype=np.int64, count=len(labels))
        self.store.ensure_series(len(self.registry.labels))
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
            "ingested_samples": self.stats.ingested_samples,
            "late_dropped": self.stats.late_dropped,
        }


def in_metric_scope(lbl: Labels, metric: str) -> bool:
    return metric_name(lbl) == metric
