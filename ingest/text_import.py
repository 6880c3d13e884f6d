"""Text exposition / OpenMetrics body -> validated SampleBatch (POST /api/v1/import/prometheus)."""
from __future__ import annotations

import threading

import numpy as np

from ingest.errors import IngestError
from ingest.exemplars import Exemplar
from ingest.remote_write import Admission
from ingest.text_format import ParsedText, parse_exemplar, parse_series_key, parse_text
from ingest.text_native import TextRefs, text_refs_default
from ingest.validation import check_future, now_ms, valid_label_name, validate_pairs
from storage.batch import SampleBatch, SeriesRefColumn
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


class _Admitted:
    """One tenant's series admitted under one admission: (series text, extra labels) -> (labels as
    stored, reference). The object is also the references' space: storage maps them to series ids
    (``storage.batch.SeriesRefColumn``), so a known series is appended without hashing its labels.
    References are never reused (a refused request's are skipped), so one always names one series."""

    def __init__(self, admission: Admission):
        self.admission = admission
        self.known: dict[tuple[str, tuple], tuple[Labels, int]] = {}
        self.next_ref = 0
        self._lock = threading.Lock()

    def take_ref(self) -> int:
        with self._lock:
            self.next_ref += 1
            return self.next_ref - 1

    def remember(self, new: dict[tuple[str, tuple], tuple[Labels, int]]) -> None:
        self.known.update(new)


class TextImporter:
    """Bodies of the import endpoint. Senders push the same series again and again (an exporter's
    body every few seconds), so plain text-format bodies go through the compiled walk with one table
    of series texts shared by every request (``ingest/text_native.py``): lines of known series are
    parsed without Python per line (their labels are then looked up once per distinct series and
    request); anything else, and the first sight of a series, goes through ``parse_text``.

    With an ``admission`` (the HTTP import, as remote write), the labels as stored (tenant label,
    input limits) are kept per series text too: a known series is checked once, when first seen,
    and a request pays the tenant's active-series and rate limits once (``Admission.batch``)."""

    def __init__(self, *, future_tolerance_ms: int = 10 * 60_000, max_cached_series: int = 1_000_000):
        self.future_tolerance_ms = future_tolerance_ms
        self.max_cached_series = max_cached_series
        self._cache: dict[tuple[str, tuple], Labels] = {}  # (series text, extra labels) -> labels sent
        self._text = text_refs_default()  # None: the walk is not built or switched off
        self._text_lock = threading.Lock()  # the table is one writer at a time
        # tenant -> its admitted series; a new admission (a reloaded Limits) starts afresh, so every
        # series is checked under the new limits
        self._admitted: dict[str, _Admitted] = {}
        self._admitted_lock = threading.Lock()

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

    def admitted_for(self, parsed: ParsedText, extra: tuple[tuple[str, str], ...], tenant: str,
                     admission: Admission) -> tuple[list[Labels], SeriesRefColumn, _Admitted, dict]:
        """The series as stored for ``tenant`` under ``admission``, their references, and those not
        admitted before (remembered by ``_Admitted.remember`` only once the request's admission
        accepted them: a refused request's series count against the active-series limit again)."""
        with self._admitted_lock:
            st = self._admitted.get(tenant)
            if st is None or st.admission is not admission or st.next_ref >= self.max_cached_series:
                st = self._admitted[tenant] = _Admitted(admission)
        known = st.known
        out: list[Labels] = []
        refs: list[int] = []
        new: dict[tuple[str, tuple], tuple[Labels, int]] = {}
        plain: list[Labels] | None = None
        for k_i, key in enumerate(parsed.keys):  # per distinct series
            ck = (key, extra)
            hit = known.get(ck)
            if hit is None:
                if plain is None:
                    plain = self.labels_for(parsed, extra)
                hit = new[ck] = (admission.series(plain[k_i]), st.take_ref())
            out.append(hit[0])
            refs.append(hit[1])
        return out, SeriesRefColumn(st, np.array(refs, np.int64)), st, new

    def to_batch(self, body: bytes, *, default_ts_ms: int | None = None, extra_labels: list[tuple[str, str]] = (),
                 openmetrics: bool | None = None, tenant: str = "default") -> SampleBatch:
        return self.decode(body, default_ts_ms=default_ts_ms, extra_labels=extra_labels, openmetrics=openmetrics,
                           tenant=tenant)[0]

    def decode(self, body: bytes, *, default_ts_ms: int | None = None, extra_labels: list[tuple[str, str]] = (),
               openmetrics: bool | None = None, tenant: str = "default",
               admission: Admission | None = None) -> tuple[SampleBatch, list[Exemplar]]:
        """The samples as a batch, plus the OpenMetrics exemplars attached to them (their series as
        the client sent them). With ``admission``, the batch's series are as stored and the
        request has passed the tenant's limits (``IngestError`` otherwise)."""
        parsed = self._parse(body, openmetrics)
        extra = tuple(extra_labels)
        refs = st = new = None
        if admission is None:
            series = self.labels_for(parsed, extra)
        else:
            series, refs, st, new = self.admitted_for(parsed, extra, tenant, admission)
        ts = parsed.timestamps.copy()
        ts[~parsed.has_ts] = now_ms() if default_ts_ms is None else default_ts_ms
        check_future(ts, parsed.series_index, series, self.future_tolerance_ms)
        batch = SampleBatch(series, parsed.series_index, ts, parsed.values, metadata=parsed.metadata, tenant=tenant,
                            series_refs=refs)
        if admission is not None:
            admission.batch(batch, [lbl for lbl, _ in new.values()])
            st.remember(new)
        exemplars = exemplars_of(parsed, series if admission is None else self.labels_for(parsed, extra), ts) \
            if parsed.exemplars else []
        return batch, exemplars


def exemplars_of(parsed: ParsedText, series: list[Labels], sample_ts: np.ndarray) -> list[Exemplar]:
    """Exemplars of the parsed samples; one without a timestamp takes its sample's (as Prometheus's scraper)."""
    out = []
    for row, text in parsed.exemplars:
        labels, value, ts = parse_exemplar(text, int(parsed.lines[row]))
        out.append(Exemplar(series[int(parsed.series_index[row])], labels, value, int(sample_ts[row]) if ts is None else ts))
    return out
