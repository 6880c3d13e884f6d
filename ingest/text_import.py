"""Text exposition / OpenMetrics body -> validated SampleBatch (POST /api/v1/import/prometheus)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from operator import itemgetter

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


class _Sender:
    """One sender's series under one admission: a tenant and its ``extra_label`` set, like a scrape
    target. Its own table of series texts (``TextRefs``) gives each series a reference; the labels
    as stored (tenant label, input limits checked) are kept by reference, and the object is the
    references' space for storage (``storage.batch.SeriesRefColumn``), so a known series is looked
    up and appended without Python per series. A series gets its labels here only once a request
    carrying it was admitted (a refused request's series count against the limits again)."""

    def __init__(self, admission: Admission):
        self.admission = admission
        self.text = TextRefs()
        self.by_ref: list[Labels | None] = []
        # bodies the compiled walk does not take (OpenMetrics, escapes, ...): labels as sent -> as stored
        self.by_labels: dict[Labels, Labels] = {}
        self.lock = threading.Lock()


MAX_SENDERS = 10_000  # (tenant, extra labels) spaces kept; the least recently used goes first


class TextImporter:
    """Bodies of the import endpoint. Senders push the same series again and again (an exporter's
    body every few seconds), so plain text-format bodies go through the compiled walk with one table
    of series texts shared by every request (``ingest/text_native.py``): lines of known series are
    parsed without Python per line (their labels are then looked up once per distinct series and
    request); anything else, and the first sight of a series, goes through ``parse_text``.

    With an ``admission`` (the HTTP import, as remote write), each sender (tenant and extra labels)
    gets a table of its own, as a scrape target does (``_Sender``): its known series are checked
    once, when first seen, their labels as stored are found by reference in one C call, and a
    request pays the tenant's active-series and rate limits once (``Admission.batch``)."""

    def __init__(self, *, future_tolerance_ms: int = 10 * 60_000, max_cached_series: int = 1_000_000):
        self.future_tolerance_ms = future_tolerance_ms
        self.max_cached_series = max_cached_series
        self._cache: dict[tuple[str, tuple], Labels] = {}  # (series text, extra labels) -> labels sent
        self._text = text_refs_default()  # None: the walk is not built or switched off
        self._text_lock = threading.Lock()  # the table is one writer at a time
        # (tenant, extra labels) -> that sender's series; a new admission (a reloaded Limits) starts
        # afresh, so every series is checked under the new limits
        self._senders: OrderedDict[tuple[str, tuple], _Sender] = OrderedDict()
        self._senders_lock = threading.Lock()

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

    def _sender(self, tenant: str, extra: tuple, admission: Admission) -> _Sender:
        key = (tenant, extra)
        with self._senders_lock:
            st = self._senders.get(key)
            if st is None or st.admission is not admission or len(st.text) > self.max_cached_series:
                st = self._senders[key] = _Sender(admission)
                if len(self._senders) > MAX_SENDERS:
                    self._senders.popitem(last=False)
            else:
                self._senders.move_to_end(key)
            return st

    def _decode_admitted(self, body: bytes, extra: tuple, tenant: str, admission: Admission,
                         default_ts_ms: int | None) -> tuple[SampleBatch, list[Exemplar]] | None:
        """The compiled walk's path with an admission: None when the body is not in the walk's plain
        shape (the caller parses it with ``parse_text``)."""
        st = self._sender(tenant, extra, admission)
        with st.lock:
            parsed = st.text.parse(body)
            if parsed is None:
                return None
            by_ref = st.by_ref
            if len(by_ref) < len(st.text):
                by_ref.extend([None] * (len(st.text) - len(by_ref)))
            refs = parsed.refs
            n = len(refs)
            series = [by_ref[int(refs[0])]] if n == 1 else list(itemgetter(*refs.tolist())(by_ref)) if n else []
        new_at = [i for i, lbl in enumerate(series) if lbl is None] if None in series else []
        if new_at:  # series not admitted yet: validated labels, tenant label and input limits, once
            plain = self.labels_for(parsed, extra)
            for i in new_at:
                series[i] = admission.series(plain[i])
        batch = self._batch(parsed, series, default_ts_ms, tenant)
        batch.series_refs = SeriesRefColumn(st, refs)
        admission.batch(batch, [series[i] for i in new_at])
        if new_at:
            with st.lock:
                for i in new_at:
                    st.by_ref[int(refs[i])] = series[i]
        return batch, (exemplars_of(parsed, self.labels_for(parsed, extra), batch.timestamps) if parsed.exemplars else [])

    def _batch(self, parsed: ParsedText, series: list[Labels], default_ts_ms: int | None, tenant: str) -> SampleBatch:
        ts = parsed.timestamps.copy()
        ts[~parsed.has_ts] = now_ms() if default_ts_ms is None else default_ts_ms
        check_future(ts, parsed.series_index, series, self.future_tolerance_ms)
        return SampleBatch(series, parsed.series_index, ts, parsed.values, metadata=parsed.metadata, tenant=tenant)

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
        extra = tuple(extra_labels)
        if admission is not None and self._text is not None and not openmetrics:
            got = self._decode_admitted(body, extra, tenant, admission, default_ts_ms)
            if got is not None:
                return got
        parsed = self._parse(body, openmetrics)
        plain = self.labels_for(parsed, extra)
        if admission is None:
            batch = self._batch(parsed, plain, default_ts_ms, tenant)
        else:  # bodies the walk does not take: series admitted before are found by their labels
            st = self._sender(tenant, extra, admission)
            known = st.by_labels
            series, new = [], []
            for lbl in plain:  # per distinct series, as labels_for
                got = known.get(lbl)
                if got is None:
                    got = admission.series(lbl)
                    new.append((lbl, got))
                series.append(got)
            batch = self._batch(parsed, series, default_ts_ms, tenant)
            admission.batch(batch, [got for _, got in new])
            if new:  # only once admitted: a refused request's series count against the limits again
                with st.lock:
                    if len(known) + len(new) > self.max_cached_series:
                        known.clear()
                    known.update(new)
        return batch, exemplars_of(parsed, plain, batch.timestamps) if parsed.exemplars else []


def exemplars_of(parsed: ParsedText, series: list[Labels], sample_ts: np.ndarray) -> list[Exemplar]:
    """Exemplars of the parsed samples; one without a timestamp takes its sample's (as Prometheus's scraper)."""
    out = []
    for row, text in parsed.exemplars:
        labels, value, ts = parse_exemplar(text, int(parsed.lines[row]))
        out.append(Exemplar(series[int(parsed.series_index[row])], labels, value, int(sample_ts[row]) if ts is None else ts))
    return out
