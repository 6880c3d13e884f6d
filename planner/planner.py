"""The planner: learns recurring work from the query log, adopts / retires SDSs, explains queries.

* ``observe(entry, candidates)`` is called for every evaluated query. Per SDS key (metric, algorithm)
  it keeps arrival times, raw CPU and shape; when the key arrives ``min_count`` times within
  ``period_s``, has recurred (a query text of it came again, or its arrivals span ``BURST_S``: one
  dashboard load's panels are not recurrences) and the cost model says it pays, the SDS is adopted
  (live ingest + background backfill of ``history`` from raw storage). One SDS per (metric, algorithm) serves every matcher subset,
  range, step, quantile and grouping.
* Operators pin plans in config (``planner: {pinned: [{metric, algorithm, pane}]}``); pinned plans
  are never retired. Unpinned plans without hits for ``retire_after_s`` are retired, and the least
  used are retired first when the storage budget is exceeded.

Config (``ctx.config.raw["planner"]``), all optional::

    planner:
      enabled: true
      approximate: false      # sketches (KLL, REQ, CPC, frequent items) may answer; default: exact answers only
      tenants: {team-a: {approximate: true}}   # per-tenant override of approximate
      min_count: 3            # recurrences ...
      period: 10m             # ... within this period
      pane: 1m
      history: 1d             # backfill horizon at most (2x the widest span queried, at least 2x the largest range);
                              # a plan keeps that much behind its newest sample and drops older panes (SDS.trim)
      max_history: 8d
      budget: 512MB
      retire_after: 1h
      seal_delay: 10s         # panes seal this long after the newest sample passes them
      canary_fraction: 0.05
      cost_based: true        # per sub-tree: use a summary only where it beats the raw path
      measure_first: true     # a shape of use (function, range, steps) is answered raw until its summary path,
                              # run beside it, has been measured faster (false: served while being measured)
      req_min_phi: 0.9        # quantile_over_time(phi >= this) adopts a REQ SDS (tail quantiles), else KLL
      cpc_min_series: 10000   # distinct-count patterns adopt a CPC SDS from this many series in scope
      group_min_series: 1000  # sum/max/min by (L) (..._over_time) adopt cross-series group panes from this many
      fi_min_series: 10000    # topk(k, sum by (L) (count_over_time)) adopts a frequent-items SDS from this many
      step_cache_bytes: 256MB # answers of sealed steps reused by refreshes (0: every step evaluated each time)
      summary_cost_prior: 0.0015  # seconds (or a duration): a served query's CPU on a plan until shadow runs
                              # measured one, plus 3 us per series of the plan; lower adopts small patterns sooner
      pinned: [{metric: foo_total, algorithm: exact}, {metric: lat, algorithm: kll, params: {k: 200}}]
"""
from __future__ import annotations

import logging
import math
import re
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


import numpy as np

from planner import cost_model, pane_prefix
from planner.algorithm_registry import ALGORITHMS, allowed
from planner.exact_store import ALL_FIELDS, stored_fields
from planner.normalize import Candidate, normalize
from planner.query_log import LogEntry, QueryLog
from planner.rewrite_rules import WHY_NO_SDS, Decision, RewriteContext, candidates, edge_fraction, rules_for, worth_it
from planner.sds import REQ_MIN_PHI, SDS, SDSSpec
from planner.served_functions import SERVED, algorithm_for
from planner.summarizer import Summarizer
from planner.window import plan_windows
from promql.ast_walk import children
from promql.eval_context import EvalContext
from promql.query_guard import parse as guarded_parse
from promql.types import Annotations, QueryStats
from storage.labels import DEFAULT_TENANT
from storage.matchers import Matcher

log = logging.getLogger("turboprom.planner")


_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000, "y": 365 * 86_400_000}
_DUR_RX = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_duration_ms(text: str) -> int:
    """Prometheus duration (``1h30m``, ``10s``) or plain seconds, in ms."""
    t = text.strip()
    try:
        return int(float(t) * 1000)
    except ValueError:
        pass
    parts = _DUR_RX.findall(t)
    if not parts or "".join(a + b for a, b in parts) != t:
        raise ValueError(f"invalid duration {text!r}")
    return sum(int(a) * _UNITS[b] for a, b in parts)


def _dur(v: Any, default: int) -> int:
    if v is None:
        return default
    if isinstance(v, (int, float)):
        return int(v * 1000)
    return parse_duration_ms(str(v))


def _seconds(v: Any, default: float, name: str) -> float:
    """A time in seconds: a YAML number (``0.0015``) or a Prometheus duration (``2ms``); >= 0."""
    if v is None:
        return default
    if isinstance(v, bool):
        raise ValueError(f"planner.{name} must be a number of seconds or a duration, got {v!r}")
    try:
        x = float(v) if isinstance(v, (int, float)) else parse_duration_ms(str(v)) / 1000.0
    except ValueError as e:
        raise ValueError(f"planner.{name}: {e}") from None
    if not x >= 0.0:
        raise ValueError(f"planner.{name} must not be negative, got {v!r}")
    return x


def _bool(d: dict[str, Any], name: str, default: bool) -> bool:
    """A YAML boolean; anything else (``"false"`` quoted, ``maybe``, 1) is refused with a message
    naming the field, so a typo never leaves a feature in the state the operator did not ask for."""
    v = d.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ValueError(f"planner.{name} must be true or false, got {v!r}")
    return v


def _number(d: dict[str, Any], name: str, default: Any, kind: type) -> Any:
    """A YAML number (``kind`` int or float; an int is a float too); a string, boolean or anything else
    is refused with a message naming the field."""
    v = d.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise ValueError(f"planner.{name} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    return kind(v)


def _size(v: Any, default: int) -> int:
    if v is None:
        return default
    if isinstance(v, (int, float)):
        return int(v)
    t = str(v).strip().upper()
    for u, m in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10), ("B", 1)):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(t)


