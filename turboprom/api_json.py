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
from typing import Any, Iterable, Sequence

import numpy as np
import orjson

from promql.types import QueryResult, QueryStats
from storage.labels import Labels

_TWO53 = float(2**53)


# ---------------------------------------------------------------------------------------------
# numbers


def format_value(v: float) -> str:
    """One float the way Prometheus writes it (without the surrounding quotes)."""
    return format_values(np.array([v], dtype=np.float64))[0]


def format_values(values: np.ndarray) -> list[str]:
    """Go ``FormatFloat`` rendering of every value (see module doc), as a list of str."""
    v = np.ascontiguousarray(values, dtype=np.float64).ravel()
    n = v.shape[0]
    if n == 0:
        return []
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        intlike = (a < _TWO53) & (v == np.trunc(v))
    negzero = intlike & (v == 0) & np.signbit(v)
    if negzero.any():
        intlike &= ~negzero
    if intlike.all():
        return list(map(str, v.astype(np.int64).tolist()))
    out = np.empty(n, dtype=object)
    if intlike.any():
        out[intlike] = list(map(str, v[intlike].astype(np.int64).tolist()))
    rest = ~intlike
    finite = np.isfinite(v)
    # repr() already matches Go for 1e-4 <= |v| < 1e16 (positional) and for |v| < 1e-6 or
    # |v| >= 1e21 (exponent, at least two exponent digits, explicit sign).
    with np.errstate(invalid="ignore"):
        positional_fix = rest & finite & (((a >= 1e-6) & (a < 1e-4)) | ((a >= _TWO53) & (a < 1e21)))
    plain = rest & finite & ~positional_fix
    if plain.any():
        out[plain] = list(map(float.__repr__, v[plain].tolist()))
    if positional_fix.any():
        idx = np.flatnonzero(positional_fix)
        out[idx] = [np.format_float_positional(x, unique=True, trim="-") for x in v[idx].tolist()]
    if negzero.any():
        out[negzero] = "-0"
    special = ~finite
    if special.any():
        out[special & np.isnan(v)] = "NaN"
        out[special & (v == np.inf)] = "+Inf"
        out[special & (v == -np.inf)] = "-Inf"
    return out.tolist()


def format_value_f(v: float) -> str:
    """Go ``FormatFloat(v, 'f', -1, 64)``: always positional (Prometheus writes scalar results
    this way, while vector/matrix points switch to exponent form at the extremes)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    return np.format_float_positional(v, unique=True, trim="-")


def format_timestamps(ts_ms: np.ndarray) -> list[str]:
    """int64 ms -> Prometheus's ``seconds[.mmm]`` text (millis always three digits)."""
    t = np.ascontiguousarray(ts_ms, dtype=np.int64).ravel()
    if t.shape[0] == 0:
        return []
    neg = t < 0
    a = np.abs(t)
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


def json_str(s: str) -> str:
    return orjson.dumps(s).decode()


def labels_json(labels: Labels) -> str:
    """``{"name":"value",...}`` in label order (== Go's sorted map keys for canonical labels)."""
    if not labels:
        return "{}"
    return orjson.dumps(dict(labels)).decode()


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


def envelope_raw(data_json: str, warnings: Sequence[str] = (), infos: Sequence[str] = ()) -> bytes:
    """``{"status":"success","data":<data_json>[,"warnings":[..]][,"infos":[..]]}``."""
    parts = ['{"status":"success","data":', data_json]
    if warnings:
        parts.append(',"warnings":')
        parts.append(orjson.dumps(list(warnings)).decode())
    if infos:
        parts.append(',"infos":')
        parts.append(orjson.dumps(list(infos)).decode())
    parts.append("}")
    return go_html_escape("".join(parts).encode())


def success(data: Any, warnings: Sequence[str] = (), infos: Sequence[str] = ()) -> bytes:
    """Envelope for plain JSON-able data (dicts keep their insertion order)."""
    return envelope_raw(orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS).decode(), warnings, infos)


