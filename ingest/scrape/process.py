"""One scrape's body -> one SampleBatch (samples, report series, stale markers). Runs in a worker thread.

Per distinct series (cached per target across scrapes): parse the label text, merge with target
labels (honor_labels), apply metric_relabel_configs, validate. Per sample: numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from ingest.errors import IngestError
from ingest.relabel import RelabelConfig, relabel
from ingest.exemplars import Exemplar
from ingest.text_format import parse_exemplar, parse_series_key, parse_text
from ingest.text_native import TextRefs, text_refs_default
from ingest.validation import validate_pairs
from storage.batch import MetricMetadata, SampleBatch
from storage.labels import Labels
from storage.stale import STALE_NAN

REPORT_NAMES = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
                "scrape_series_added")
_DROPPED = ()  # cache value for series dropped by metric relabeling


METADATA_REFRESH_MS = 60_000  # an unchanged HELP/TYPE block is still sent this often (store evictions)


@dataclass
class SeriesState:
    """What a target remembers between scrapes."""

    cache: dict[str, Labels] = field(default_factory=dict)  # raw series text -> final labels (or _DROPPED)
    last_series: set[Labels] = field(default_factory=set)  # for staleness
    max_cache: int = 500_000
    text: TextRefs | None = field(default_factory=text_refs_default)  # compiled walk's series texts (None: parse_text)
    # With the walk: final labels and "kept" by the walk's reference (reference order), and the sorted
    # references of the last scrape's series (None: compare label sets), so a scrape with the same
    # series as the last one does no per-series Python.
    by_ref: list[Labels] = field(default_factory=list)
    kept_by_ref: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    last_refs: np.ndarray | None = None
    last_meta: object = None  # the metadata list the last batch carried
    last_meta_ts: int = 0

    def forget_series(self) -> set[Labels]:
        """The last scrape's series (for stale markers), forgotten: the next scrape adds them anew."""
        gone, self.last_series, self.last_refs = self.last_series, set(), None
        return gone

    def reset(self) -> None:
        """The cache outgrew ``max_cache``: every series is resolved anew."""
        self.cache.clear()
        if self.text is not None:
            self.text = TextRefs()
        self.by_ref, self.kept_by_ref, self.last_refs = [], np.zeros(0, bool), None

    def labels_by_ref(self, refs: np.ndarray, target: Labels, honor_labels: bool,
                      mrc: list[RelabelConfig]) -> tuple[list[Labels], np.ndarray]:
        """(final labels, kept) of the walk's references: per series only the first time it is seen."""
        assert self.text is not None
        keys = self.text.keys
        if len(self.by_ref) < len(keys):
            new = [self.cache.get(k) for k in keys[len(self.by_ref):]]
            for i, lbl in enumerate(new):
                if lbl is None:
                    key = keys[len(self.by_ref) + i]
                    lbl = new[i] = self.cache[key] = target_series_labels(parse_series_key(key), target, honor_labels, mrc)
            self.by_ref.extend(new)
            self.kept_by_ref = np.concatenate([self.kept_by_ref, np.fromiter((len(x) > 0 for x in new), bool, len(new))])
        n = len(refs)
        labels = [self.by_ref[int(refs[0])]] if n == 1 else list(itemgetter(*refs.tolist())(self.by_ref)) if n else []
        return labels, self.kept_by_ref[refs]


@dataclass
class ScrapeOutcome:
    batch: SampleBatch
    scraped: int = 0
    post_relabel: int = 0
    added: int = 0
    metadata: list[MetricMetadata] = field(default_factory=list)
    exemplars: list[Exemplar] = field(default_factory=list)  # of kept samples, with their final series labels


def target_series_labels(pairs: tuple[tuple[str, str], ...], target: Labels, honor_labels: bool,
                         mrc: list[RelabelConfig]) -> Labels:
    lb = dict(pairs)
    if honor_labels:
        for k, v in target:
            if k not in lb or lb[k] == "":
                lb[k] = v
    else:
        for k, v in target:
            if k in lb and lb[k] != "":
                lb[f"exported_{k}"] = lb[k]
            lb[k] = v
    res = relabel(lb, mrc)
    if res is None:
        return _DROPPED
    lbl = validate_pairs([(k, v) for k, v in res.items() if v != ""])
    return lbl