@dataclass
class PlannerConfig:
    enabled: bool = True
    approximate: bool = False  # approximate algorithms may answer (else only exact ones: equal to raw within 1e-9)
    tenant_approximate: dict[str, bool] = field(default_factory=dict)
    min_count: int = 3
    period_ms: int = 600_000
    pane_ms: int = 60_000
    history_ms: int = 86_400_000
    max_history_ms: int = 8 * 86_400_000
    budget_bytes: int = 512 << 20
    retire_after_ms: int = 3_600_000
    seal_delay_ms: int = 10_000
    canary_fraction: float = 0.05
    background_backfill: bool = True
    cost_based: bool = True  # per sub-tree choice of summary vs raw (False: summary whenever it covers)
    measure_first: bool = True  # new shapes of use answered raw until the summary is measured faster in them
    req_min_phi: float = REQ_MIN_PHI  # quantile_over_time phi from which REQ (tail quantiles) is adopted
    cpc_min_series: int = 10_000  # below this many series, exact per-series panes serve distinct counts exactly
    group_min_series: int = 1_000  # below this many series, per-series exact panes (shared) serve group sums
    fi_min_series: int = 10_000  # below this many series, top-k by count stays on group / per-series panes
    step_cache_bytes: int = 256 << 20  # answers of sealed steps kept for refreshes (planner/step_answers.py); 0: off
    # the summary path's CPU per served query until shadow runs have measured one (cost_model.summary_prior_s)
    summary_cost_prior_s: float = cost_model.DEFAULT_SUMMARY_FIXED_S
    pinned: list[dict[str, Any]] = field(default_factory=list)

    def approximate_for(self, tenant: str) -> bool:
        """Whether approximate algorithms may answer this tenant's queries when the request does not say."""
        return self.tenant_approximate.get(tenant, self.approximate)

    @classmethod
    def from_raw(cls, d: dict[str, Any] | None) -> "PlannerConfig":
        d = d or {}
        if not isinstance(d, dict):
            raise ValueError("planner must be a mapping of settings")
        unknown = sorted(set(d) - _KNOWN_KEYS)
        if unknown:
            raise ValueError(f"planner: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_KNOWN_KEYS))})")
        c = cls()
        c.enabled = _bool(d, "enabled", True)
        c.approximate = _bool(d, "approximate", False)
        tenants = d.get("tenants") or {}
        if not isinstance(tenants, dict):
            raise ValueError("planner.tenants must map tenant names to {approximate: true|false}")
        for name, t in tenants.items():
            if not isinstance(t, dict) or set(t) - {"approximate"}:
                raise ValueError(f"planner.tenants.{name}: only 'approximate: true|false' may be set per tenant")
            c.tenant_approximate[str(name)] = _bool(t, "approximate", c.approximate)
        c.min_count = _number(d, "min_count", c.min_count, int)
        c.period_ms = _dur(d.get("period"), c.period_ms)
        c.pane_ms = _dur(d.get("pane"), c.pane_ms)
        c.history_ms = _dur(d.get("history"), c.history_ms)
        c.max_history_ms = _dur(d.get("max_history"), c.max_history_ms)
        c.budget_bytes = _size(d.get("budget"), c.budget_bytes)
        c.retire_after_ms = _dur(d.get("retire_after"), c.retire_after_ms)
        c.seal_delay_ms = _dur(d.get("seal_delay"), c.seal_delay_ms)
        c.canary_fraction = _number(d, "canary_fraction", c.canary_fraction, float)
        c.background_backfill = _bool(d, "background_backfill", True)
        c.cost_based = _bool(d, "cost_based", True)
        c.measure_first = _bool(d, "measure_first", True)
        c.req_min_phi = _number(d, "req_min_phi", REQ_MIN_PHI, float)
        c.cpc_min_series = _number(d, "cpc_min_series", c.cpc_min_series, int)
        c.group_min_series = _number(d, "group_min_series", c.group_min_series, int)
        c.fi_min_series = _number(d, "fi_min_series", c.fi_min_series, int)
        c.step_cache_bytes = _size(d.get("step_cache_bytes"), c.step_cache_bytes)
        c.summary_cost_prior_s = _seconds(d.get("summary_cost_prior"), c.summary_cost_prior_s, "summary_cost_prior")
        if not 0.0 < c.req_min_phi <= 1.0:
            raise ValueError(f"planner.req_min_phi must be in (0, 1], got {c.req_min_phi}")
        c.pinned = list(d.get("pinned", []) or [])
        if c.pane_ms <= 0:
            raise ValueError("planner.pane must be positive")
        return c


def _for_series(measured: list[tuple[float, int]], series: int, prior: float) -> float:
    """A per-plan cost for a plan over ``series`` series from costs measured on live plans, as (cost,
    that plan's series): the cheapest measured on a plan no bigger; when every measured plan is bigger,
    the cheapest of them scaled down by the series count (the newest step of a refresh read from a
    1,449-series histogram plan, ~11 ms of CPU, says ~0.6 ms for 75 series, not 11: raw edges, panes
    and folds are per series), at least the prior or the cheapest measured. The prior while nothing
    is measured."""
    if not measured:
        return prior
    smaller = [cost for cost, n in measured if n <= series]
    if smaller:
        return min(smaller)
    scaled = min(cost * max(series, 1) / max(n, 1) for cost, n in measured)
    return max(scaled, min(prior, min(cost for cost, _ in measured)))


PANE_CHOICES_MS = (60_000, 30_000, 20_000, 15_000, 10_000, 5_000)  # divisors of a minute, coarsest first

_KNOWN_KEYS = frozenset({
    "enabled", "approximate", "tenants", "min_count", "period", "pane", "history", "max_history", "budget",
    "retire_after", "seal_delay", "canary_fraction", "background_backfill", "cost_based", "measure_first", "req_min_phi",
    "cpc_min_series", "group_min_series", "fi_min_series", "pinned", "step_cache_bytes", "summary_cost_prior",
})


def refreshed_steps(paths: list[str]) -> int:
    """Steps a refresh evaluated (``steps:reused:N/T`` in its paths: T - N), or 0 for a query that reused
    no step answer, reused them all, or was answered from a summary."""
    if any(p.startswith("summary:") for p in paths):
        return 0
    for p in paths:
        if p.startswith("steps:reused:"):
            n, _, t = p[len("steps:reused:"):].partition("/")
            try:
                return max(int(t) - int(n), 0)
            except ValueError:
                return 0
    return 0


