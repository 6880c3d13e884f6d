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
- Exemplars of monotonic sums and histograms (trace_id/span_id as hex, filtered attributes while the label set
  stays within 128 characters) go with the counter series or with the first bucket whose bound holds
  the exemplar's value.

Refused points are counted (OTLP partial success) with the first reasons, never dropped silently.

What is per data point in Python, and why: the OTLP message is nested per point (each point has its
own attribute list, and usually a metric holds one or a few points), and the protobuf runtime hands
each point out as an object, so reading a point's attributes into a key tuple, its value and flags is
one small Python step per point; series identity is then one dict lookup per point (per bucket for
histograms) in a cache of validated label sets that lives across requests, and each sample is one
list append. Timestamps, stale marking, refusals and the batch columns are made with numpy once
per request (per-metric numpy calls cost more than they save when metrics hold one point each).
Exemplars are sparse and handled one by one.
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
from ingest.otlp_names import (COUNTER, GAUGE, HISTOGRAM, SUMMARY, UPDOWN, escapes, label_name, metric_name,
                               unit_name, value_string)
from ingest.validation import check_future, validate_pairs
from storage.batch import MetricMetadata, SampleBatch
from storage.go_format import format_float_f
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
    """One request's samples as Python lists (one append per sample), made numpy columns once at the end:
    timestamps, stale marking and refusals are per data point (``p_ns``, ``p_flags``), applied to the
    samples through their point number."""

    def __init__(self) -> None:
        self.series: list[Labels] = []
        self.local: dict[int, int] = {}  # translator series id -> this request's series number
        self.sid: list[int] = []  # per sample
        self.pid: list[int] = []
        self.val: list[float] = []
        self.p_ns: list[int] = []  # per data point
        self.p_flags: list[int] = []
        self.targets: list[tuple[int, int, int]] = []  # target_info: (series, first point, end point) per resource
        self.rejected = 0
        self.problems: list[str] = []
        self.meta: dict[tuple, MetricMetadata] = {}
        self.exemplars: list[Exemplar] = []

    def problem(self, msg: str) -> None:
        if len(self.problems) < MAX_PROBLEMS and msg not in self.problems:
            self.problems.append(msg)


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
        self._series: dict[tuple, int] = {}  # (base id, name, extra label, value) -> series id
        self._series_labels: list[Labels | str] = []  # by series id: validated labels, or why they are refused
        self._bucket_sets: dict[tuple, list[int]] = {}  # (base id, bucket name, bounds) -> series ids, +Inf last
        self._label_names: dict[str, str] = {}
        self._bounds: dict[float, str] = {}
        self._names: dict[tuple, tuple[str, MetricMetadata]] = {}

    # ---- names and label sets (cached across requests) ----
    def _label(self, key: str) -> str:
        out = self._label_names.get(key)
        if out is None:
            out = self._label_names[key] = label_name(key, self.escape)
        return out

    def _bound(self, v: float) -> str:
        s = self._bounds.get(v)
        if s is None:
            s = self._bounds[v] = format_float_f(v)
        return s

    def _family(self, m, kind: str) -> tuple[str, MetricMetadata]:
        """The metric's Prometheus family name and its metadata (type, description as help, unit)."""
        k = (m.name, m.unit, kind, m.description)
        out = self._names.get(k)
        if out is None:
            strategy = self.settings.translation_strategy
            name = metric_name(m.name, m.unit, kind, strategy)
            out = self._names[k] = (name, MetricMetadata(name, {GAUGE: "gauge", UPDOWN: "gauge", COUNTER: "counter"}.get(kind, kind),
                                                         m.description, unit_name(m.unit, strategy)))
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

    def _gid(self, bid: int, name: str, extra: str = "", extra_value: str = "") -> int:
        """The cached series id of a label set (validated once; a refusal is cached with its reason)."""
        k = (bid, name, extra, extra_value)
        gid = self._series.get(k)
        if gid is None:
            base = self._base_labels[bid]
            lbl: Labels | str
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
            gid = self._series[k] = len(self._series_labels)
            self._series_labels.append(lbl)
        return gid

    def _bucket_gids(self, bid: int, name: str, bounds) -> list[int]:
        k = (bid, name, tuple(bounds))
        gids = self._bucket_sets.get(k)
        if gids is None:
            gids = [self._gid(bid, name, "le", self._bound(b)) for b in bounds]
            gids.append(self._gid(bid, name, "le", "+Inf"))
            self._bucket_sets[k] = gids
        return gids

    def _local(self, r: _Request, gid: int) -> int:
        """The request's series number for a series id, or -1 (refused: the reason is recorded)."""
        i = r.local.get(gid)
        if i is None:
            lbl = self._series_labels[gid]
            if isinstance(lbl, str):
                r.problem(lbl)
                i = -1
            else:
                i = len(r.series)
                r.series.append(lbl)
            r.local[gid] = i
        return i

    def _sid(self, r: _Request, bid: int, name: str, extra: str = "", extra_value: str = "") -> int:
        return self._local(r, self._gid(bid, name, extra, extra_value))

    # ---- the request ----
    def translate(self, req, tenant: str = "default") -> Translation:
        with self._lock:
            if len(self._series) > self.max_cached_series:
                self._clear()
            r = _Request()
            for rm in req.resource_metrics:
                self._resource(r, rm)
        ts_p = (np.array(r.p_ns, np.uint64) // np.uint64(1_000_000)).astype(np.int64)
        pid = np.array(r.pid, np.int64)
        sidx = np.array(r.sid, np.int64)
        vals = np.array(r.val, np.float64)
        ts = ts_p[pid]
        stale = (np.array(r.p_flags, np.int64) & NO_RECORDED_VALUE) != 0
        vals[stale[pid]] = STALE_NAN
        missing = ts <= 0
        if missing.any():
            r.problem(f"{int((ts_p <= 0).sum())} data point(s) without a timestamp (time_unix_nano 0)")
        bad = (sidx < 0) | missing
        if bad.any():
            r.rejected += len(np.unique(pid[bad]))
            keep = ~bad
            sidx, ts, vals, pid = sidx[keep], ts[keep], vals[keep], pid[keep]
        sidx, ts, vals, pid = self._target_info_samples(r, ts_p, sidx, ts, vals, pid)
        series = r.series
        if len(series) and len(np.unique(sidx)) < len(series):  # series whose every point was refused: not sent
            used, sidx = np.unique(sidx, return_inverse=True)
            series = [series[i] for i in used.tolist()]
        check_future(ts, sidx, series, self.future_tolerance_ms)
        batch = SampleBatch(series, sidx, ts, vals, metadata=list(r.meta.values()), tenant=tenant)
        return Translation(batch, r.exemplars, pid, len(r.p_ns), r.rejected, r.problems)

    def _target_info_samples(self, r: _Request, ts_p: np.ndarray, sidx, ts, vals, pid):
        """Value 1 from each resource's earliest to its latest data point, every lookback delta / 2."""
        step = max(1, self.lookback_delta_ms // 2)
        parts = [(sidx, ts, vals, pid)]
        for sid, lo_p, hi_p in r.targets:
            span = ts_p[lo_p:hi_p]
            span = span[span > 0]
            if not len(span):
                continue
            lo, hi = int(span.min()), int(span.max())
            t = np.arange(lo, hi, step, dtype=np.int64)
            if len(t) == 0 or t[-1] < hi:
                t = np.append(t, np.int64(hi))
            parts.append((np.full(len(t), sid, np.int64), t, np.ones(len(t)), np.full(len(t), -1, np.int64)))
        if len(parts) == 1:
            return sidx, ts, vals, pid
        return tuple(np.concatenate(cols) for cols in zip(*parts))

    def _resource(self, r: _Request, rm) -> None:
        res_attrs = _attr_key(rm.resource.attributes)
        first = len(r.p_ns)
        for sm in rm.scope_metrics:
            ctx = self._context(res_attrs, sm)
            for m in sm.metrics:
                self._metric(r, ctx, m)
        sid = self._target_info(r, res_attrs)
        if sid >= 0 and len(r.p_ns) > first:
            r.targets.append((sid, first, len(r.p_ns)))

    def _target_info(self, r: _Request, res_attrs: tuple) -> int:
        if not {k for k, _ in res_attrs} - set(IDENTIFYING):
            return -1
        attrs = res_attrs if self.settings.keep_identifying_resource_attributes else \
            tuple(kv for kv in res_attrs if kv[0] not in IDENTIFYING)
        ids = _job_instance(dict(res_attrs))
        bid = self._base(_Context(self._cid((TARGET_INFO, tuple(ids))), [], ids), attrs)
        base = self._base_labels[bid]
        if isinstance(base, str) or ("job" not in base and "instance" not in base):
            return -1
        return self._sid(r, bid, TARGET_INFO)

    def _metric(self, r: _Request, ctx: _Context, m) -> None:
        which = m.WhichOneof("data")
        if which is None:
            r.problem(f"metric {m.name!r} has no data (gauge, sum, histogram, exponential_histogram or summary)")
            return
        data = getattr(m, which)
        pts = data.data_points
        n = len(pts)
        if n == 0:
            r.problem(f"metric {m.name!r}: empty data points, dropped")
            return
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
            return
        try:
            name, meta = self._family(m, kind)
        except ValueError as e:
            r.rejected += n
            r.problem(f"metric {m.name!r}: {e}")
            return
        r.meta.setdefault((meta.metric_family, meta.type, meta.help, meta.unit), meta)
        if which in ("gauge", "sum"):
            self._numbers(r, ctx, pts, name, kind == COUNTER)
        elif which == "summary":
            self._summaries(r, ctx, pts, name)
        else:
            self._histograms(r, ctx, pts, name, which == "exponential_histogram")

    def _point(self, r: _Request, ctx: _Context, p) -> tuple[int, int]:
        """Register a data point: (point number, base label-set id)."""
        pid = len(r.p_ns)
        r.p_ns.append(p.time_unix_nano)
        r.p_flags.append(p.flags)
        return pid, self._base(ctx, _attr_key(p.attributes))

    def _numbers(self, r: _Request, ctx: _Context, pts, name: str, exemplars: bool) -> None:
        """Gauges and sums; exemplars are kept for counters only (Prometheus drops them on gauges)."""
        for p in pts:
            pid, bid = self._point(r, ctx, p)
            sid = self._sid(r, bid, name)
            r.sid.append(sid)
            r.pid.append(pid)
            r.val.append(p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int))
            if exemplars and p.exemplars and sid >= 0:
                series = r.series[sid]
                r.exemplars.extend(_exemplar(e, series) for e in p.exemplars)

    def _histograms(self, r: _Request, ctx: _Context, pts, name: str, exponential: bool) -> None:
        bname, sname, cname = name + "_bucket", name + "_sum", name + "_count"
        sid_ = self._sid
        for p in pts:
            pid, bid = self._point(r, ctx, p)
            count = float(p.count)
            sids = [sid_(r, bid, cname)]
            vals = [count]
            if p.HasField("sum"):
                sids.append(sid_(r, bid, sname))
                vals.append(p.sum)
            bounds, counts = _exponential_buckets(p) if exponential else (p.explicit_bounds, p.bucket_counts)
            k = min(len(bounds), len(counts))
            local = self._local
            bucket_sids = [local(r, g) for g in self._bucket_gids(bid, bname, bounds[:k])]
            sids += bucket_sids
            vals += itertools.accumulate(map(float, counts[:k]))
            vals.append(count)
            r.sid += sids
            r.val += vals
            r.pid += [pid] * len(sids)
            if p.exemplars:
                finite = list(bounds[:k])
                for e in p.exemplars:
                    ex = _exemplar(e, ())
                    sid = bucket_sids[bisect_left(finite, ex.value)]
                    if sid >= 0:
                        r.exemplars.append(Exemplar(r.series[sid], ex.labels, ex.value, ex.ts))

    def _summaries(self, r: _Request, ctx: _Context, pts, name: str) -> None:
        sname, cname = name + "_sum", name + "_count"
        for p in pts:
            pid, bid = self._point(r, ctx, p)
            sids = [self._sid(r, bid, cname), self._sid(r, bid, sname)]
            vals = [float(p.count), p.sum]
            for q in p.quantile_values:
                sids.append(self._sid(r, bid, name, "quantile", self._bound(q.quantile)))
                vals.append(q.value)
            r.sid += sids
            r.val += vals
            r.pid += [pid] * len(sids)


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
