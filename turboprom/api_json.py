"""JSON encoding of Prometheus HTTP API responses, byte-compatible with Prometheus.

Prometheus writes sample values as strings with Go's ``strconv.FormatFloat(v, 'f', -1, 64)``
(shortest round-trip digits, positional), switching to ``'e'`` format when ``|v| < 1e-6`` or
``|v| >= 1e21``; NaN/Inf become ``"NaN"``, ``"+Inf"``, ``"-Inf"``. Timestamps are written as
``<seconds>[.<3-digit millis>]`` (``1435781451.780``; no fraction when it is zero).

No library produces that exact format, so it is written here, vectorized: a matrix's numbers
are formatted column-wise with numpy masks (integers through ``int.__str__``, the rest through
``float.__repr__``, which is the same shortest-digits algorithm, with the few ranges where
Python and Go disagree on notation fixed up), and the result text is assembled with
``str.join``. The envelope and label maps go through ``orjson``.
"""
from __future__ import annotations

import math
from itertools import chain
from typing import Any, Sequence

import numpy as np
import orjson

from storage.go_format import format_float_f
from promql.types import QueryResult, QueryStats
from storage.labels import Labels

try:  # the compiled matrix assembly (turboprom/csrc/json_native.c); same text without it
    from turboprom import _json_native
except ImportError:  # not built: the pure-Python assembly below
    _json_native = None

_TWO53 = float(2**53)


# ---------------------------------------------------------------------------------------------
# numbers


def format_value(v: float) -> str:
    """One float the way Prometheus writes it (without the surrounding quotes)."""
    a = abs(v)
    if 1e-4 <= a < _TWO53 or v == 0:  # Python's repr is positional and shortest here, as Go's 'f' -1
        r = repr(float(v))
        return r[:-2] if r.endswith(".0") else r
    return format_values(np.array([v], dtype=np.float64))[0]


_FORMAT_BLOCK = 1 << 16


def format_values(values: np.ndarray) -> list[str]:
    """Go ``FormatFloat`` rendering of every value (see module doc), as a list of str.

    Bulk path: orjson's float writer (Ryu, shortest round-trip digits) over the whole array.
    For 1e-5 <= |v| < 2**53 (and 0) it is positional and identical to Go's 'f' -1 except that
    integral values end in ".0", which one ``str.replace`` over the joined text removes (a
    non-integral number never ends in ".0"). The rest (NaN/Inf, tiny and huge magnitudes) is
    formatted one by one; those values are rare in metrics."""
    v = np.ascontiguousarray(values, dtype=np.float64).ravel()
    n = v.shape[0]
    if n == 0:
        return []
    if n > _FORMAT_BLOCK:
        # in blocks: each C call below holds the GIL, and over millions of values that stalls the
        # event loop for seconds (a big query's answer is encoded in a worker thread)
        out: list[str] = []
        for a in range(0, n, _FORMAT_BLOCK):
            out.extend(format_values(v[a:a + _FORMAT_BLOCK]))
        return out
    text = orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode() + ","
    parts = text.replace(".0,", ",")[:-1].split(",")
    for i, t in _rare_texts(v):
        parts[i] = t
    return parts


def _rare_texts(v: np.ndarray) -> list[tuple[int, str]]:
    """(index, text) of the values orjson's text does not give in Go's form: NaN/Inf and the
    magnitudes outside 1e-5 <= |v| < 2**53 (except 0)."""
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        rare = ~((a < _TWO53) & ((a >= 1e-5) | (a == 0)))  # NaN compares False -> rare
    if not rare.any():
        return []
    return [(i, _format_rare(float(v[i]))) for i in np.flatnonzero(rare).tolist()]