@dataclass
class KeyStats:
    arrivals: deque = field(default_factory=deque)  # arrival times (s)
    raw_cpu: deque = field(default_factory=lambda: deque(maxlen=64))
    max_range_ms: int = 0
    max_span_ms: int = 0  # widest data span a query read (its range plus its window)
    min_range_ms: int = 0  # shortest window seen: the pane must fit in it (several times) for the summary to pay
    align_ms: int = 0  # gcd of the windows' bounds seen (ends, steps, ranges): a pane dividing it needs no raw edges
    windows: deque = field(default_factory=lambda: deque(maxlen=64))
    # refreshes the step answers shortened (some steps reused, some evaluated raw): their CPU and
    # windows, and per recent raw-path arrival whether it was one (True) or a whole evaluation (False)
    refresh_cpu: deque = field(default_factory=lambda: deque(maxlen=64))
    refresh_windows: deque = field(default_factory=lambda: deque(maxlen=64))
    kinds: deque = field(default_factory=lambda: deque(maxlen=64))
    series: int = 0
    sample_rate: float = 0.0  # samples per second of data, estimated from raw scans
    patterns: set = field(default_factory=set)
    funcs: set = field(default_factory=set)  # the functions seen: what an exact plan's panes must serve
    last_decision: str = ""
    # whether the pattern has recurred, not only arrived: a query text of it came again, or an arrival
    # came BURST_S or more after the first. A dashboard's first load brings every panel on a metric at
    # once (four CPU panels: four arrivals within a second), all whole evaluations; adopting on those
    # took their cost for the pattern's, while its refreshes compute a step or two each
    recurred: bool = False
    # default-path query texts seen (bounded: past EXPRS_MAX every text counts as seen). A text's first
    # evaluation is a panel's first load, with nothing to reuse: not a whole evaluation that says how
    # the pattern recurs (a pan or a bypass of the step answers)
    exprs: set = field(default_factory=set)
    EXPRS_MAX = 256
    # (start, end, step) ms of the latest default-path range query: the step grid the rewrite's cost
    # check will judge a plan's raw edges on (``Planner._grid_edges``)
    grid: tuple[int, int, int] | None = None
    # after an estimate refused the key on cost, arrivals do not estimate it again before this time
    # (``Planner.RECONSIDER_S``) unless the arrivals have grown to ``reconsider_arrivals`` meanwhile
    reconsider_at: float = 0.0
    reconsider_arrivals: int = 0


