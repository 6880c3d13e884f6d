"""Step answers: a dashboard refresh computes only the steps whose windows touch new data.

A range query's answer at step ``t`` depends only on samples with timestamps ``<= t`` (no negative
offsets, no ``@``). So once every sample up to ``t`` has arrived, the step's answer is final until a
write lands at or before ``t``. Two parts make that reuse exact:

* ``WriteFrontier`` (fed by the summarizer, an ingest sink that sees every accepted batch after
  storage stored it): the newest sample time seen and, for each batch reaching at or below the
  *sealed* frontier (newest time minus ``seal_delay``), its oldest timestamp under a sequence number.
  Live ingest writes ahead of the frontier and logs nothing; late, out-of-order or backfilled batches,
  deletions and restores log where they start.
* ``StepAnswers``: per (tenant, query text, step, step alignment, lookback, approximation), the answers
  of the steps that were sealed when they were computed. A refresh first drops every kept step at or
  after the oldest write logged since the entry was last validated, reuses the rest, and evaluates
  the remaining steps as one range query (through the summaries where they serve). Only steps at or
  before the sealed frontier *taken before the evaluation read storage* are kept, so a write racing
  with the read is either seen by it or logged after it. A key whose steps are not on multiples of
  its step is kept only when it comes a second time (``planner/grid_admission.py``: a client sending
  ``end=now`` never meets its own grid again).

The merged answer equals a fresh evaluation of the whole range (each step is evaluated independently;
tests compare with ``exact=true`` under live, late and out-of-order writes). Memory is bounded
(``planner.step_cache_bytes``, least recently used entries go first). Instant queries are not kept.

Reuse is measured per key like summaries are: its CPU per refresh against evaluating the same steps
whole (a refresh's fixed cost can exceed that on a cheap query), counting the CPU other processes
report for the query (``QueryStats.remote_cpu_seconds``: a cluster querier's ingesters). A key whose
refreshes are not cheaper is evaluated whole for five minutes, then measured again
(``planner.cost_based: false`` always reuses).
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from planner.grid_admission import GridAdmission
from promql.ast_walk import walk
from promql.types import Annotations, QueryResult, QueryStats

NEVER = np.iinfo(np.int64).max
EVERYTHING = np.iinfo(np.int64).min
MAX_LOG = 4096


class WriteFrontier:
    """Sequence-numbered log of writes that reach at or below the sealed frontier."""

    def __init__(self, seal_delay_ms: int):
        self.seal_delay_ms = int(seal_delay_ms)
        self.max_ts: int | None = None
        self.seq = 0
        self._log: deque[tuple[int, int]] = deque()  # (seq, oldest timestamp of the write)
        self._trimmed_to = 0  # entries up to this sequence were forgotten (``trim``)
        self.lock = threading.Lock()

    def sealed_ms(self) -> int:
        """Steps at or before this time have (by the seal delay) received every live sample."""
        with self.lock:
            return EVERYTHING if self.max_ts is None else self.max_ts - self.seal_delay_ms

    def arm(self) -> tuple[int, int]:
        """(sequence, sealed frontier) before a read: later writes at or before a kept step are logged."""
        with self.lock:
            return self.seq, (EVERYTHING if self.max_ts is None else self.max_ts - self.seal_delay_ms)

    def observe(self, min_ts: int, max_ts: int) -> None:
        with self.lock:
            self.seq += 1
            if self.max_ts is not None and min_ts <= self.max_ts - self.seal_delay_ms:
                self._log.append((self.seq, int(min_ts)))
                if len(self._log) > MAX_LOG:
                    self._collapse()
            self.max_ts = int(max_ts) if self.max_ts is None else max(self.max_ts, int(max_ts))

    def invalidate_all(self) -> None:
        """Deleted series, restored or rebuilt data: no kept step stays valid."""
        self.log_write(EVERYTHING)

    def log_write(self, min_ts: int) -> None:
        """A write reaching back to ``min_ts`` that kept steps from there on must not outlive (a
        querier relays its ingesters' logs through this, turboprom/cluster/cluster_frontier.py)."""
        with self.lock:
            self.seq += 1
            self._log.append((self.seq, int(min_ts)))
            if len(self._log) > MAX_LOG:
                self._collapse()

    def oldest_since(self, seq: int) -> int:
        """Oldest timestamp written after ``seq`` at or below the frontier (``NEVER`` when none;
        ``EVERYTHING`` when ``seq`` is older than what the log still holds)."""
        with self.lock:
            if seq < self._trimmed_to:
                return EVERYTHING
            out = NEVER
            for s, t in reversed(self._log):
                if s <= seq:
                    break
                if t < out:
                    out = t
            return out

    def trim(self, oldest_seq: int) -> None:
        """Forget log entries no kept answer can need (all older than ``oldest_seq``)."""
        with self.lock:
            while self._log and self._log[0][0] <= oldest_seq:
                self._log.popleft()
            self._trimmed_to = max(self._trimmed_to, int(oldest_seq))

    def _collapse(self) -> None:
        # conservative: the older half becomes one write as late as its newest entry and as old as its oldest
        half = len(self._log) // 2
        old = [self._log.popleft() for _ in range(half)]
        self._log.appendleft((max(s for s, _ in old), min(t for _, t in old)))


@dataclass
class _Entry:
    ts: np.ndarray  # (T,) kept step times, ascending
    labels: list  # (S,) series labels
    values: np.ndarray  # (S, T)
    present: np.ndarray  # (S, T)
    seq: int  # frontier sequence the kept steps are known valid at
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)
    starts: deque = field(default_factory=lambda: deque(maxlen=16))  # (wall s, query start ms) of recent uses

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.present.nbytes + self.ts.nbytes) + 64 * len(self.labels)