def error(error_type: str, message: str, data: Any = None) -> bytes:
    obj: dict[str, Any] = {"status": "error"}
    if data is not None:
        obj["data"] = data
    obj["errorType"] = error_type
    obj["error"] = message
    return go_html_escape(orjson.dumps(obj))


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


def _series_points(tok: list[str], vstrs: list[str], counts: np.ndarray) -> Iterable[str]:
    """Join per-series ``[t,"v"],...`` bodies. tok[i] = '[<t>,"', vstrs[i] = value text."""
    pts = list(map(str.__add__, tok, vstrs))
    off = 0
    for c in counts.tolist():
        yield '"],'.join(pts[off:off + c]) + '"]'
        off += c


def result_data_json(res: QueryResult, limit: int = 0) -> tuple[str, bool]:
    """The ``data.result`` JSON of a query result and whether it was truncated to ``limit``."""
    rt = res.result_type
    truncated = False
    # Prometheus marshals scalars and strings as [float64(t)/1000, v] with encoding/json, so
    # their timestamp is a Go float (1435781451.78), unlike vector/matrix points (…451.780).
    if rt == "scalar":
        return f'[{format_value(res.timestamp / 1000)},"{format_value_f(res.scalar)}"]', False
    if rt == "string":
        return f"[{format_value(res.timestamp / 1000)},{json_str(res.string)}]", False
    labels = res.labels
    if rt == "vector":
        vals = np.asarray(res.values if res.values is not None else np.empty(0), dtype=np.float64).ravel()
        n = len(labels)
        if limit and n > limit:
            n, truncated = limit, True
        if n == 0:
            return "[]", truncated
        ts = format_timestamp(res.timestamp)
        vstr = format_values(vals[:n])
        items = [
            '{"metric":' + labels_json(labels[i]) + ',"value":[' + ts + ',"' + vstr[i] + '"]}'
            for i in range(n)
        ]
        return "[" + ",".join(items) + "]", truncated
    if rt != "matrix":
        raise ValueError(f"unknown result type {rt!r}")
    if res.csr is not None:
        offsets, cts, cvals = res.csr
        offsets = np.asarray(offsets, dtype=np.int64)
        counts = np.diff(offsets)
        s_count = len(labels)
        if limit and s_count > limit:
            s_count, truncated = limit, True
            counts = counts[:limit]
        end = int(offsets[s_count]) if s_count else 0
        start = int(offsets[0]) if len(offsets) else 0
        tok = ["[" + t + ',"' for t in format_timestamps(np.asarray(cts)[start:end])]
        vstrs = format_values(np.asarray(cvals)[start:end])
        keep = range(s_count)
    else:
        values = np.asarray(res.values, dtype=np.float64)
        present = np.asarray(res.present, dtype=bool) if res.present is not None else np.ones(values.shape, bool)
        counts_all = present.sum(axis=1)
        nonempty = np.flatnonzero(counts_all)  # Prometheus never returns a series without points
        if limit and len(nonempty) > limit:
            nonempty, truncated = nonempty[:limit], True
        keep = nonempty.tolist()
        if not keep:
            return "[]", truncated
        sub_present = present[nonempty]
        rows, cols = np.nonzero(sub_present)
        ts_tok = np.array(["[" + t + ',"' for t in format_timestamps(np.asarray(res.timestamps))], dtype=object)
        tok = ts_tok[cols].tolist()
        vstrs = format_values(values[nonempty][sub_present])
        counts = counts_all[nonempty]
    bodies = _series_points(tok, vstrs, counts)
    items = []
    for s, body in zip(keep, bodies):
        if body == '"]':  # no points (only possible for ragged input)
            continue
        items.append('{"metric":' + labels_json(labels[s]) + ',"values":[' + body + "]}")
    return "[" + ",".join(items) + "]", truncated


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
    data = '{"resultType":"' + res.result_type + '","result":' + result_json
    if stats:
        data += ',"stats":' + _stats_json(res.stats, stats == "all", queue_seconds, total_seconds)
    data += "}"
    warnings = list(res.annotations.warnings)
    if truncated:
        warnings.append("results truncated due to limit")
    warnings.extend(extra_warnings)
    return envelope_raw(data, warnings, res.annotations.infos)