class Planner:
    def __init__(self, config: PlannerConfig, summarizer: Summarizer, query_log: QueryLog | None = None,
                 persistence: Any = None, storage: Any = None):
        self.config = config
        self.summarizer = summarizer
        self.query_log = query_log
        self.persistence = persistence
        self.storage = storage
        self.keys: dict[tuple[str, str], KeyStats] = {}
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.decisions: deque = deque(maxlen=200)
        self._scope_cache: dict[tuple[str, str], tuple[float, int]] = {}
        self.retired: dict[str, dict[str, Any]] = {}  # recently retired plans with their reasons (plan list, cost report)
        self._blocked: dict[str, tuple[float, str]] = {}  # spec id -> (time, reason): measured not to pay
        # (served CPU s, series) of the shapes of use measured on plans retired on measurement: what the
        # summary path cost them stays known to the estimates for the next plans (a small plan measured
        # at 2-3 ms per served refresh, against a prior of 0.7 ms, is not adopted again and again)
        self._retired_costs: deque = deque(maxlen=64)

    # --- catalog lookups -------------------------------------------------------------------
    @property
    def sds(self) -> dict[str, SDS]:
        return self.summarizer.sds

    def find_sds(self, metric: str, algorithm: str, matchers: list[Matcher], func: str | None = None) -> SDS | None:
        """The covering SDS of ``algorithm`` for a selector (the one with the widest coverage), which can
        answer ``func`` when given (an exact plan keeps only the pane fields of its functions)."""
        if not self.config.enabled:
            return None
        have = {(m.name, m.op, m.value) for m in matchers}
        best, widest = None, 0
        for s in self.summarizer.by_metric.get(metric, []):
            if s.spec.algorithm != algorithm or not set(s.spec.matchers) <= have:
                continue
            if func is not None and not s.serves(func):
                continue
            lo, hi = s.coverage()
            if hi - lo > widest:
                best, widest = s, hi - lo
        return best

    def has_plans_for(self, cands: list[Candidate]) -> bool:
        """Whether any SDS of a candidate's metric exists (adopted, backfilling or serving)."""
        by_metric = self.summarizer.by_metric
        return any(by_metric.get(c.metric) for c in cands)

    def find_group_sds(self, metric: str, matchers: list[Matcher], by: tuple[str, ...], algorithm: str = "group") -> SDS | None:
        """A covering ``group`` SDS whose scope is exactly the selector's matchers (a group payload
        cannot drop series) and whose grouping contains ``by``, the one with the fewest groups; or
        (``algorithm="cpc"``) a distinct-count SDS for exactly these item labels."""
        if not self.config.enabled:
            return None
        have = {(m.name, m.op, m.value) for m in matchers if m.name != "__name__"}
        best, best_g = None, None
        for s in self.summarizer.by_metric.get(metric, []):
            if s.spec.algorithm != algorithm or set(s.spec.matchers) != have:
                continue
            if not s.algorithm.exact and tuple(sorted(by)) != tuple(sorted(s.spec.grouping)):
                continue  # distinct / top-k items are exactly these labels
            if s.algorithm.exact and not set(by) <= set(s.spec.grouping):
                continue  # exact group sums coarsen to any subset of their grouping
            lo, hi = s.coverage()
            if hi <= lo:
                continue
            g = len(getattr(s.store, "group_keys", ()))
            if best is None or g < best_g:
                best, best_g = s, g
        return best

    def _has_plan_for(self, c: Candidate) -> bool:
        for s in self.summarizer.by_metric.get(c.metric, []):
            if s.spec.algorithm != c.algorithm:
                continue
            if s.algorithm.scope != "fixed":
                if not s.spec.matchers and s.serves(c.func):
                    return True
            elif set(s.spec.matchers) == set(c.matchers) and (
                    set(c.grouping) <= set(s.spec.grouping) if s.algorithm.exact else tuple(c.grouping) == tuple(s.spec.grouping)):
                return True
        return False

    # --- adoption ----------------------------------------------------------------------------
    def adopt(self, spec: SDSSpec, *, pinned: bool = False, reason: str = "", history_ms: int | None = None,
              background: bool | None = None) -> SDS | None:
        if not pinned:
            blocked = self._blocked.get(spec.id)
            if blocked is not None and time.time() - blocked[0] < self.config.retire_after_ms / 1000:
                return None  # measured not to pay a short while ago
        with self.lock:
            existing = self.sds.get(spec.id)
            if existing is not None:
                existing.pinned = existing.pinned or pinned
                return existing
            sds = SDS(spec, pinned=pinned, reason=reason)
            sds.seal_delay_ms = self.config.seal_delay_ms
            hist = min(history_ms or self.config.history_ms, self.config.max_history_ms)
            sds.history_ms = hist
            bg = self.config.background_backfill if background is None else background
            self.decisions.append((time.time(), "adopt", spec.id, reason))
            log.info("planner: adopting %s (%s)", spec.id, reason)
        self.summarizer.adopt(sds, hist, background=bg)
        return sds

    def retire(self, sds_id: str, reason: str, measured: bool = False) -> None:
        """Drop a plan. ``measured``: it was not cheaper than raw, so the same plan is not adopted again
        for ``retire_after`` (its candidates say why)."""
        sds = self.summarizer.remove(sds_id)
        if sds is None:
            return
        now = time.time()
        self.retired[sds_id] = {"id": sds_id, "metric": sds.metric, "algorithm": sds.spec.algorithm, "reason": reason,
                                "retired_at": now, "measured": sds.stats.measured(), "hits": sds.stats.hits,
                                # what it cost while it lived stays in the cost report's totals
                                "ingest_cpu_seconds": sds.stats.ingest_cpu_s,
                                "backfill_cpu_seconds": sds.stats.backfill_cpu_s}
        while len(self.retired) > 200:
            self.retired.pop(next(iter(self.retired)))
        if measured:
            self._blocked[sds.spec.id] = (now, reason)
            n = len(sds.registry.labels)
            self._retired_costs.extend((m[2], n) for m in sds.stats.shape_medians().values() if m[2] > 0)
        self.decisions.append((now, "retire", sds_id, reason))
        log.info("planner: retiring %s (%s)", sds_id, reason)
        if self.persistence is not None:
            self.persistence.drop(sds_id)

    def forget_deleted(self, matcher_sets: list[list[Any]]) -> list[str]:
        """Series matching ``matcher_sets`` were deleted from storage: retire every SDS whose scope can
        hold such series (its metric matches the set's ``__name__`` matchers; all of them when a set
        names no metric), so no summary keeps answering with deleted samples. Recurring queries
        re-adopt later, backfilled from what storage still holds. Returns the retired ids."""
        retired = []
        self.summarizer.frontier.invalidate_all()  # no kept step answer may hold deleted samples
        for sds in list(self.sds.values()):
            for ms in matcher_sets:
                names = [m for m in ms if m.name == "__name__"]
                if all(m.matches(sds.metric) for m in names):
                    self.retire(sds.id, "series deleted through the admin API")
                    retired.append(sds.id)
                    if sds.pinned:  # operator's plan: rebuilt from what storage still holds
                        self.adopt(sds.spec, pinned=True, reason="pinned in config; rebuilt after series deletion")
                    break
        return retired

    def pin_from_config(self) -> None:
        for p in self.config.pinned:
            d = dict(p)
            d.setdefault("pane_ms", _dur(d.pop("pane", None), self.config.pane_ms))
            spec = SDSSpec.from_json(d)
            hist = _dur(d.get("history"), self.config.history_ms)
            self.adopt(spec, pinned=True, reason="pinned in config", history_ms=hist)

    def observe(self, entry: LogEntry, cands: list[Candidate] | None = None) -> None:
        """Learn from one evaluated query (its log entry); may adopt an SDS."""
        if not self.config.enabled:
            return
        if cands is None:
            try:
                cands = candidates(entry.expr, self.config.req_min_phi)
            except Exception:  # noqa: BLE001 - unparsable: nothing to learn
                return
        # approximate algorithms are candidates only for queries that allow approximation
        cands = self._prefer_aggregates([c for c in cands if allowed(c.algorithm, entry.approx)])
        if not cands:
            return
        now = time.time()
        raw_share = entry.cpu_s / len(cands)
        steps = 1 if entry.kind == "instant" or entry.step_ms <= 0 else (entry.end_ms - entry.start_ms) // entry.step_ms + 1
        to_adopt = []
        with self.lock:
            for c in cands:
                ks = self.keys.get(c.key)
                if ks is None:  # (not setdefault: a KeyStats is a dozen containers, built per call)
                    ks = self.keys[c.key] = KeyStats()
                ks.arrivals.append(now)
                while ks.arrivals and ks.arrivals[0] < now - self.config.period_ms / 1000:
                    ks.arrivals.popleft()
                # (an exact=true query beside the same default one, as from a second datasource or a
                # check, is the same load: texts count on the default path only)
                seen = not entry.exact and (entry.expr in ks.exprs or len(ks.exprs) >= ks.EXPRS_MAX)
                if not entry.exact and not seen:
                    ks.exprs.add(entry.expr)
                if not ks.recurred and (seen or now - ks.arrivals[0] >= self.BURST_S):
                    ks.recurred = True
                # a raw execution's cost, unless earlier answers stood in for some of its steps
                served_raw = not any(p.startswith(("summary:", "steps:reused")) for p in entry.paths)
                new_steps = refreshed_steps(entry.paths)
                if new_steps and not entry.exact:
                    # a refresh: its newest steps evaluated raw, the rest reused; what a plan could
                    # save on it is this, not a whole evaluation's cost
                    ks.refresh_cpu.append(raw_share)
                    ks.refresh_windows.append(max(entry.result_series, 1) * new_steps)
                    ks.kinds.append(True)
                if served_raw and not entry.exact:
                    if seen:  # a text's first evaluation had nothing to reuse: it says nothing of the share
                        ks.kinds.append(False)
                    ks.raw_cpu.append(raw_share)
                    data_ms = c.range_ms + max(entry.end_ms - entry.start_ms, 0)
                    if entry.samples and data_ms:
                        ks.sample_rate = max(ks.sample_rate, entry.samples / len(cands) / (data_ms / 1000))
                if not entry.exact and entry.kind != "instant" and entry.step_ms > 0:
                    ks.grid = (entry.start_ms, entry.end_ms, entry.step_ms)
                ks.max_range_ms = max(ks.max_range_ms, c.range_ms)
                ks.min_range_ms = c.range_ms if not ks.min_range_ms else min(ks.min_range_ms, c.range_ms)
                ks.align_ms = math.gcd(ks.align_ms, int(c.range_ms), int(entry.end_ms), int(max(entry.step_ms, 0)))
                ks.max_span_ms = max(ks.max_span_ms, c.range_ms + max(entry.end_ms - entry.start_ms, 0))
                ks.windows.append(max(entry.result_series, 1) * steps)
                ks.series = max(ks.series, entry.result_series)
                ks.patterns.add(entry.pattern)
                ks.funcs.add(c.func)
                if self._has_plan_for(c):
                    continue
                if len(ks.arrivals) >= self.config.min_count and ks.raw_cpu:
                    if ks.recurred:
                        if now >= ks.reconsider_at or len(ks.arrivals) >= ks.reconsider_arrivals:
                            to_adopt.append((c, ks))
                    else:
                        ks.last_decision = (f"waiting for it to recur: {len(ks.arrivals)} arrivals of "
                                            f"different queries within {now - ks.arrivals[0]:.1f}s (one dashboard load)")
        for c, ks in to_adopt:
            self._consider(c, ks)

    def _prefer_aggregates(self, cands: list[Candidate]) -> list[Candidate]:
        """A ``fi`` / ``group`` / ``cpc`` candidate is followed by its inner candidates (``normalize``):
        a group one and / or the per-series one. Keep an aggregate candidate (and, for group / cpc, drop
        the inner ones of the same selector, range and function; an fi SDS falls back to raw on any
        unprovable step, so its inner ones stay) when the scope has enough series for it to pay
        (``fi_min_series`` / ``group_min_series`` / ``cpc_min_series``); otherwise drop it and keep the
        inner ones (per-series exact panes serve those exactly, shared with every pattern on the metric)."""
        need_of = {a.name: getattr(self.config, a.min_series) for a in ALGORITHMS.values() if a.min_series}
        out: list[Candidate] = []
        covered: set[tuple] = set()
        for c in cands:
            sig = (c.metric, c.func, c.range_ms, c.matchers)
            if c.algorithm not in need_of:
                if not (ALGORITHMS[c.algorithm].selects_fields and sig in covered):
                    out.append(c)
                continue
            if sig in covered:
                continue
            n = self._scope_series_cached(c)
            if n >= need_of[c.algorithm]:
                out.append(c)
                if not ALGORITHMS[c.algorithm].may_decline:  # else its inner candidates stay adoptable
                    covered.add(sig)
            else:
                self.keys.setdefault(c.key, KeyStats()).last_decision = (
                    f"{n} series in scope < {c.algorithm}_min_series {need_of[c.algorithm]}: inner per-series "
                    "or group panes serve this exactly")
        return out

    def _scope_series_cached(self, c: Candidate) -> int:
        now = time.time()
        hit = self._scope_cache.get(c.key)
        if hit is not None and now - hit[0] < 60:
            return hit[1]
        n = self._scope_series(c, max(c.range_ms, 60_000))
        self._scope_cache[c.key] = (now, n)
        return n

    def _arrival_span_s(self, ks: KeyStats) -> float:
        """Seconds the recent arrivals span: the query rate is (arrivals - 1) over it. (Dividing by the
        whole observation period undercounts a pattern that started recurring within it: three refreshes
        10 s apart are 0.1 q/s, not 3 per 10 min.) At least ``MIN_REFRESH_S``: arrivals closer together
        are one dashboard refresh's panels (p50 / p90 / p99 of one histogram are one pattern), not a
        pattern recurring every few hundred milliseconds."""
        if len(ks.arrivals) < 2:
            return self.config.period_ms / 1000
        return max(ks.arrivals[-1] - ks.arrivals[0], self.MIN_REFRESH_S)

    MIN_REFRESH_S = 5.0  # Grafana's default min_refresh_interval: no dashboard refreshes more often

    RATE_WINDOW_MS = 120_000

    def _recent_sample_rate(self, c: Candidate) -> float:
        """Samples per second the candidate's scope receives now (one storage read of the last two
        minutes, cached for a minute): what a plan would fold. The query log's estimate (samples a raw
        query read over its span) misses a scrape interval that changed, e.g. denser live data after
        sparser history."""
        now = time.time()
        key = ("rate",) + tuple(c.key)
        hit = self._scope_cache.get(key)
        if hit is not None and now - hit[0] < 60:
            return hit[1]
        rate = 0.0
        if self.storage is not None:
            ms = [Matcher("__name__", "=", c.metric)] + [Matcher(n, o, v) for n, o, v in c.matchers]
            hi = self.summarizer.max_ts if self.summarizer.max_ts is not None else int(now * 1000)
            try:
                rate = self.storage.select(ms, hi - self.RATE_WINDOW_MS, hi).num_samples / (self.RATE_WINDOW_MS / 1000)
            except Exception:  # noqa: BLE001 - unknown: keep the query log's estimate
                rate = 0.0
        self._scope_cache[key] = (now, rate)
        return rate

    def _scope_series(self, c: Candidate, range_ms: int) -> int:
        """Series in the candidate's scope with data in the last ``range_ms`` (storage index)."""
        if self.storage is None:
            return 0
        ms = [Matcher("__name__", "=", c.metric)] + [Matcher(n, o, v) for n, o, v in c.matchers]
        hi = self.summarizer.max_ts if self.summarizer.max_ts is not None else int(time.time() * 1000)
        try:
            return len(self.storage.series([ms], hi - max(range_ms, 1), hi))
        except Exception:  # noqa: BLE001 - unknown cardinality: stay exact
            return 0

    PLAN_COST_MIN_AGE_S = 60.0

    def _plan_cpu_per_s(self, series: int) -> float:
        """Live fold CPU per second of a plan over ``series`` series: as measured over the plans live for
        at least a minute, scaled to ``series`` (``_for_series``), or the cost model's prior while none is."""
        now = time.time()
        with self.summarizer.lock:
            live = list(self.summarizer.sds.values())
        measured = [(s.stats.ingest_cpu_s / (now - s.stats.created), len(s.registry.labels))
                    for s in live if now - s.stats.created >= self.PLAN_COST_MIN_AGE_S]
        return _for_series(measured, series, cost_model.DEFAULT_PLAN_CPU_PER_S)

    def _summary_fixed_cpu_s(self, series: int) -> float:
        """The summary path's CPU per served evaluation of a plan over ``series`` series beside its
        data-proportional part: the median served CPU of the shapes of use measured by shadow runs (on
        live plans and on plans retired on measurement), scaled to ``series`` (``_for_series``), or the
        prior for that many series while none is measured (a 6,400-series plan's newest steps cost
        ~50 ms, not the 0.5 ms of a few dozen series)."""
        with self.summarizer.lock:
            live = list(self.summarizer.sds.values())
        measured = [(m[2], len(s.registry.labels)) for s in live for m in s.stats.shape_medians().values() if m[2] > 0]
        measured += list(self._retired_costs)
        return _for_series(measured, series, cost_model.summary_prior_s(series, self.config.summary_cost_prior_s))

    def _backfill_cost_per_sample(self) -> float:
        """CPU per history sample of the backfills done so far (live and retired plans), or the prior."""
        with self.summarizer.lock:
            live = list(self.summarizer.sds.values())
        cpu = sum(s.stats.backfill_cpu_s for s in live)
        n = sum(s.stats.backfilled_samples for s in live)
        return cpu / n if n >= 100_000 else cost_model.DEFAULT_BACKFILL_COST_S

    def _fold_cost_per_sample(self) -> float:
        """CPU per sample folded into summaries, measured over the plans that exist (the summarizer's
        own totals count every ingested sample, folded or not, and would make folding look free)."""
        with self.summarizer.lock:
            live = list(self.summarizer.sds.values())
        cpu = sum(s.stats.ingest_cpu_s for s in live)
        n = sum(s.stats.ingested_samples for s in live)
        return cpu / n if n >= 10_000 else cost_model.DEFAULT_FOLD_COST_S

    MAX_SPAN_PANES = 500  # a finer pane for alignment only while the widest span read stays within this many

    # a store with running sums (``Algorithm.window_sums``) reads a window at the same cost whatever
    # panes it holds, so where bounds are not aligned a finer pane only shrinks the raw edges: its
    # shortest window gets this many panes (down to ``FINE_PANE_MS``; a rule's rate[5m] at arbitrary
    # milliseconds reads <= 15 s + the seal delay raw at each end instead of <= 60 s)
    FINE_PANES_PER_WINDOW = 16
    FINE_PANE_MS = 15_000

    def pane_for(self, ks: KeyStats, window_sums: bool = False) -> int:
        """The pane of a new plan: the configured one, or a finer divisor of a minute when the pattern's
        shortest window would hold fewer than 4 whole panes (``rate(x[1m])`` with 1 m panes has none).
        Among those, the coarsest that divides the bounds of the windows seen (Grafana aligns a panel's
        steps to its step): its windows are whole panes, with no raw edge to read, as long as the widest
        span read stays within ``MAX_SPAN_PANES`` panes. Otherwise, for a store with running sums, the
        coarsest holding ``FINE_PANES_PER_WINDOW`` in the shortest window, within the same span limit."""
        pane = self.config.pane_ms
        base = pane
        if ks.min_range_ms and ks.min_range_ms < 4 * pane:
            base = next((p for p in PANE_CHOICES_MS if p <= pane and 4 * p <= ks.min_range_ms),
                        min(pane, PANE_CHOICES_MS[-1]))
        if ks.align_ms and base in PANE_CHOICES_MS:
            for p in PANE_CHOICES_MS:
                if p <= base and ks.align_ms % p == 0 and ks.max_span_ms <= self.MAX_SPAN_PANES * p:
                    return p
        if window_sums and ks.min_range_ms:
            for p in PANE_CHOICES_MS:
                if (self.FINE_PANE_MS <= p <= base and self.FINE_PANES_PER_WINDOW * p <= ks.min_range_ms
                        and ks.max_span_ms <= self.MAX_SPAN_PANES * p):
                    return p
        return base

    MIN_REFRESHES = 2  # refreshes measured before their cost decides an adoption
    # a candidate refused on cost is estimated again at its first arrival this long after, or once its
    # arrivals in the period have grown by a quarter, not at every arrival: the estimate reads the
    # grid's raw edges and every plan's measured costs (~0.3 ms), which a pattern queried many times a
    # second (a scheduler polling PromQL, a one-off grid per request) paid per query, while at a steady
    # rate its inputs (arrival rate, raw cost, the plans' costs) move over seconds. A pattern that has
    # just started to recur (a new dashboard) gains rate with every arrival and is estimated at each
    RECONSIDER_S = 1.0
    RECONSIDER_GROWTH = 1.25
    BURST_S = 5.0  # arrivals of different queries within this long of the first are one load, not recurrences

    def _consider(self, c: Candidate, ks: KeyStats) -> None:
        raw_cpu = sum(ks.raw_cpu) / len(ks.raw_cpu)
        windows = sum(ks.windows) / max(len(ks.windows), 1)
        share = 0.0  # of the recent arrivals, refreshes the step answers shortened
        if ks.refresh_cpu:
            # the pattern's raw cost per query as its recent arrivals paid it: refreshes the step answers
            # shortened at their own cost, whole evaluations (pans, bypasses; not the first load, which
            # had nothing to reuse) at theirs
            if len(ks.refresh_cpu) < self.MIN_REFRESHES and 2 * sum(ks.kinds) >= len(ks.kinds):
                # mostly refreshes, and one refresh's CPU is one millisecond-scale sample (the first after
                # a load also computes the steps that were not sealed yet, often beside backfills):
                # measure another first
                ks.last_decision = f"waiting for {self.MIN_REFRESHES} measured refreshes ({len(ks.refresh_cpu)} so far)"
                return
            share = sum(ks.kinds) / len(ks.kinds)
            raw_cpu = share * statistics.median_low(ks.refresh_cpu) + (1 - share) * raw_cpu
            windows = share * statistics.median_low(ks.refresh_windows) + (1 - share) * windows
        pane_ms = self.pane_for(ks, ALGORITHMS[c.algorithm].window_sums)
        # the payload holds every series in the plan's scope (a per-metric plan: all of the metric's
        # series), not the query's result series (e.g. sum by (le) leaves a dozen of 1,400)
        scope = c if ALGORITHMS[c.algorithm].scope == "fixed" else Candidate(c.metric, (), c.algorithm, c.func, c.range_ms)
        scope_series = max(self._scope_series_cached(scope), ks.series)
        # history: twice the widest span the pattern's queries read (a 1 h dashboard needs ~2 h, not a
        # day), at most the configured history (scaled to keep its pane count for finer panes), and at
        # least twice the largest range. A pattern answered mostly by refreshes (the step answers keep
        # the older steps; a 24 h panel refreshed every minute computes its newest step or two) reads
        # the summary only for its newest windows: its span there is two of its windows, so the plan
        # does not backfill a day of history its refreshes never read (a pan or a first load of the
        # whole day is answered raw, as without the plan)
        span = 2 * ks.max_range_ms if 2 * share >= 1 else ks.max_span_ms
        history = min(self.config.history_ms * pane_ms // self.config.pane_ms, max(2 * span, 3_600_000))
        hist = min(max(history, 2 * ks.max_range_ms), self.config.max_history_ms)
        used = sum(s.nbytes() for s in list(self.sds.values()))  # a snapshot: other threads adopt and retire
        fields = self._exact_fields(c, ks) if ALGORITHMS[c.algorithm].selects_fields else None
        edges = self._grid_edges(c, ks, pane_ms, refreshes=2 * share >= 1)
        fold = self._fold_cost_per_sample()
        est = cost_model.estimate(
            algorithm=c.algorithm, queries=max(len(ks.arrivals) - 1, 1), period_s=self._arrival_span_s(ks),
            raw_cpu_per_query=raw_cpu, range_ms=max(ks.max_range_ms, 1),
            windows_per_query=windows, series=scope_series,
            ingest_samples_per_s=max(ks.sample_rate, self._recent_sample_rate(scope)), pane_ms=pane_ms, history_ms=hist,
            budget_left_bytes=self.config.budget_bytes - used, fold_cost_s=fold, plan_cpu_floor_per_s=self._plan_cpu_per_s(scope_series),
            bytes_per_pane=None if fields is None else 8 * len(fields) + pane_prefix.bytes_per_pane(frozenset(fields)),
            summary_fixed_s=self._summary_fixed_cpu_s(scope_series), backfill_cost_s=self._backfill_cost_per_sample(),
            amortize_s=self.config.retire_after_ms / 1000, slack_panes=SDS.TRIM_MIN_PANES, edge_fraction=edges,
        )
        ks.last_decision = est.reason
        if not est.pays:
            ks.reconsider_at = time.time() + self.RECONSIDER_S
            ks.reconsider_arrivals = max(len(ks.arrivals) + 1, math.ceil(self.RECONSIDER_GROWTH * len(ks.arrivals)))
        blocked = self._blocked_reason(c)
        if blocked is not None:  # whatever the estimate (which now counts that plan's measured cost)
            ks.last_decision = f"retired on measurement: {blocked}"
            return
        if est.pays:
            params: tuple = ALGORITHMS[c.algorithm].adopt_params(self.config)
            if fields is not None and fields != ALL_FIELDS:
                params = (("fields", ",".join(fields)),)
            if ALGORITHMS[c.algorithm].scope == "fixed":  # scope = the selector's matchers; groups / items
                spec = SDSSpec(metric=c.metric, algorithm=c.algorithm, pane_ms=pane_ms, matchers=c.matchers,
                               grouping=c.grouping)
            else:
                spec = SDSSpec(metric=c.metric, algorithm=c.algorithm, pane_ms=pane_ms, params=params)
            seen_s = ks.arrivals[-1] - ks.arrivals[0] if ks.arrivals else 0.0
            self.adopt(spec, reason=f"recurred {len(ks.arrivals)}x in {seen_s:.0f}s; {est.reason}",
                       history_ms=hist)

    MAX_GRID_STEPS = 4096  # the newest steps of a grid judged (a week at 15 s would be 40k windows)

    def _grid_edges(self, c: Candidate, ks: KeyStats, pane_ms: int, refreshes: bool) -> float | None:
        """The share of the raw path's span a plan with ``pane_ms`` panes would still read raw on the
        pattern's latest range query grid (``refreshes``: its newest two steps, what a refresh the step
        answers shorten evaluates), judged as the rewrite's cost check judges it (``worth_it``): 1.0
        when that check would answer the grid raw. A grid off the pane's multiples with steps shorter
        than a pane (a client sending ``end=now``) has raw edges across its whole span, and a plan for
        it would fold and keep panes no query reads. None for instant-only patterns and fixed-scope
        plans (whose rules weigh their own costs)."""
        if ks.grid is None or ALGORITHMS[c.algorithm].scope == "fixed" or c.func not in SERVED or c.range_ms <= 0:
            return None
        start, end, step = ks.grid
        ends = np.arange(start, end + 1, step, dtype=np.int64)[-(2 if refreshes else self.MAX_GRID_STEPS):]
        if not len(ends) or (c.range_ms % pane_ms == 0 and not (ends % pane_ms).any()):
            return None  # windows of whole panes (the scan takes bound panes whole, ``snap_aligned_edges``)
        # coverage of every pane the windows touch: what is left raw is the grid's own edges
        plan = plan_windows(ends, c.range_ms, pane_ms, (int(ends[0]) - c.range_ms) // pane_ms - 1,
                            int(ends[-1]) // pane_ms + 2)
        if not worth_it(c.func, plan, c.range_ms, pane_ms):
            return 1.0
        return edge_fraction(plan)

    def _exact_fields(self, c: Candidate, ks: KeyStats) -> tuple[str, ...]:
        """The pane fields of a new exact plan: those of every function seen on the metric, and of the
        plans it replaces (a new function needing more fields widens the metric's plan)."""
        needs: set[str] = set()
        for f in ks.funcs | {c.func}:
            if f in SERVED:
                needs |= SERVED[f].needs
        for s in self.summarizer.by_metric.get(c.metric, []):
            if s.algorithm.selects_fields and not s.spec.matchers:
                needs |= set(s.store.fields)
        return stored_fields(needs)

    def _superseded_by(self, s: SDS) -> SDS | None:
        """A per-metric exact plan keeping more pane fields than ``s`` (adopted when a function needing
        them recurred), backfilled at least as far back: it serves every query ``s`` serves."""
        if not s.algorithm.selects_fields or s.spec.matchers:
            return None
        mine = set(s.store.fields)
        for o in self.summarizer.by_metric.get(s.metric, []):
            if (o is s or o.spec.algorithm != s.spec.algorithm or o.spec.matchers or not mine < set(o.store.fields)
                    or o.backfill_state not in ("done", "restored")):
                continue
            if o.coverage()[0] <= s.coverage()[0]:
                return o
        return None

    def _blocked_reason(self, c: Candidate) -> str | None:
        now = time.time()
        for sid, (t, why) in list(self._blocked.items()):
            if now - t >= self.config.retire_after_ms / 1000:
                del self._blocked[sid]
            elif sid.startswith(f"{c.algorithm}-{c.metric}-"):
                return why
        return None

    # --- maintenance -------------------------------------------------------------------------
    MIN_SHADOW_RUNS = 6  # shadow runs before a plan's measured cost decides
    GRACE_S = 300.0  # a plan's summarization CPU is weighed against its savings this long after it first served

    def measured_verdict(self, s: SDS, now: float) -> str | None:
        """Why a plan must go, from its shadow runs (same sub-tree and steps on the raw path): every shape
        of use measured so far is slower than raw (the rewrite already skips it for those), or its
        measured CPU savings (per hit, times hits, less summarization CPU) are negative."""
        m = s.stats.measured()
        if m is None or m["runs"] < self.MIN_SHADOW_RUNS:
            return None
        verdicts = [v for v in m["shapes"].values() if v is not None]
        # a shape still being measured may be the one the plan pays for (a 24 h panel refreshed every
        # minute beside a 1 h one every 10 s): wait for its verdict
        if verdicts and all(v == "slower" for v in verdicts) and not s.stats.shapes_in_measurement():
            per_shape = "; ".join(f"{k}: {a * 1e3:.2f} vs {b * 1e3:.2f} ms wall, {c * 1e3:.2f} vs {d * 1e3:.2f} ms CPU"
                                  for k, (a, b, c, d) in s.stats.shape_medians().items())
            return (f"every shape of use measured no faster from the summary than on the raw path (medians, "
                    f"summary vs raw: {per_shape}; {m['runs']} shadow runs)")
        # weighed from when it first served: before, its shapes were measured on the raw path (a panel
        # refreshed once a minute takes three minutes), and the fold CPU it paid meanwhile is sunk, as
        # the backfill is; a plan that never served is weighed from its adoption once nothing is measured
        st = s.stats
        if not st.serving_since and st.shapes_in_measurement():
            return None
        start = st.serving_since or st.created
        before = st.ingest_cpu_s * max(0.0, min(1.0, (start - st.created) / max(now - st.created, 1e-9)))
        if now - start > self.GRACE_S and m["cpu_saved_s"] + before < 0:
            return (f"measured CPU savings are negative: {m['cpu_saved_s'] + before:.4f} CPU-s since it first "
                    f"served ({st.hits} hits; {st.ingest_cpu_s - before:.4f} s summarization since)")
        return None

    def maintain(self) -> None:
        now = time.time()
        for s in list(self.sds.values()):
            if s.pinned:
                continue
            why = self.measured_verdict(s, now)
            if why is not None:
                self.retire(s.id, why, measured=True)
                continue
            wider = self._superseded_by(s)
            if wider is not None:
                self.retire(s.id, f"superseded by {wider.id}, which keeps the pane fields of more functions "
                                  f"({', '.join(sorted(set(wider.store.fields) - set(s.store.fields)))} besides these)")
                continue
            last = max(s.stats.last_hit, s.stats.created)
            if now - last > self.config.retire_after_ms / 1000:
                self.retire(s.id, f"no hits for {int(now - last)}s")
        for s in list(self.sds.values()):
            s.trim()
        total = sum(s.nbytes() for s in list(self.sds.values()))
        if total > self.config.budget_bytes:
            for s in sorted((s for s in list(self.sds.values()) if not s.pinned), key=lambda s: s.stats.hits):
                self.retire(s.id, f"storage budget {self.config.budget_bytes} B exceeded ({total} B)")
                total = sum(x.nbytes() for x in list(self.sds.values()))
                if total <= self.config.budget_bytes:
                    break
        self.summarizer.drain()  # batches queued while ingest went quiet: their panes seal now
        self._persist()

    def _persist(self) -> None:
        """Write each finished plan's new panes, then the catalog rows that changed (one statement)."""
        if self.persistence is None:
            return
        done = [s for s in list(self.sds.values()) if s.backfill_state in ("done", "restored")]
        for s in done:
            try:
                self.persistence.flush(s)
            except Exception:  # noqa: BLE001
                log.exception("persisting %s failed", s.id)
        try:
            self.persistence.write_catalog(done)
        except Exception:  # noqa: BLE001
            log.exception("writing the plan catalog failed")

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="planner", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(15.0):
            try:
                self.maintain()
            except Exception:  # noqa: BLE001
                log.exception("planner maintenance failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.summarizer.drain()  # batches queued while ingest went quiet: their panes seal now
        self._persist()

    # --- introspection -----------------------------------------------------------------------
    def plans(self) -> list[dict[str, Any]]:
        self.summarizer.drain()  # what was consumed is counted in the listing
        return [s.describe() for s in sorted(self.sds.values(), key=lambda s: s.id)]

    def candidates_report(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {"metric": k[0], "algorithm": k[1], "recent_queries": len(v.arrivals),
                 "mean_raw_cpu_s": (sum(v.raw_cpu) / len(v.raw_cpu)) if v.raw_cpu else None,
                 "max_range_ms": v.max_range_ms, "patterns": sorted(v.patterns)[:10], "last_decision": v.last_decision}
                for k, v in sorted(self.keys.items())
            ]

    def explain(self, query: str, start_ms: int | None = None, end_ms: int | None = None, step_ms: int = 0,
                approx: bool | None = None) -> dict[str, Any]:
        """Which path each servable sub-tree would take, and why: the rewrite rules' own decisions
        (``planner/rewrite_rules.py``) for every node of the query, at the given evaluation times (without
        them: whether a summary may and can serve it at all). ``approx``: the request's ``approx``
        (None: the operator's ``planner.approximate``)."""
        expr = guarded_parse(query)
        out: dict[str, Any] = {"query": query, "pattern": normalize(query, expr), "subtrees": []}
        approximate = self.config.approximate_for(DEFAULT_TENANT) if approx is None else bool(approx)
        rctx = RewriteContext(self.find_sds, cost_based=self.config.cost_based, approximate=approximate,
                              find_group=self.find_group_sds,
                              measure_first=self.config.measure_first)  # as the hook's (planner.stack.build)
        if start_ms is None:
            times = None
            start_ms = end_ms = 0
        else:
            end_ms = start_ms if end_ms is None else end_ms
            times = np.arange(start_ms, end_ms + 1, step_ms, dtype=np.int64) if step_ms > 0 else \
                np.array([start_ms], np.int64)
        ectx = EvalContext(step_times=times, query_start_ms=start_ms, query_end_ms=end_ms, query_step_ms=step_ms,
                           lookback_delta_ms=300_000, source=None, annotations=Annotations(), stats=QueryStats(),
                           budget=None, query=query, extra={"approx": approximate})
        stack: list[tuple[Any, str | None]] = [(expr, None)]  # (node, the served aggregate it sits in)
        while stack:
            node, inside = stack.pop()
            kind = type(node).__name__
            served_here = None
            for rule in rules_for(kind):
                d = rule.decide(node, ectx, rctx)
                if d is None or (not d.served and not self._explain_considers(d)):
                    continue
                item = self._explain_item(d, inside, rule.candidate(node, self.config.req_min_phi))
                out["subtrees"].append(item)
                if d.served:
                    if ALGORITHMS[rule.algorithm].may_decline:  # answers only provable steps: the inner paths stay
                        item["why"] = "when every step's top-k set is provable from the sketch bounds, else the inner path"
                        continue
                    served_here = item["path"]
                    break
            stack.extend((c, served_here or inside) for c in reversed(children(node)))
        if not out["subtrees"]:
            out["why"] = "no sub-tree is a function an SDS serves (func(metric{...}[range]))"
        return out

    def _explain_considers(self, d: Decision) -> bool:
        """An unserved quantile decision is listed for the algorithm the planner would adopt for its
        phi only (REQ for a tail phi, KLL otherwise)."""
        return SERVED[d.func].family != "quantile" or d.algorithm == algorithm_for(d.func, d.phi, self.config.req_min_phi)

    def _explain_item(self, d: Decision, inside: str | None, cand: Candidate | None) -> dict[str, Any]:
        item: dict[str, Any] = {"function": d.func, "metric": d.metric, "range_ms": d.range_ms, "algorithm": d.algorithm}
        if d.sds is not None:
            item["path"] = f"summary:{d.sds.id}" if d.served else "raw"
            item["error_bound"] = d.sds.error_bound(d.phi)
            lo, hi = d.sds.coverage()
            item["coverage_ms"] = [lo * d.sds.spec.pane_ms, hi * d.sds.spec.pane_ms]
            if d.plan is not None:
                item["summary_panes"] = d.plan.summary_panes
                item["raw_edge_fraction"] = round(edge_fraction(d.plan), 4)
        else:
            item["path"] = "raw"
        if d.served:
            return item
        item["why"] = d.why
        if d.why == WHY_NO_SDS:
            adopted = [s.id for s in self.summarizer.by_metric.get(d.metric, []) if s.spec.algorithm == d.algorithm]
            key = self.keys.get(cand.key) if cand is not None else None
            if adopted:
                item["why"] = "SDS " + ", ".join(adopted) + " has no complete panes yet (backfill/sealing)"
            elif key is not None and key.last_decision:
                item["why"] = key.last_decision
        if inside is not None:
            item["path"] = "inside " + inside
            item["why"] = "the enclosing aggregate is answered from its summary"
        return item