def _format_rare(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    ax = abs(x)
    if ax < 1e-6 or ax >= 1e21:
        return repr(x)  # Go's 'e' form: shortest digits, two-digit signed exponent, as repr
    return np.format_float_positional(x, unique=True, trim="-")


def format_timestamps(ts_ms: np.ndarray) -> list[str]:
    """int64 ms -> Prometheus's ``seconds[.mmm]`` text (millis always three digits). Compiled when
    the extension is built (``_json_native.format_timestamps``), else ``_format_timestamps_py``."""
    t = np.ascontiguousarray(ts_ms, dtype=np.int64).ravel()
    if _json_native is not None:
        return _json_native.format_timestamps(t)
    return _format_timestamps_py(t)


def _format_timestamps_py(t: np.ndarray) -> list[str]:
    """``format_timestamps`` without the extension (the reference the compiled one is tested against)."""
    if t.shape[0] == 0:
        return []
    neg = t < 0
    a = np.abs(t).view(np.uint64)  # |INT64_MIN| is 2**63: only unsigned holds it
    sec = a // 1000
    frac = a % 1000
    secs = list(map(str, sec.tolist()))
    nz = np.flatnonzero(frac)
    if nz.shape[0] == 0 and not neg.any():
        return secs
    out = np.array(secs, dtype=object)
    if nz.shape[0]:
        fr = frac[nz].tolist()
        out[nz] = [s + "." + str(f).zfill(3) for s, f in zip(out[nz].tolist(), fr)]
    if neg.any():
        out[neg] = ["-" + s for s in out[neg].tolist()]
    return out.tolist()


def format_timestamp(t_ms: int) -> str:
    return format_timestamps(np.array([t_ms], dtype=np.int64))[0]


# ---------------------------------------------------------------------------------------------
# strings and label maps


# Stands for one byte that is not UTF-8 while orjson writes the text (a noncharacter pair no metric
# text holds); replaced by the escape Go's encoding/json writes for such a byte.
_BAD_BYTE = "\U0010fffe\U0010ffff"
_BAD_BYTE_JSON = _BAD_BYTE.encode()


def _valid_utf8(obj: Any) -> Any:
    """``obj`` with every byte that is not UTF-8 (carried in a str as a surrogate escape, e.g. from a
    PromQL string "\\xff") replaced by ``_BAD_BYTE``."""
    if isinstance(obj, str):
        return "".join(_BAD_BYTE if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in obj)
    if isinstance(obj, dict):
        return {_valid_utf8(k): _valid_utf8(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_valid_utf8(x) for x in obj]
    return obj


def _dumps(obj: Any, option: int = 0) -> bytes:
    """orjson.dumps; a byte that is not UTF-8 is written as Go's encoding/json writes it (``\\ufffd``)
    instead of refused."""
    try:
        return orjson.dumps(obj, option=option)
    except TypeError:  # orjson.JSONEncodeError: "str is not valid UTF-8: surrogates not allowed"
        return orjson.dumps(_valid_utf8(obj), option=option).replace(_BAD_BYTE_JSON, b"\\ufffd")


def json_str(s: str) -> str:
    return go_html_escape(_dumps(s)).decode()


# label set -> its JSON text: a dashboard's refreshes encode the same result series every few seconds
# (a 63-series x 241-step answer: 1.77 -> 1.51 ms per encode with the table). Bounded: past the cap
# the table starts over.
_LABELS_JSON: dict[Labels, str] = {}
MAX_CACHED_LABELS = 1 << 15


def labels_json(labels: Labels) -> str:
    """``{"name":"value",...}`` in label order (== Go's sorted map keys for canonical labels)."""
    if not labels:
        return "{}"
    text = _LABELS_JSON.get(labels)
    if text is None:
        text = go_html_escape(_dumps(dict(labels))).decode()
        if len(_LABELS_JSON) >= MAX_CACHED_LABELS:
            _LABELS_JSON.clear()
        _LABELS_JSON[labels] = text
    return text


def go_html_escape(body: bytes) -> bytes:
    """Go's encoding/json escapes <, >, & and U+2028/U+2029 inside strings; orjson does not.

    Those characters can only occur inside JSON strings, so a plain byte replace is exact."""
    if b"<" in body:
        body = body.replace(b"<", b"\\u003c")
    if b">" in body:
        body = body.replace(b">", b"\\u003e")
    if b"&" in body:
        body = body.replace(b"&", b"\\u0026")
    if b"\xe2\x80\xa8" in body:
        body = body.replace(b"\xe2\x80\xa8", b"\\u2028")
    if b"\xe2\x80\xa9" in body:
        body = body.replace(b"\xe2\x80\xa9", b"\\u2029")
    return body


# ---------------------------------------------------------------------------------------------
# envelopes


def envelope_raw(data_json: str, warnings: Sequence[str] = (), infos: Sequence[str] = (), *, escaped: bool = False) -> bytes:
    """``{"status":"success","data":<data_json>[,"warnings":[..]][,"infos":[..]]}``.

    ``escaped``: data_json was built from ``labels_json``/``json_str`` (already Go-escaped),
    so the large body need not be scanned again."""
    body = '{"status":"success","data":' + data_json
    if not escaped:
        body = go_html_escape(body.encode()).decode()
    tail = ""
    if warnings:
        tail += ',"warnings":' + json_str_list(warnings)
    if infos:
        tail += ',"infos":' + json_str_list(infos)
    return (body + tail + "}").encode()


def json_str_list(items: Sequence[str]) -> str:
    return go_html_escape(_dumps(list(items))).decode()


def success(data: Any, warnings: Sequence[str] = (), infos: Sequence[str] = ()) -> bytes:
    """Envelope for plain JSON-able data (dicts keep their insertion order)."""
    return envelope_raw(_dumps(data, orjson.OPT_NON_STR_KEYS).decode(), warnings, infos)


def error(error_type: str, message: str, data: Any = None) -> bytes:
    obj: dict[str, Any] = {"status": "error"}
    if data is not None:
        obj["data"] = data
    obj["errorType"] = error_type
    obj["error"] = message
    return go_html_escape(_dumps(obj))


# ---------------------------------------------------------------------------------------------
# query results


def _stats_json(stats: QueryStats, per_step: bool, queue_seconds: float, total_seconds: float) -> str:
    timings = {
        "evalTotalTime": stats.wall_seconds,
        "resultSortTime": 0,
        "queryPreparationTime": 0,
        "innerEvalTime": stats.wall_seconds,
        "execQueueTime": queue_seconds,
        "execTotalTime": total_seconds,
    }
    t_json = "{" + ",".join(f'"{k}":{_go_json_number(v)}' for k, v in timings.items()) + "}"
    samples = []
    steps = getattr(stats, "samples_per_step", None)
    if per_step and steps is not None:
        st, counts = steps
        pairs = ",".join(f"[{t},{int(c)}]" for t, c in zip(format_timestamps(np.asarray(st)), np.asarray(counts).tolist()))
        samples.append(f'"totalQueryableSamplesPerStep":[{pairs}]')
    samples.append(f'"totalQueryableSamples":{int(stats.samples_scanned)}')
    samples.append(f'"peakSamples":{int(stats.peak_samples)}')
    extra = {
        "seriesTouched": int(stats.series_touched),
        "cpuSeconds": stats.cpu_seconds,
        "paths": list(stats.paths),
    }
    return (
        '{"timings":' + t_json + ',"samples":{' + ",".join(samples) + "}"
        + ',"turboprom":' + orjson.dumps(extra).decode() + "}"
    )


def _go_json_number(v: float) -> str:
    """Go encoding/json float64 rendering (same cutoffs as values, unquoted)."""
    if isinstance(v, int):
        return str(v)
    return format_value(float(v))


def matrix_points_json(labels: list[Labels], counts: np.ndarray, tstr: list[str], cols: np.ndarray | None,
                       values: np.ndarray, native: bool = True, brackets: bool = True) -> bytes:
    """``[{"metric":..,"values":[[t,"v"],..]},..]`` (without the brackets unless ``brackets``) of
    series ``labels`` with ``counts[s]`` points each (all > 0): point j has value ``values[j]`` at
    timestamp text ``tstr[cols[j]]`` (``cols`` None: every series has all ``len(tstr)`` points, in
    order). Compiled when the extension is built (turboprom/csrc/json_native.c), else
    ``_matrix_json``; the two give the same bytes."""
    v = np.ascontiguousarray(values, dtype=np.float64).ravel()
    if native and _json_native is not None and len(labels):
        rare = _rare_texts(v)
        return _json_native.matrix_json(
            [labels_json(l) for l in labels], np.ascontiguousarray(counts, dtype=np.int64),
            None if cols is None else np.ascontiguousarray(cols, dtype=np.int64), tstr,
            orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY),
            np.fromiter((i for i, _ in rare), np.int64, count=len(rare)), [t for _, t in rare], brackets)
    ts_first = ["[" + t + ',"' for t in tstr]
    ts_next = ['"],[' + t + ',"' for t in tstr]
    text = _matrix_json(labels, np.asarray(counts), ts_first, ts_next, cols, format_values(v))
    return (text if brackets else text[1:-1]).encode()


def _matrix_json(labels: list[Labels], counts: np.ndarray, ts_first: list[str], ts_next: list[str],
                 tok_index: np.ndarray | None, vstrs: list[str]) -> str:
    """Assemble ``[{"metric":..,"values":[[t,"v"],..]},..]``.

    counts[s]: points of series s (all > 0). ts_first[k] = '[<t_k>,"' and ts_next[k] =
    '"],[<t_k>,"'; tok_index[j] says which timestamp point j uses (None: point j of a full
    series uses timestamp j). Each series' points are one ``"".join`` over the interleaved
    (token, value) pairs, so there is no Python work per point."""
    out = []
    nxt = np.array(ts_next, dtype=object)
    full = [ts_first[0], *ts_next[1:]] if tok_index is None or len(ts_first) else None
    T = len(ts_first)
    off = 0
    for i, (lbl, c) in enumerate(zip(labels, counts.tolist())):
        vals = vstrs[off:off + c]
        if tok_index is None:
            toks = full if c == T else [ts_first[0], *ts_next[1:c]]
        else:
            idx = tok_index[off:off + c]
            if c == T and full is not None:
                toks = full
            else:
                toks = nxt[idx].tolist()
                toks[0] = ts_first[int(idx[0])]
        out.append(('{"metric":' if i == 0 else ',{"metric":') + labels_json(lbl) + ',"values":['
                   + "".join(chain.from_iterable(zip(toks, vals))) + '"]]}')
        off += c
    return "[" + "".join(out) + "]"


def _ragged_json(labels: list[Labels], counts: np.ndarray, ts_first: list[str], ts_next: list[str], vstrs: list[str]) -> str:
    """Like ``_matrix_json`` for CSR input, where point j has its own timestamp j."""
    out = []
    off = 0
    for i, (lbl, c) in enumerate(zip(labels, counts.tolist())):
        toks = ts_next[off:off + c]
        toks[0] = ts_first[off]
        out.append(('{"metric":' if i == 0 else ',{"metric":') + labels_json(lbl) + ',"values":['
                   + "".join(chain.from_iterable(zip(toks, vstrs[off:off + c]))) + '"]]}')
        off += c
    return "[" + "".join(out) + "]"


def result_data_json(res: QueryResult, limit: int = 0, brackets: bool = True) -> tuple[bytes, bool]:
    """The ``data.result`` JSON of a query result (UTF-8) and whether it was truncated to ``limit``.
    ``brackets=False``: a matrix's series objects without the enclosing ``[ ]``."""
    rt = res.result_type
    truncated = False
    # Prometheus marshals scalars and strings as [float64(t)/1000, v] with encoding/json, so
    # their timestamp is a Go float (1435781451.78), unlike vector/matrix points (…451.780).
    if rt == "scalar":
        return f'[{format_value(res.timestamp / 1000)},"{format_float_f(res.scalar)}"]'.encode(), False
    if rt == "string":
        return f"[{format_value(res.timestamp / 1000)},{json_str(res.string)}]".encode(), False
    labels = res.labels
    if rt == "vector":
        vals = np.asarray(res.values if res.values is not None else np.empty(0), dtype=np.float64).ravel()
        n = len(labels)
        if limit and n > limit:
            n, truncated = limit, True
        if n == 0:
            return b"[]", truncated
        ts = format_timestamp(res.timestamp)
        vstr = format_values(vals[:n])
        items = [
            '{"metric":' + labels_json(labels[i]) + ',"value":[' + ts + ',"' + vstr[i] + '"]}'
            for i in range(n)
        ]
        return ("[" + ",".join(items) + "]").encode(), truncated
    if rt != "matrix":
        raise ValueError(f"unknown result type {rt!r}")
    if res.csr is not None:
        # Instant query returning a range vector: ragged raw points, own timestamps per point.
        offsets, cts, cvals = res.csr
        offsets = np.asarray(offsets, dtype=np.int64)
        s_count = len(labels)
        if limit and s_count > limit:
            s_count, truncated = limit, True
        counts = np.diff(offsets[: s_count + 1])
        keep = np.flatnonzero(counts)
        if keep.shape[0] == 0:
            return b"[]", truncated
        lo, hi = int(offsets[0]), int(offsets[s_count])
        tstr = format_timestamps(np.asarray(cts)[lo:hi])
        ts_first = ["[" + t + ',"' for t in tstr]
        ts_next = ['"],[' + t + ',"' for t in tstr]
        vstrs = format_values(np.asarray(cvals)[lo:hi])
        return _ragged_json([labels[i] for i in keep.tolist()], counts[keep], ts_first, ts_next, vstrs).encode(), truncated
    values = np.asarray(res.values, dtype=np.float64)
    present = np.asarray(res.present, dtype=bool) if res.present is not None else np.ones(values.shape, bool)
    counts_all = present.sum(axis=1)
    nonempty = np.flatnonzero(counts_all)  # Prometheus never returns a series without points
    if limit and len(nonempty) > limit:
        nonempty, truncated = nonempty[:limit], True
    if nonempty.shape[0] == 0:
        return (b"[]" if brackets else b""), truncated
    sub_present = present[nonempty]
    counts = counts_all[nonempty]
    full = bool((counts == sub_present.shape[1]).all())
    cols = None if full else np.nonzero(sub_present)[1]
    tstr = format_timestamps(np.asarray(res.timestamps))
    sub_values = values[nonempty]
    vals = sub_values.ravel() if full else sub_values[sub_present]
    return matrix_points_json([labels[i] for i in nonempty.tolist()], counts, tstr, cols, vals, brackets=brackets), truncated


PART_SAMPLES = 1 << 17  # points per piece of a streamed matrix body


def encode_query_result_parts(
    res: QueryResult,
    *,
    limit: int = 0,
    stats: str = "",
    extra_warnings: Sequence[str] = (),
    queue_seconds: float = 0.0,
    total_seconds: float = 0.0,
) -> list[bytes]:
    """``encode_query_result`` as pieces whose concatenation is the same body. A big range-query
    matrix is encoded a block of series at a time, so no single step (each holds the GIL) copies the
    whole multi-hundred-megabyte text, and the pieces can be written out one by one."""
    if res.result_type != "matrix" or res.csr is not None or limit or res.values is None or len(res.labels) < 2:
        return [encode_query_result(res, limit=limit, stats=stats, extra_warnings=extra_warnings,
                                    queue_seconds=queue_seconds, total_seconds=total_seconds)]
    s, t = res.values.shape
    rows = max(1, PART_SAMPLES // max(t, 1))
    parts = [b'{"status":"success","data":{"resultType":"matrix","result":[']
    sep = b""
    for a in range(0, s, rows):
        sub = QueryResult("matrix", labels=res.labels[a:a + rows], values=res.values[a:a + rows],
                          present=None if res.present is None else res.present[a:a + rows], timestamps=res.timestamps)
        block, _ = result_data_json(sub, brackets=False)
        if block:
            if sep:
                parts.append(sep)
            parts.append(block)
            sep = b","
    parts.append(("]" + _result_tail(res, stats, extra_warnings, False, queue_seconds, total_seconds)).encode())
    return parts


def _result_tail(res: QueryResult, stats: str, extra_warnings: Sequence[str], truncated: bool,
                 queue_seconds: float, total_seconds: float) -> str:
    """What follows ``"result":[...]``: the stats, the end of ``data``, warnings, infos, the end."""
    tail = ""
    if stats:
        tail += ',"stats":' + _stats_json(res.stats, stats == "all", queue_seconds, total_seconds)
    tail += "}"
    warnings = list(res.annotations.warnings)
    if truncated:
        warnings.append("results truncated due to limit")
    warnings.extend(extra_warnings)
    if warnings:
        tail += ',"warnings":' + json_str_list(warnings)
    if res.annotations.infos:
        tail += ',"infos":' + json_str_list(res.annotations.infos)
    return tail + "}"


def encode_query_result(
    res: QueryResult,
    *,
    limit: int = 0,
    stats: str = "",
    extra_warnings: Sequence[str] = (),
    queue_seconds: float = 0.0,
    total_seconds: float = 0.0,
) -> bytes:
    """Full response body of /api/v1/query or /api/v1/query_range."""
    result_json, truncated = result_data_json(res, limit)
    return b"".join((b'{"status":"success","data":{"resultType":"', res.result_type.encode(), b'","result":', result_json,
                     _result_tail(res, stats, extra_warnings, truncated, queue_seconds, total_seconds).encode()))