@dataclass
class StepStats:
    queries: int = 0
    steps: int = 0
    reused_steps: int = 0
    computed_steps: int = 0
    invalidated_steps: int = 0
    bypassed_queries: int = 0  # evaluated whole: reuse was measured not cheaper for their key
    unkept_queries: int = 0  # evaluated whole and not kept: a grid off the step's multiples, first seen


@dataclass
class _Cost:
    """Measured CPU of one key's queries: whole evaluations (per step) and refreshes that reused steps.

    Reuse has a fixed cost (the evaluation of the new steps, assembling, keeping); on a cheap query it
    can exceed evaluating every step. Then the key is evaluated whole for ``BYPASS_S`` and measured
    again afterwards (data and load change)."""

    full_per_step: deque = field(default_factory=lambda: deque(maxlen=8))
    warm: deque = field(default_factory=lambda: deque(maxlen=8))  # (CPU s, steps)
    bypass_until: float = 0.0

    MIN_WARM = 3
    BYPASS_S = 300.0

    def reuse_pays(self) -> bool | None:
        """False when the recent refreshes cost no less than evaluating their steps whole; None while
        too few are measured."""
        if len(self.warm) < self.MIN_WARM or not self.full_per_step:
            return None
        per_step = statistics.median(self.full_per_step)
        warm = statistics.median(c for c, _ in self.warm)
        steps = statistics.median(n for _, n in self.warm)
        return warm < per_step * steps


def cacheable(node: Any) -> bool:
    """True when every step's answer depends only on samples at or before the step: no ``@`` and no
    negative offset anywhere in the expression (both read outside ``(.., t]``)."""
    for n in walk(node):
        k = type(n).__name__
        if k in ("VectorSelector", "SubqueryExpr"):
            if getattr(n, "at", None) is not None:
                return False
            off = getattr(n, "offset", None)
            if off is not None and off.total_seconds() < 0:
                return False
    return True


def _members(x: np.ndarray, sorted_ts: np.ndarray) -> np.ndarray:
    """``np.isin(x, sorted_ts)`` for an ascending ``sorted_ts`` (kept steps), without isin's sort."""
    if not len(sorted_ts):
        return np.zeros(len(x), bool)
    pos = np.minimum(np.searchsorted(sorted_ts, x), len(sorted_ts) - 1)
    return sorted_ts[pos] == x