def process_scrape(body: bytes, content_type: str, scrape_ts: int, target: Labels, state: SeriesState, *,
                   honor_labels: bool, honor_timestamps: bool, mrc: list[RelabelConfig],
                   sample_limit: int = 0) -> ScrapeOutcome:
    openmetrics = "openmetrics" in content_type.lower()
    cache = state.cache
    if len(cache) > state.max_cache:
        state.reset()
    parsed = state.text.parse(body, openmetrics) if state.text is not None else None
    if parsed is None:
        parsed = parse_text(body, openmetrics=True if openmetrics else None)
    refs = parsed.refs
    if refs is not None:
        labels, keep_series = state.labels_by_ref(refs, target, honor_labels, mrc)
    else:
        labels = []
        for key in parsed.keys:  # per distinct series
            lbl = cache.get(key)
            if lbl is None:
                lbl = target_series_labels(parse_series_key(key), target, honor_labels, mrc)
                cache[key] = lbl
            labels.append(lbl)
        keep_series = np.fromiter((len(x) > 0 for x in labels), bool, count=len(labels))
    n = len(parsed)
    keep = keep_series[parsed.series_index] if n else np.zeros(0, bool)
    post = int(keep.sum())
    if sample_limit and post > sample_limit:
        raise IngestError("sample_limit", f"sample limit exceeded ({post} > {sample_limit})")
    # compact the series list to the kept ones
    new_pos = np.cumsum(keep_series) - 1
    series = labels if keep_series.all() else [lbl for lbl, k in zip(labels, keep_series.tolist()) if k]
    sidx = new_pos[parsed.series_index[keep]]
    ts = np.where(parsed.has_ts[keep] & honor_timestamps, parsed.timestamps[keep], scrape_ts) if n else np.zeros(0, np.int64)
    vals = parsed.values[keep]
    # staleness: series without explicit timestamps seen now vs last scrape
    explicit = np.zeros(len(series), bool)
    if honor_timestamps and parsed.has_ts.any():
        explicit[sidx[parsed.has_ts[keep]]] = True
    cur_refs = np.sort(refs[keep_series][~explicit]) if refs is not None else None
    if cur_refs is not None and state.last_refs is not None and np.array_equal(cur_refs, state.last_refs):
        gone, added = set(), 0  # the same series as the last scrape
    else:
        current = {s for s, e in zip(series, explicit.tolist()) if not e}
        gone = state.last_series - current
        added = len(current - state.last_series)
        state.last_series = current
        state.last_refs = cur_refs
    extra_series = list(gone)
    out_series = series + extra_series
    out_idx = np.concatenate([sidx, np.arange(len(series), len(out_series), dtype=np.int64)])
    out_ts = np.concatenate([np.asarray(ts, np.int64), np.full(len(extra_series), scrape_ts, np.int64)])
    out_vals = np.concatenate([vals, np.full(len(extra_series), STALE_NAN)])
    # HELP/TYPE go with the batch when this target's block changed (or every METADATA_REFRESH_MS)
    meta = parsed.metadata
    if meta is not state.last_meta or scrape_ts - state.last_meta_ts >= METADATA_REFRESH_MS:
        state.last_meta, state.last_meta_ts = meta, scrape_ts
    else:
        meta = []
    batch = SampleBatch(out_series, out_idx, out_ts, out_vals, metadata=meta)
    exemplars = []
    if parsed.exemplars:  # sparse: per exemplar; one without a timestamp takes its sample's
        rows = np.array([r for r, _ in parsed.exemplars], np.int64)
        kept = np.cumsum(keep) - 1
        for (row, text), ok in zip(parsed.exemplars, keep[rows].tolist()):
            if ok:
                lab, val, ets = parse_exemplar(text, int(parsed.lines[row]))
                exemplars.append(Exemplar(labels[int(parsed.series_index[row])], lab, val, int(ts[kept[row]]) if ets is None else ets))
    return ScrapeOutcome(batch, n, post, added, parsed.metadata, exemplars)


def report_batch(target: Labels, scrape_ts: int, up: float, duration_s: float, scraped: int, post: int, added: int,
                 stale_from: set[Labels] | None = None) -> SampleBatch:
    """up/scrape_* series for one scrape, plus stale markers for ``stale_from`` (failed scrape)."""
    series = [tuple(sorted(target + (("__name__", n),))) for n in REPORT_NAMES]
    vals = [up, duration_s, float(scraped), float(post), float(added)]
    if stale_from:
        extra = list(stale_from)
        series += extra
        vals += [STALE_NAN] * len(extra)
    n = len(series)
    return SampleBatch(series, np.arange(n, dtype=np.int64), np.full(n, scrape_ts, np.int64), np.asarray(vals, np.float64))


def stale_batch(series: list[Labels], ts: int) -> SampleBatch:
    n = len(series)
    return SampleBatch(list(series), np.arange(n, dtype=np.int64), np.full(n, ts, np.int64), np.full(n, STALE_NAN))


def merge(a: SampleBatch, b: SampleBatch) -> SampleBatch:
    off = len(a.series)
    return SampleBatch(a.series + b.series, np.concatenate([a.series_index, b.series_index + off]),
                       np.concatenate([a.timestamps, b.timestamps]), np.concatenate([a.values, b.values]),
                       metadata=a.metadata + b.metadata, tenant=a.tenant)
