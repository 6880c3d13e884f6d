"""OTLP metrics (``ExportMetricsServiceRequest``) -> one columnar SampleBatch, translated the way
Prometheus 3.x's OTLP receiver translates them.

- Names: ingest/otlp_names.py (``otlp.translation_strategy``). Label sets are built as Prometheus's
  ``createAttributes`` builds them: the data point's attributes (sorted by key; keys that collide once
  escaped have their values joined with ``;``), then promoted resource attributes where the point has
  no such label, then ``otel_scope_*`` (``promote_scope_metadata``), then ``job`` = ``service.namespace/
  service.name`` and ``instance`` = ``service.instance.id``, then ``__name__`` and ``le``/``quantile``.
- ``target_info`` per resource with attributes other than the three identifying ones (and a job or
  instance): value 1 from the resource's earliest to its latest data point, every lookback-delta / 2.
- Gauges and non-monotonic sums -> gauge series; cumulative monotonic sums -> ``_total`` counters;
  explicit-bucket histograms -> ``_bucket{le}`` (cumulative, ``+Inf`` = count), ``_sum`` (when set),
  ``_count``; summaries -> ``{quantile}``, ``_sum``, ``_count``.
- Exponential histograms: the store keeps float samples only (no native histograms), so they become
  classic ``_bucket``/``_sum``/``_count`` series whose ``le`` bounds are the exponential bucket
  boundaries (negative buckets' upper bounds, the zero bucket at ``le`` = zero_threshold, positive
  buckets' upper bounds base^(index+1), ``+Inf``). Where Prometheus 3.x stores one native-histogram
  series, this stores one series per populated bucket bound; a change of scale changes the bounds.
- Delta (and unspecified) temporality sums and histograms are refused, as Prometheus refuses them by
  default; ``NoRecordedValue`` points become stale markers in every series they feed; points without a
  timestamp are refused. The start time is not stored (Prometheus 3.x's default too).
- Exemplars of sums and histograms (trace_id/span_id as hex, filtered attributes while the label set
  stays within 128 characters) go with the counter series or with the first bucket whose bound holds
  the exemplar's value.

Refused points are counted (OTLP partial success) with the first reasons, never dropped silently.

What is per data point in Python, and why: the OTLP message is nested per point (each point has its
own attribute list), and the protobuf runtime hands each point out as an object, so reading a point's
attributes into a key tuple, its value and flags, is one small Python step per point; series identity
is then one dict lookup per point (per bucket for histograms) in a cache of validated label sets that
lives across requests. Timestamps, stale marking, cumulative bucket sums and the batch columns are
numpy. Exemplars are sparse and handled one by one.
"""
from __future__ import annotations

import itertools
import math
import threading
from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from ingest.errors import IngestError
from ingest.exemplars import MAX_LABELS_RUNES, Exemplar
from ingest.otlp_config import OtlpSettings
from ingest.otlp_names import (COUNTER, GAUGE, HISTOGRAM, SUMMARY, UPDOWN, bound_string, escapes, label_name, metric_name,
                               unit_name, value_string)
from ingest.validation import check_future, validate_pairs
from storage.batch import MetricMetadata, SampleBatch
from storage.labels import METRIC_NAME, Labels
from storage.stale import STALE_NAN

IDENTIFYING = ("service.namespace", "service.name", "service.instance.id")
TARGET_INFO = "target_info"
CUMULATIVE = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
NO_RECORDED_VALUE = pb.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
MAX_PROBLEMS = 5


@dataclass
class Translation:
    batch: SampleBatch
    exemplars: list[Exemplar]
    sample_point: np.ndarray  # int64 per batch sample: the number of the data point it came from
    points: int = 0  # data points in the request
    rejected_points: int = 0  # refused while translating
    problems: list[str] = field(default_factory=list)  # first few reasons, for the partial-success message


class _Context:
    """What one resource + scope contributes to every label set under it."""

    __slots__ = ("cid", "promoted", "overrides")

    def __init__(self, cid: int, promoted: list[tuple[str, str]], overrides: list[tuple[str, str]]):
        self.cid = cid
        self.promoted = promoted  # set where the point has no such label
        self.overrides = overrides  # always set (scope labels, job, instance)


def _attr_key(attrs) -> tuple[tuple[str, str], ...]:
    return tuple((kv.key, value_string(kv.value)) for kv in attrs)


def _hex_or_empty(b: bytes) -> str:
    return b.hex() if b and any(b) else ""


