"""Prometheus text exposition format 0.0.4 and OpenMetrics 1.0 text, parsed column-wise.

Why hand-written: prometheus_client.parser builds one Python object per sample (measured in
bench/ingest_text_parser.py, ~10x slower than this). Here the whole body is one Arrow string
array; RE2 (pyarrow.compute.extract_regex) splits every sample line into series / value /
timestamp columns in C++, values are cast column-wise, series are dictionary-encoded, and only
*distinct* series keys are turned into label sets (and cached across calls by the caller).
A line that does not match falls to a slow path that names it with its line number.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import IngestError
from ingest.validation import LABEL_NAME_RE, valid_label_name, valid_metric_name
from storage.batch import MetricMetadata

# The series is `name{labels}`, `name`, or (UTF-8 names, text format 1.0) `{"quoted.name", labels}`.
_BRACES = r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}'
_SAMPLE_RE = (r'^[ \t]*(?P<series>[a-zA-Z_:][a-zA-Z0-9_:]*(?:[ \t]*' + _BRACES + r')?|' + _BRACES + r')'
              r'[ \t]+(?P<value>[^ \t#]+)(?:[ \t]+(?P<ts>[^ \t#]+))?(?P<exemplar>[ \t]+#.*)?[ \t\r]*$')
_META_RE = r'^#[ \t]+(?P<kind>TYPE|HELP|UNIT)[ \t]+(?P<name>"(?:[^"\\]|\\.)*"|[^ \t]+)(?:[ \t](?P<rest>.*))?$'
# name="value" where the name may be quoted ("my.label"="value"), and a lone quoted metric name.
_LABEL_PAIR = re.compile(r'[ \t]*(?:([^ \t=,{}"]+)|"((?:[^"\\]|\\.)*)")[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_QUOTED_NAME = re.compile(r'[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_UNESCAPE = re.compile(r'\\(.)')
_HELP_UNESCAPE = re.compile(r'\\([n\\])')
_TYPES = {"counter", "gauge", "histogram", "gaugehistogram", "summary", "untyped", "unknown", "info", "stateset"}

SeriesPairs = tuple[tuple[str, str], ...]  # as in the exposition (not yet validated/relabelled)


@dataclass
class ParsedText:
    keys: list[str]  # distinct raw series texts, e.g. 'http_requests_total{code="200"}'
    series_index: np.ndarray  # int64 per sample, into keys
    values: np.ndarray  # float64
    timestamps: np.ndarray  # int64 ms; valid only where has_ts
    has_ts: np.ndarray  # bool
    lines: np.ndarray  # 1-based line number per sample (messages)
    metadata: list[MetricMetadata] = field(default_factory=list)
    exemplars: list[tuple[int, str]] = field(default_factory=list)  # (sample row, text after '#'), OpenMetrics
    refs: np.ndarray | None = None  # int64 per key: its reference in the target's TextRefs (None: parse_text)

    def __len__(self) -> int:
        return len(self.values)


def _unescape_value(v: str) -> str:
    if "\\" not in v:
        return v
    return _UNESCAPE.sub(lambda m: {"n": "\n", "\\": "\\", '"': '"'}.get(m.group(1), "\\" + m.group(1)), v)


def parse_series_key(key: str, line: int | None = None) -> SeriesPairs:
    """'name{a="b"}' -> (('__name__','name'), ('a','b')), validating names. Per distinct series."""
    where = f"line {line}: " if line is not None else ""
    brace = key.find("{")
    if brace < 0:
        name, body = key.strip(), ""
    else:
        name, body = key[:brace].strip(), key[brace + 1:key.rfind("}")]
    pos, n = 0, len(body)
    if not name:  # {"quoted.name", ...}: the name is the first item inside the braces
        m = _QUOTED_NAME.match(body)
        if not m:
            raise IngestError("invalid_metric_name", f"{where}series without a metric name: {key[:200]!r}")
        name, pos = _unescape_value(m.group(1)), m.end()
    if not valid_metric_name(name):
        raise IngestError("invalid_metric_name", f"{where}invalid metric name {name!r}")
    pairs = [("__name__", name)]
    seen = {"__name__"}
    while pos < n:
        if body[pos:].strip() == "":
            break
        m = _LABEL_PAIR.match(body, pos)
        if not m:
            raise IngestError("bad_text", f"{where}cannot parse labels of {key[:200]!r} at {body[pos:pos + 40]!r}")
        if m.group(1) is not None:  # unquoted names keep the legacy syntax; others must be quoted
            lname = m.group(1)
            ok = LABEL_NAME_RE.match(lname) is not None
        else:
            lname = _unescape_value(m.group(2))
            ok = valid_label_name(lname)
        if not ok:
            raise IngestError("invalid_label_name", f"{where}invalid label name {lname!r} in {key[:200]!r}")
        if lname in seen:
            raise IngestError("duplicate_label", f"{where}duplicate label name {lname!r} in {key[:200]!r}")
        seen.add(lname)
        pairs.append((lname, _unescape_value(m.group(3))))
        pos = m.end()
    return tuple(pairs)


def _bad_line(lines: list[str], i: int, what: str, line_offset: int = 0) -> IngestError:
    text = lines[i]
    return IngestError("bad_text", f"line {i + 1 + line_offset}: {what}: {text[:200]!r}")


def _parse_float_slow(s: str) -> float:
    t = s.strip()
    low = t.lower()
    if low in ("+inf", "inf", "+infinity", "infinity"):
        return float("inf")
    if low in ("-inf", "-infinity"):
        return float("-inf")
    if low == "nan":
        return float("nan")
    return float(t.replace("_", "") if "_" not in t[:1] else t)


def parse_text(body: bytes | str, *, openmetrics: bool | None = None, terminated: bool = True,
               line_offset: int = 0) -> ParsedText:
    """Parse a whole exposition. Raises IngestError('bad_text', 'line N: ...') on the first bad line.

    A large file is parsed in pieces of whole lines: ``line_offset`` is the number of lines before
    this piece (messages and ``ParsedText.lines`` count from the file's start), and
    ``terminated=False`` says an OpenMetrics piece is not the document's end (its caller checks the
    ``# EOF`` terminator; one inside the piece is refused)."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            text = bytes(body).decode("utf-8")
        except UnicodeDecodeError as e:
            raise IngestError("bad_text", f"body is not valid UTF-8 (byte offset {e.start})") from None
    else:
        text = body
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if openmetrics is None:
        openmetrics = any(ln.rstrip("\r") == "# EOF" for ln in lines[-3:])
    if openmetrics and terminated:
        eof = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].rstrip("\r") == "# EOF"), None)
        if eof is None:
            raise IngestError("bad_text", "OpenMetrics body without the '# EOF' terminator")
        if any(ln.strip() for ln in lines[eof + 1:]):
            raise _bad_line(lines, eof + 1, "content after '# EOF'", line_offset)
        lines = lines[:eof]
    arr = pa.array(lines, pa.string())
    stripped = pc.utf8_trim_whitespace(arr)
    is_comment = pc.starts_with(stripped, "#")
    is_blank = pc.equal(pc.utf8_length(stripped), 0)
    skip = pc.or_(is_comment, is_blank)
    comment_pos = np.nonzero(is_comment.to_numpy(zero_copy_only=False))[0]
    if openmetrics and not terminated and len(comment_pos):
        eof = pc.equal(pc.utf8_rtrim(arr.take(pa.array(comment_pos)), "\r"), "# EOF").to_numpy(zero_copy_only=False)
        if eof.any():
            raise _bad_line(lines, int(comment_pos[np.argmax(eof)]), "'# EOF' before the end of the file", line_offset)
    meta = _metadata(arr.filter(is_comment), comment_pos, lines, line_offset)

    sample_pos = np.nonzero(~skip.to_numpy(zero_copy_only=False))[0]
    sample_lines = arr.take(pa.array(sample_pos))
    ex = pc.extract_regex(sample_lines, _SAMPLE_RE)
    if ex.null_count:
        bad = np.nonzero(~ex.is_valid().to_numpy(zero_copy_only=False))[0][0]
        raise _bad_line(lines, int(sample_pos[bad]), "invalid sample line (expected 'name{labels} value [timestamp]')", line_offset)
    series = ex.field("series")
    vals_s = ex.field("value")
    try:
        values = pc.cast(vals_s, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        vl = vals_s.to_pylist()
        values = np.empty(len(vl), np.float64)
        for i, s in enumerate(vl):  # error/odd-spelling path only (e.g. '+Infinity', '1_000')
            try:
                values[i] = _parse_float_slow(s)
            except ValueError:
                raise _bad_line(lines, int(sample_pos[i]), f"invalid value {s!r}", line_offset) from None
    ts_s = ex.field("ts")
    has_ts = pc.not_equal(pc.utf8_length(ts_s), 0).to_numpy(zero_copy_only=False)
    timestamps = np.zeros(len(values), np.int64)
    if has_ts.any():
        sel = ts_s.filter(pa.array(has_ts))
        try:
            if openmetrics:
                f = pc.cast(sel, pa.float64()).to_numpy(zero_copy_only=False)
                if not np.isfinite(f).all():
                    raise pa.ArrowInvalid("non-finite timestamp")
                timestamps[has_ts] = np.round(f * 1000.0).astype(np.int64)
            else:
                timestamps[has_ts] = pc.cast(sel, pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            tl = sel.to_pylist()
            rows = np.nonzero(has_ts)[0]
            for j, s in enumerate(tl):
                try:
                    float(s) if openmetrics else int(s)
                except ValueError:
                    raise _bad_line(lines, int(sample_pos[rows[j]]), f"invalid timestamp {s!r}", line_offset) from None
            raise _bad_line(lines, int(sample_pos[rows[0]]), "invalid timestamp", line_offset)
    enc = series.dictionary_encode()
    keys = enc.dictionary.to_pylist()
    sidx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    exemplars: list[tuple[int, str]] = []
    ex_s = ex.field("exemplar")
    if openmetrics and ex_s.null_count < len(ex_s):
        has_ex = pc.fill_null(pc.greater(pc.utf8_length(ex_s), 0), False).to_numpy(zero_copy_only=False)
        rows = np.nonzero(has_ex)[0]
        exemplars = list(zip(rows.tolist(), ex_s.filter(pa.array(has_ex)).to_pylist()))
    return ParsedText(keys, sidx, values, timestamps, has_ts, sample_pos + 1 + line_offset, meta, exemplars)


_EXEMPLAR_RE = re.compile(r'^[ \t]*#[ \t]*\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}[ \t]+([^ \t]+)(?:[ \t]+([^ \t]+))?[ \t\r]*$')


def parse_exemplar(text: str, line: int) -> tuple[tuple[tuple[str, str], ...], float, int | None]:
    """OpenMetrics ``# {trace_id="abc"} 0.67 [1520879607.789]`` -> (labels, value, ts ms or None)."""
    m = _EXEMPLAR_RE.match(text)
    if not m:
        raise IngestError("bad_text", f"line {line}: invalid exemplar {text.strip()[:200]!r}")
    body, val, ts = m.groups()
    pairs: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body) and body[pos:].strip():
        lm = _LABEL_PAIR.match(body, pos)
        if not lm:
            raise IngestError("bad_text", f"line {line}: cannot parse exemplar labels {body[:200]!r}")
        name = lm.group(1) if lm.group(1) is not None else _unescape_value(lm.group(2))
        pairs.append((name, _unescape_value(lm.group(3))))
        pos = lm.end()
    try:
        value = _parse_float_slow(val)
        ts_ms = None if ts is None else int(round(float(ts) * 1000.0))
    except ValueError:
        raise IngestError("bad_text", f"line {line}: invalid exemplar value or timestamp {text.strip()[:200]!r}") from None
    return tuple(sorted(pairs)), value, ts_ms


def _metadata(comments: pa.Array, pos: np.ndarray, lines: list[str], line_offset: int = 0) -> list[MetricMetadata]:
    if len(comments) == 0:
        return []
    ex = pc.extract_regex(comments, _META_RE)
    valid = ex.is_valid().to_numpy(zero_copy_only=False)
    if not valid.any():
        return []
    ex = ex.filter(pa.array(valid))
    lines_no = pos[valid]
    fam: dict[str, MetricMetadata] = {}
    for (kind, name, rest), ln in zip(zip(ex.field("kind").to_pylist(), ex.field("name").to_pylist(),
                                          ex.field("rest").to_pylist()), lines_no.tolist()):
        if name.startswith('"'):
            name = _unescape_value(name[1:-1])
        m = fam.get(name)
        if m is None:
            m = fam[name] = MetricMetadata(name)
        rest = rest or ""
        if kind == "TYPE":
            t = rest.strip().lower()
            if t not in _TYPES:
                raise _bad_line(lines, ln, f"unknown metric type {t!r}", line_offset)
            m.type = "unknown" if t == "untyped" else t
        elif kind == "HELP":
            m.help = _HELP_UNESCAPE.sub(lambda r: "\n" if r.group(1) == "n" else r.group(1), rest) if "\\" in rest else rest
        else:
            m.unit = rest.strip()
    return list(fam.values())