def _kept_infos(infos: list[str]) -> list[str]:
    """PromQL's own infos hold for the kept steps; TurboProm's say how *that* evaluation was served."""
    return [i for i in infos if not i.startswith("TurboProm info:")]


class StepAnswers:
    TRIM_EVERY_S = 1.0  # the write log keeps at most this much more than the entries need

    def __init__(self, frontier: WriteFrontier, max_bytes: int = 256 << 20, measured: bool = True):
        self.frontier = frontier
        self.max_bytes = int(max_bytes)
        self.measured = measured  # False: always reuse (``planner.cost_based: false``), never bypass
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()
        self.stats = StepStats()
        self.costs: OrderedDict[tuple, _Cost] = OrderedDict()  # per key (bounded like the entries)
        self._trimmed_at = 0.0  # when the write log was last trimmed to the oldest entry's sequence
        self.admission = GridAdmission()

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.bytes = 0

    def range_query(self, key: tuple, start: int, end: int, step: int,
                    compute: Callable[[int, int], QueryResult]) -> QueryResult:
        """The answer of ``[start, end]`` at ``step``: kept steps reused, the others from ``compute(s, e)``."""
        steps = np.arange(start, end + 1, step, dtype=np.int64)
        T = len(steps)
        key = key + (step, start % step)
        with self.lock:
            known = key in self.entries
        if not known and not self.admission.admit(key, aligned=start % step == 0):
            with self.lock:
                self.stats.unkept_queries += 1
            return compute(start, end)
        cpu0 = time.thread_time()
        with self.lock:
            cost = self.costs.get(key)
            if cost is None:
                cost = self.costs[key] = _Cost()
                while len(self.costs) > 4 * max(len(self.entries), 256):
                    self.costs.popitem(last=False)
            self.costs.move_to_end(key)
            bypass = cost.bypass_until > time.monotonic()
            if bypass:
                self.stats.bypassed_queries += 1
        if bypass:
            res = compute(start, end)
            cost.full_per_step.append((time.thread_time() - cpu0 + res.stats.remote_cpu_seconds) / max(T, 1))
            return res
        seq, sealed = self.frontier.arm()
        with self.lock:
            e = self.entries.get(key)
            if e is not None:
                self.entries.move_to_end(key)
                self._validate(e, seq)
                have = _members(steps, e.ts)
                e.starts.append((time.time(), start))
            else:
                have = np.zeros(T, bool)
        missing = np.flatnonzero(~have)
        eval_cpu = remote_cpu = 0.0
        if len(missing) == 0:
            res = self._assemble(e, steps, None, np.zeros(0, np.int64))
        else:
            lo, hi = int(steps[missing[0]]), int(steps[missing[-1]])
            c_eval = time.thread_time()
            fresh = compute(lo, hi)
            remote_cpu = fresh.stats.remote_cpu_seconds  # a querier's pushed-down work, done by its ingesters
            eval_cpu = time.thread_time() - c_eval + remote_cpu
            if fresh.result_type != "matrix" or fresh.values is None or fresh.histograms is not None:
                return fresh  # nothing step-shaped to keep (not expected from a range query)
            res = self._assemble(e, steps, fresh, np.arange(lo, hi + 1, step, dtype=np.int64)) if e is not None \
                else fresh
            if any(p.startswith("summary:") for p in fresh.stats.paths):
                # steps a summary answered are kept only once a seal delay past the panes' seal: a
                # summary read right at a pane's seal was seen to differ from raw under live ingest
                # (planner README, known limits); raw-path steps are exact by construction
                sealed -= self.frontier.seal_delay_ms
            self._keep(key, fresh, sealed, seq, start)
        # steps outside the evaluated span [first missing, last missing] came from the kept answers
        reused = int(have[: missing[0]].sum()) + int(have[missing[-1] + 1:].sum()) if len(missing) else T
        with self.lock:
            self.stats.queries += 1
            self.stats.steps += T
            self.stats.reused_steps += reused
            self.stats.computed_steps += T - reused
        if reused:  # exact, so silent in the answer (as Prometheus would answer); stated in stats and the log
            res.stats.paths.append(f"steps:reused:{reused}/{T}")
        # a whole evaluation is measured by the evaluation alone; a refresh by all it cost
        self._measure(key, cost, e is None, T, reused, eval_cpu if e is None else time.thread_time() - cpu0 + remote_cpu)
        return res

    def _measure(self, key: tuple, cost: _Cost, whole: bool, steps: int, reused: int, cpu_s: float) -> None:
        if whole:  # no entry: every step evaluated
            cost.full_per_step.append(cpu_s / max(steps, 1))
            return
        if not reused:
            return
        cost.warm.append((cpu_s, steps))
        if self.measured and cost.reuse_pays() is False:
            cost.bypass_until = time.monotonic() + cost.BYPASS_S
            cost.warm.clear()
            with self.lock:  # measured again after the bypass, from a whole evaluation
                old = self.entries.pop(key, None)
                if old is not None:
                    self.bytes -= old.nbytes

    # --- internals --------------------------------------------------------------------------------
    def _validate(self, e: _Entry, seq: int) -> None:
        """Drop kept steps at or after the oldest write logged since ``e.seq``; then valid as of ``seq``."""
        oldest = self.frontier.oldest_since(e.seq)
        if oldest != NEVER:
            keep = e.ts < oldest
            n = int((~keep).sum())
            if n:
                self.stats.invalidated_steps += n
                before = e.nbytes
                e.ts, e.values, e.present = e.ts[keep], e.values[:, keep], e.present[:, keep]
                self.bytes += e.nbytes - before
        e.seq = max(e.seq, seq) if oldest == NEVER else seq

    def _assemble(self, e: _Entry, steps: np.ndarray, fresh: QueryResult | None, fresh_ts: np.ndarray) -> QueryResult:
        """Columns of ``steps``: from ``fresh`` where it has them, else from the kept entry."""
        T = len(steps)
        with self.lock:
            e_ts, e_labels, e_vals, e_pres = e.ts, list(e.labels), e.values, e.present
            warnings, infos = list(e.warnings), list(e.infos)
        labels: list = list(e_labels)
        index: dict = {l: i for i, l in enumerate(labels)}
        f_rows = np.zeros(0, np.int64)
        if fresh is not None:
            f_rows = np.empty(len(fresh.labels), np.int64)
            for i, l in enumerate(fresh.labels):
                j = index.get(l)
                if j is None:
                    j = index[l] = len(labels)
                    labels.append(l)
                f_rows[i] = j
        S = len(labels)
        vals = np.zeros((S, T))
        pres = np.zeros((S, T), bool)
        if len(e_ts):
            pos = np.searchsorted(e_ts, steps)
            ok = (pos < len(e_ts)) & (e_ts[np.minimum(pos, len(e_ts) - 1)] == steps)
            cols = np.flatnonzero(ok)
            src = pos[cols]
            rows = np.arange(len(e_labels))
            vals[np.ix_(rows, cols)] = e_vals[:, src]
            pres[np.ix_(rows, cols)] = e_pres[:, src]
        ann = Annotations()
        for w in warnings:
            ann.warn(w)
        for i in infos:
            ann.info(i)
        stats = QueryStats()
        if fresh is not None:
            fc = np.searchsorted(steps, fresh_ts)
            vals[:, fc] = 0.0
            pres[:, fc] = False
            if len(f_rows):
                vals[np.ix_(f_rows, fc)] = fresh.values
                pres[np.ix_(f_rows, fc)] = fresh.present
            for w in fresh.annotations.warnings:
                ann.warn(w)
            for i in fresh.annotations.infos:
                ann.info(i)
            stats = fresh.stats
        keep = np.flatnonzero(pres.any(axis=1))
        order = sorted(keep.tolist(), key=lambda i: labels[i])
        oa = np.asarray(order, np.int64)
        out_p = pres[oa] if len(oa) else np.zeros((0, T), bool)
        out_v = np.where(out_p, vals[oa], 0.0) if len(oa) else np.zeros((0, T))
        return QueryResult("matrix", labels=[labels[i] for i in order], values=out_v, present=out_p, timestamps=steps,
                           annotations=ann, stats=stats)

    def _keep(self, key: tuple, fresh: QueryResult, sealed: int, seq: int, start: int) -> None:
        """Keep the sealed steps of ``fresh`` (computed from a read after ``arm() == (seq, sealed)``)."""
        ts = np.asarray(fresh.timestamps, np.int64)
        sel = ts <= sealed
        if not sel.any():
            return
        n_ts, n_vals, n_pres = ts[sel], fresh.values[:, sel], fresh.present[:, sel]
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                e = _Entry(n_ts, list(fresh.labels), n_vals.copy(), n_pres.copy(), seq,
                           list(fresh.annotations.warnings), _kept_infos(fresh.annotations.infos))
                e.starts.append((time.time(), start))
                self.entries[key] = e
                self.bytes += e.nbytes
            else:
                before = e.nbytes
                e.seq = min(e.seq, seq)  # the new columns are known valid only from their own read on
                self._merge(e, list(fresh.labels), n_ts, n_vals, n_pres)
                for w in fresh.annotations.warnings:
                    if w not in e.warnings:
                        e.warnings.append(w)
                for i in _kept_infos(fresh.annotations.infos):
                    if i not in e.infos:
                        e.infos.append(i)
                self._trim(e)
                self.bytes += e.nbytes - before
            while self.bytes > self.max_bytes and self.entries:
                _, old = self.entries.popitem(last=False)
                self.bytes -= old.nbytes
            now = time.monotonic()
            if self.entries and now - self._trimmed_at >= self.TRIM_EVERY_S:
                # a pass over every entry: not per query (one-off grids make thousands of entries)
                self._trimmed_at = now
                self.frontier.trim(min(x.seq for x in self.entries.values()))

    @staticmethod
    def _merge(e: _Entry, labels: list, ts: np.ndarray, vals: np.ndarray, pres: np.ndarray) -> None:
        index = {l: i for i, l in enumerate(e.labels)}
        new = [l for l in labels if l not in index]
        for l in new:
            index[l] = len(e.labels)
            e.labels.append(l)
        all_ts = np.union1d(e.ts, ts)
        S, T = len(e.labels), len(all_ts)
        v = np.zeros((S, T))
        p = np.zeros((S, T), bool)
        old_c = np.searchsorted(all_ts, e.ts)
        r_old = np.arange(e.values.shape[0])
        v[np.ix_(r_old, old_c)] = e.values
        p[np.ix_(r_old, old_c)] = e.present
        new_c = np.searchsorted(all_ts, ts)
        v[:, new_c] = 0.0
        p[:, new_c] = False
        rows = np.fromiter((index[l] for l in labels), np.int64, count=len(labels))
        if len(rows):
            v[np.ix_(rows, new_c)] = vals
            p[np.ix_(rows, new_c)] = pres
        e.ts, e.values, e.present = all_ts, v, p

    @staticmethod
    def _trim(e: _Entry) -> None:
        """Keep the steps recent uses of the entry still ask for (the oldest start of the last 10 min)."""
        now = time.time()
        starts = [s for w, s in e.starts if now - w < 600]
        if not starts:
            return
        keep = e.ts >= min(starts)
        if not keep.all():
            e.ts, e.values, e.present = e.ts[keep], e.values[:, keep], e.present[:, keep]
        rows = e.present.any(axis=1)
        if not rows.all():
            idx = np.flatnonzero(rows)
            e.labels = [e.labels[i] for i in idx.tolist()]
            e.values, e.present = e.values[idx], e.present[idx]

    def describe(self) -> dict[str, Any]:
        with self.lock:
            st = self.stats
            return {"entries": len(self.entries), "bytes": self.bytes, "max_bytes": self.max_bytes,
                    "queries": st.queries, "steps": st.steps, "reused_steps": st.reused_steps,
                    "computed_steps": st.computed_steps, "invalidated_steps": st.invalidated_steps,
                    "bypassed_queries": st.bypassed_queries, "unkept_queries": st.unkept_queries,
                    "bypassed_keys": sum(1 for c in self.costs.values() if c.bypass_until > time.monotonic()),
                    "reuse_ratio": round(st.reused_steps / st.steps, 4) if st.steps else 0.0}