class _Request:
    """Accumulates one request's columns."""

    def __init__(self) -> None:
        self.series: list[Labels] = []
        self.local: dict[Labels, int] = {}
        self.sidx: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.pid: list[np.ndarray] = []
        self.points = 0
        self.rejected = 0
        self.problems: list[str] = []
        self.meta: list[MetricMetadata] = []
        self.exemplars: list[Exemplar] = []

    def problem(self, msg: str) -> None:
        if len(self.problems) < MAX_PROBLEMS and msg not in self.problems:
            self.problems.append(msg)

    def sid(self, lbl: Labels | None) -> int:
        if lbl is None:
            return -1
        i = self.local.get(lbl)
        if i is None:
            i = self.local[lbl] = len(self.series)
            self.series.append(lbl)
        return i

    def add(self, sids, ts: np.ndarray, vals, pids: np.ndarray) -> None:
        self.sidx.append(np.asarray(sids, np.int64))
        self.ts.append(ts)
        self.vals.append(np.asarray(vals, np.float64))
        self.pid.append(pids)


class OtlpTranslator:
    def __init__(self, settings: OtlpSettings | None = None, *, future_tolerance_ms: int = 10 * 60_000,
                 lookback_delta_ms: int = 300_000, max_cached_series: int = 1_000_000):
        self.settings = settings or OtlpSettings()
        self.escape = escapes(self.settings.translation_strategy)
        self.future_tolerance_ms = future_tolerance_ms
        self.lookback_delta_ms = lookback_delta_ms
        self.max_cached_series = max_cached_series
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self._contexts: dict[tuple, int] = {}
        self._bases: dict[tuple, int] = {}
        self._base_labels: list[dict[str, str] | str] = []  # label dict (no __name__), or why the attributes are refused
        self._series: dict[tuple, Labels | str] = {}
        self._label_names: dict[str, str] = {}
        self._bounds: dict[float, str] = {}
        self._names: dict[tuple, str] = {}

    # ---- names and label sets (cached across requests) ----
    def _label(self, key: str) -> str:
        out = self._label_names.get(key)
        if out is None:
            out = self._label_names[key] = label_name(key, self.escape)
        return out

    def _bound(self, v: float) -> str:
        s = self._bounds.get(v)
        if s is None:
            s = self._bounds[v] = bound_string(v)
        return s

    def _metric_name(self, m, kind: str) -> str:
        k = (m.name, m.unit, kind)
        out = self._names.get(k)
        if out is None:
            out = self._names[k] = metric_name(m.name, m.unit, kind, self.settings.translation_strategy)
        return out

    def _context(self, resource_attrs: tuple, sm) -> _Context:
        """``sm``: the ScopeMetrics (its scope, and the schema URL it carries)."""
        s = self.settings
        res = dict(resource_attrs)
        if s.promote_all_resource_attributes:
            promoted = [(k, v) for k, v in resource_attrs if k not in s.ignore_resource_attributes]
        else:
            promoted = [(k, res[k]) for k in s.promote_resource_attributes if k in res]
        overrides: list[tuple[str, str]] = []
        scope_key: tuple = ()
        scope = sm.scope
        if s.promote_scope_metadata and scope.name:
            scope_attrs = _attr_key(scope.attributes)
            scope_key = (scope.name, scope.version, sm.schema_url, scope_attrs)
            overrides += [("otel_scope_name", scope.name), ("otel_scope_version", scope.version),
                          ("otel_scope_schema_url", sm.schema_url)]
            overrides += [("otel_scope_" + k, v) for k, v in scope_attrs]
        overrides += _job_instance(res)
        return _Context(self._cid((tuple(promoted), tuple(overrides), scope_key)), promoted, overrides)

    def _cid(self, key: tuple) -> int:
        cid = self._contexts.get(key)
        if cid is None:
            cid = self._contexts[key] = len(self._contexts)
        return cid

    def _base(self, ctx: _Context, attr_key: tuple) -> int:
        k = (ctx.cid, attr_key)
        bid = self._bases.get(k)
        if bid is None:
            try:
                lab: dict[str, str] | str = self._build_base(ctx, attr_key)
            except ValueError as e:
                lab = str(e)
            bid = self._bases[k] = len(self._base_labels)
            self._base_labels.append(lab)
        return bid

    def _build_base(self, ctx: _Context, attr_key: tuple) -> dict[str, str]:
        out: dict[str, str] = {}
        for k, v in sorted(attr_key, key=lambda kv: kv[0]):
            n = self._label(k)
            out[n] = out[n] + ";" + v if n in out else v
        for k, v in ctx.promoted:
            out.setdefault(self._label(k), v)
        for k, v in ctx.overrides:
            out[self._label(k)] = v
        return out

    def _labels(self, bid: int, name: str, extra: str = "", extra_value: str = "") -> Labels | str:
        k = (bid, name, extra, extra_value)
        lbl = self._series.get(k)
        if lbl is None:
            base = self._base_labels[bid]
            if isinstance(base, str):
                lbl = base
            else:
                d = dict(base)
                d[METRIC_NAME] = name
                if extra:
                    d[extra] = extra_value
                try:
                    lbl = validate_pairs(list(d.items()))
                except IngestError as e:
                    lbl = e.message
            self._series[k] = lbl
        return lbl

    # ---- the request ----
    def translate(self, req, tenant: str = "default") -> Translation:
        with self._lock:
            if len(self._series) > self.max_cached_series:
                self._clear()
            r = _Request()
            for rm in req.resource_metrics:
                self._resource(r, rm)
        if r.sidx:
            sidx = np.concatenate(r.sidx)
            ts = np.concatenate(r.ts)
            vals = np.concatenate(r.vals)
            pid = np.concatenate(r.pid)
        else:
            sidx = ts = pid = np.zeros(0, np.int64)
            vals = np.zeros(0, np.float64)
        bad = sidx < 0
        if bad.any():
            r.rejected += len(np.unique(pid[bad]))
            keep = ~bad
            sidx, ts, vals, pid = sidx[keep], ts[keep], vals[keep], pid[keep]
        check_future(ts, sidx, r.series, self.future_tolerance_ms)
        batch = SampleBatch(r.series, sidx, ts, vals, metadata=r.meta, tenant=tenant)
        return Translation(batch, r.exemplars, pid, r.points, r.rejected, r.problems)

    def _resource(self, r: _Request, rm) -> None:
        res_attrs = _attr_key(rm.resource.attributes)
        lo, hi = None, None
        for sm in rm.scope_metrics:
            ctx = self._context(res_attrs, sm)
            for m in sm.metrics:
                span = self._metric(r, ctx, m)
                if span is not None:
                    lo = span[0] if lo is None else min(lo, span[0])
                    hi = span[1] if hi is None else max(hi, span[1])
        if hi is not None:
            self._target_info(r, res_attrs, lo, hi)

    def _target_info(self, r: _Request, res_attrs: tuple, lo: int, hi: int) -> None:
        keys = {k for k, _ in res_attrs}
        if not keys - set(IDENTIFYING):
            return
        attrs = res_attrs if self.settings.keep_identifying_resource_attributes else \
            tuple(kv for kv in res_attrs if kv[0] not in IDENTIFYING)
        ids = _job_instance(dict(res_attrs))
        bid = self._base(_Context(self._cid((TARGET_INFO, tuple(ids))), [], ids), attrs)
        base = self._base_labels[bid]
        if isinstance(base, str) or ("job" not in base and "instance" not in base):
            return
        lbl = self._labels(bid, TARGET_INFO)
        if isinstance(lbl, str):
            r.problem(f"target_info: {lbl}")
            return
        step = max(1, self.lookback_delta_ms // 2)
        ts = np.arange(lo, hi, step, dtype=np.int64)
        if len(ts) == 0 or ts[-1] < hi:
            ts = np.append(ts, np.int64(hi))
        r.add(np.full(len(ts), r.sid(lbl)), ts, np.ones(len(ts)), np.full(len(ts), -1, np.int64))

    def _metric(self, r: _Request, ctx: _Context, m) -> tuple[int, int] | None:
        which = m.WhichOneof("data")
        if which is None:
            r.problem(f"metric {m.name!r} has no data (gauge, sum, histogram, exponential_histogram or summary)")
            return None
        data = getattr(m, which)
        pts = list(data.data_points)
        n = len(pts)
        if n == 0:
            r.problem(f"metric {m.name!r}: empty data points, dropped")
            return None
        first = r.points
        r.points += n
        if which == "gauge":
            kind = GAUGE
        elif which == "sum":
            kind = COUNTER if data.is_monotonic else UPDOWN
        elif which == "summary":
            kind = SUMMARY
        else:
            kind = HISTOGRAM
        if which in ("sum", "histogram", "exponential_histogram") and data.aggregation_temporality != CUMULATIVE:
            temporality = pb.AggregationTemporality.Name(data.aggregation_temporality).removeprefix("AGGREGATION_TEMPORALITY_").lower()
            r.rejected += n
            r.problem(f"metric {m.name!r}: {temporality} temporality is not supported, only cumulative "
                      f"(set the exporter's temporality preference to cumulative)")
            return None
        try:
            name = self._metric_name(m, kind)
        except ValueError as e:
            r.rejected += n
            r.problem(f"metric {m.name!r}: {e}")
            return None
        r.meta.append(MetricMetadata(name, {GAUGE: "gauge", UPDOWN: "gauge", COUNTER: "counter"}.get(kind, kind),
                                     m.description, unit_name(m.unit, self.settings.translation_strategy)))
        tns = np.fromiter((p.time_unix_nano for p in pts), np.uint64, n)
        ts = (tns // np.uint64(1_000_000)).astype(np.int64)
        missing = ts <= 0
        if missing.any():
            r.problem(f"metric {m.name!r}: {int(missing.sum())} data point(s) without a timestamp (time_unix_nano 0)")
        stale = (np.fromiter((p.flags for p in pts), np.int64, n) & NO_RECORDED_VALUE) != 0
        pids = np.arange(first, first + n, dtype=np.int64)
        bids = [self._base(ctx, _attr_key(p.attributes)) for p in pts]
        for i in np.nonzero(missing)[0].tolist():
            bids[i] = -1
        if which in ("gauge", "sum"):
            self._numbers(r, pts, name, bids, ts, stale, pids)
        elif which == "histogram":
            self._histograms(r, pts, name, bids, ts, stale, pids, [(list(p.explicit_bounds), list(p.bucket_counts)) for p in pts])
        elif which == "exponential_histogram":
            self._histograms(r, pts, name, bids, ts, stale, pids, [_exponential_buckets(p) for p in pts])
        else:
            self._summaries(r, pts, name, bids, ts, stale, pids)
        ok = ts[~missing]
        return (int(ok.min()), int(ok.max())) if len(ok) else None

    def _sid(self, r: _Request, bid: int, name: str, extra: str = "", extra_value: str = "") -> int:
        if bid < 0:
            return -1
        lbl = self._labels(bid, name, extra, extra_value)
        if isinstance(lbl, str):
            r.problem(lbl)
            return -1
        return r.sid(lbl)

    def _numbers(self, r: _Request, pts, name: str, bids: list[int], ts, stale, pids) -> None:
        n = len(pts)
        vals = np.fromiter((p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int) for p in pts), np.float64, n)
        vals[stale] = STALE_NAN
        sids = [self._sid(r, b, name) for b in bids]
        r.add(sids, ts, vals, pids)
        for i, p in enumerate(pts):
            if p.exemplars and sids[i] >= 0:
                series = r.series[sids[i]]
                r.exemplars.extend(_exemplar(e, series) for e in p.exemplars)

    def _histograms(self, r: _Request, pts, name: str, bids: list[int], ts, stale, pids, buckets: list[tuple[list, list]]) -> None:
        n = len(pts)
        bname, sname, cname = name + "_bucket", name + "_sum", name + "_count"
        counts = np.fromiter((float(p.count) for p in pts), np.float64, n)
        sums = np.fromiter((p.sum for p in pts), np.float64, n)
        has_sum = np.fromiter((p.HasField("sum") for p in pts), bool, n)
        count_vals = np.where(stale, STALE_NAN, counts)
        r.add([self._sid(r, b, cname) for b in bids], ts, count_vals, pids)
        if has_sum.any():
            hs = np.nonzero(has_sum)[0]
            r.add([self._sid(r, bids[i], sname) for i in hs.tolist()], ts[hs], np.where(stale[hs], STALE_NAN, sums[hs]), pids[hs])
        # finite buckets, cumulative, all points at once
        lens = np.fromiter((min(len(b), len(c)) for b, c in buckets), np.int64, n)
        flat = np.fromiter(itertools.chain.from_iterable(c[:k] for (_, c), k in zip(buckets, lens.tolist())), np.float64, int(lens.sum()))
        cum = np.cumsum(flat)
        starts = np.cumsum(lens) - lens
        before = np.concatenate([[0.0], cum])[starts]
        cum -= np.repeat(before, lens)
        owner = np.repeat(np.arange(n), lens)
        cum[stale[owner]] = STALE_NAN
        bucket_sids: list[list[int]] = []
        flat_sids: list[int] = []
        for i, ((bounds, _), k) in enumerate(zip(buckets, lens.tolist())):
            row = [self._sid(r, bids[i], bname, "le", self._bound(bounds[j])) for j in range(k)]
            row.append(self._sid(r, bids[i], bname, "le", "+Inf"))
            bucket_sids.append(row)
            flat_sids.extend(row[:-1])
        r.add(flat_sids, ts[owner], cum, pids[owner])
        r.add([row[-1] for row in bucket_sids], ts, count_vals, pids)
        for i, p in enumerate(pts):
            if p.exemplars:
                bounds = buckets[i][0][:int(lens[i])]
                for e in p.exemplars:
                    ex = _exemplar(e, ())
                    sid = bucket_sids[i][bisect_left(bounds, ex.value)]
                    if sid >= 0:
                        r.exemplars.append(Exemplar(r.series[sid], ex.labels, ex.value, ex.ts))

    def _summaries(self, r: _Request, pts, name: str, bids: list[int], ts, stale, pids) -> None:
        n = len(pts)
        sname, cname = name + "_sum", name + "_count"
        r.add([self._sid(r, b, cname) for b in bids], ts,
              np.where(stale, STALE_NAN, np.fromiter((float(p.count) for p in pts), np.float64, n)), pids)
        r.add([self._sid(r, b, sname) for b in bids], ts,
              np.where(stale, STALE_NAN, np.fromiter((p.sum for p in pts), np.float64, n)), pids)
        qs = [list(p.quantile_values) for p in pts]
        lens = np.fromiter(map(len, qs), np.int64, n)
        owner = np.repeat(np.arange(n), lens)
        sids = [self._sid(r, bids[i], name, "quantile", self._bound(q.quantile)) for i, row in enumerate(qs) for q in row]
        vals = np.fromiter((q.value for row in qs for q in row), np.float64, int(lens.sum()))
        vals[stale[owner]] = STALE_NAN
        r.add(sids, ts[owner], vals, pids[owner])


def _job_instance(res: dict[str, str]) -> list[tuple[str, str]]:
    """``job`` = service.namespace/service.name (or service.name), ``instance`` = service.instance.id."""
    out = []
    if "service.name" in res:
        ns = res.get("service.namespace")
        out.append(("job", f"{ns}/{res['service.name']}" if ns is not None else res["service.name"]))
    if "service.instance.id" in res:
        out.append(("instance", res["service.instance.id"]))
    return out


def _exponential_bound(index: int, scale: int) -> float:
    """base ** index for base = 2 ** (2 ** -scale), exact for scale <= 0."""
    try:
        if scale <= 0:
            return math.ldexp(1.0, index << -scale)
        q, rem = divmod(index, 1 << scale)
        return math.ldexp(2.0 ** (rem / (1 << scale)), q)
    except OverflowError:
        return math.inf


def _exponential_buckets(p) -> tuple[list[float], list[int]]:
    """An exponential-histogram point as classic (upper bounds ascending, per-bucket counts): negative
    buckets (upper bound -base^index), the zero bucket (upper bound zero_threshold), positive buckets
    (upper bound base^(index+1))."""
    s = p.scale
    bounds: list[float] = []
    counts: list[int] = []
    neg = list(p.negative.bucket_counts)
    off = p.negative.offset
    for j in range(len(neg) - 1, -1, -1):
        bounds.append(-_exponential_bound(off + j, s))
        counts.append(neg[j])
    bounds.append(p.zero_threshold)
    counts.append(p.zero_count)
    pos = list(p.positive.bucket_counts)
    off = p.positive.offset
    for j, c in enumerate(pos):
        bounds.append(_exponential_bound(off + j + 1, s))
        counts.append(c)
    return bounds, counts


def _exemplar(e, series: Labels) -> Exemplar:
    value = e.as_double if e.WhichOneof("value") == "as_double" else float(e.as_int)
    labels: list[tuple[str, str]] = []
    runes = 0
    for key, raw in (("trace_id", e.trace_id), ("span_id", e.span_id)):
        v = _hex_or_empty(raw)
        if v:
            labels.append((key, v))
            runes += len(key) + len(v)
    attrs = _attr_key(e.filtered_attributes)
    if runes + sum(len(k) + len(v) for k, v in attrs) <= MAX_LABELS_RUNES:
        labels.extend(attrs)
    return Exemplar(series, tuple(sorted(labels)), value, int(e.time_unix_nano // 1_000_000))
