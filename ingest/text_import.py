"""Text exposition / OpenMetrics body -> validated SampleBatch (POST /api/v1/import/prometheus)."""
from __future__ import annotations

import threading

import numpy as np

from ingest.errors import IngestError
from ingest.exemplars import Exemplar
from ingest.text_format import ParsedText, parse_exemplar, parse_series_key, parse_text
from ingest.text_native import TextRefs, text_refs_default
from ingest.validation import check_future, now_ms, valid_label_name, validate_pairs
from storage.batch import SampleBatch
from storage.labels import Labels


def parse_extra_labels(values: list[str]) -> list[tuple[str, str]]:
    """``extra_label=name=value`` query parameters (VictoriaMetrics convention)."""
    out = []
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not valid_label_name(name):
            raise IngestError("bad_param", f"invalid extra_label {item!r}: expected name=value with a valid label name")
        out.append((name, value))
    return out


class TextImporter:
    """Bodies of the import endpoint. Senders push the same series again and again (an exporter's
    body every few seconds), so plain text-format bodies go through the compiled walk with one table
    of series texts shared by every request (``ingest/text_native.py``): lines of known series are
    parsed without Python per line (their labels are then looked up once per distinct series and
    request); anything else, and the first sight of a series, goes through ``parse_text``."""

    def __init__(self, *, future_tolerance_ms: int = 10 * 60_000, max_cached_series: int = 1_000_000):
        self.future_tolerance_ms = future_tolerance_ms
        self.max_cached_series = max_cached_series
        self._cache: dict[tuple[str, tuple], Labels] = {}
        self._text = text_refs_default()  # None: the walk is not built or switched off
        self._text_lock = threading.Lock()  # the table is one writer at a time

    def _parse(self, body: bytes, openmetrics: bool | None) -> ParsedText:
        if self._text is not None and not openmetrics:
            with self._text_lock:
                if len(self._text) > self.max_cached_series:
                    self._text = TextRefs()
                parsed = self._text.parse(body)
            if parsed is not None:
                return parsed
        return parse_text(body, openmetrics=openmetrics)

    def labels_for(self, parsed: ParsedText, extra: tuple[tuple[str, str], ...]) -> list[Labels]:
        cache = self._cache
        out: list[Labels] = []
        first_line = None
        for k_i, key in enumerate(parsed.keys):  # per distinct series
            ck = (key, extra)
            lbl = cache.get(ck)
            if lbl is None:
                if first_line is None:
                    first_line = np.full(len(parsed.keys), -1, np.int64)
                    first_line[parsed.series_index[::-1]] = parsed.lines[::-1]
                ln = int(first_line[k_i])
                pairs = dict(parse_series_key(key, ln))
                pairs.update(extra)
                try:
                    lbl = validate_pairs(list(pairs.items()))
                except IngestError as e:
                    raise IngestError(e.reason, f"line {ln}: {e.message}") from None
                if len(cache) >= self.max_cached_series:
                    cache.clear()
                cache[ck] = lbl
            out.append(lbl)
        return out

    def to_batch(self, body: bytes, *, default_ts_ms: int | None = None, extra_labels: list[tuple[str, str]] = (),
                 openmetrics: bool | None = None, tenant: str = "default") -> SampleBatch:
        return self.decode(body, default_ts_ms=default_ts_ms, extra_labels=extra_labels, openmetrics=openmetrics,
                           tenant=tenant)[0]

    def decode(self, body: bytes, *, default_ts_ms: int | None = None, extra_labels: list[tuple[str, str]] = (),
               openmetrics: bool | None = None, tenant: str = "default") -> tuple[SampleBatch, list[Exemplar]]:
        """The samples as a batch, plus the OpenMetrics exemplars attached to them."""
        parsed = self._parse(body, openmetrics)
        series = self.labels_for(parsed, tuple(extra_labels))
        ts = parsed.timestamps.copy()
        ts[~parsed.has_ts] = now_ms() if default_ts_ms is None else default_ts_ms
        check_future(ts, parsed.series_index, series, self.future_tolerance_ms)
        batch = SampleBatch(series, parsed.series_index, ts, parsed.values, metadata=parsed.metadata, tenant=tenant)
        return batch, exemplars_of(parsed, series, ts)


def exemplars_of(parsed: ParsedText, series: list[Labels], sample_ts: np.ndarray) -> list[Exemplar]:
    """Exemplars of the parsed samples; one without a timestamp takes its sample's (as Prometheus's scraper)."""
    out = []
    for row, text in parsed.exemplars:
        labels, value, ts = parse_exemplar(text, int(parsed.lines[row]))
        out.append(Exemplar(series[int(parsed.series_index[row])], labels, value, int(sample_ts[row]) if ts is None else ts))
    return out
