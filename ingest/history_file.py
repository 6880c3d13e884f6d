"""History files for backfill (``turboprom import FILE``) -> one columnar batch with line numbers.

Two formats:

- OpenMetrics / Prometheus text with a timestamp on every sample (what ``promtool tsdb
  create-blocks-from openmetrics`` reads). OpenMetrics (the file ends with ``# EOF``) has timestamps
  in seconds, the Prometheus text format in milliseconds. The file is parsed in pieces of whole
  lines by ``ingest.text_format.parse_text`` (Arrow/RE2, column-wise); label sets are built once per
  distinct series.
- CSV with a header: a metric name column (``__name__`` or ``metric``), ``timestamp``, ``value``, and
  any other columns as labels (an empty cell: no such label). Timestamps are RFC 3339 with a zone,
  Unix seconds (fractions allowed), or Unix milliseconds (integers of 12 digits and more). Read by
  ``pyarrow.csv``; series are found by combining the dictionary codes of the label columns (numpy),
  so no Python object is built per row.

Every refusal is an ``IngestError`` whose message starts with ``FILE:LINE:``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ingest.errors import IngestError
from ingest.text_format import parse_text
from ingest.text_import import TextImporter
from ingest.validation import validate_pairs
from storage.batch import SampleBatch
from storage.labels import Labels

PIECE_BYTES = 32 << 20  # text parsed this much at a time (whole lines)
NAME_COLUMNS = ("__name__", "metric")
TIME_COLUMN, VALUE_COLUMN = "timestamp", "value"
MS_DIGITS = 1e11  # a numeric CSV timestamp at least this large is in milliseconds (1e11 s is year 5138)

Progress = Callable[[int, int, int], None]  # (bytes read, file bytes, samples so far)


@dataclass
class HistoryData:
    batch: SampleBatch
    lines: np.ndarray  # int64, 1-based file line of each sample (messages)
    format: str  # "openmetrics" | "prometheus" | "csv"

    def line_of(self, position: int) -> int:
        return int(self.lines[position])


def detect_format(path: Path) -> str:
    if path.suffix.lower() == ".csv":
        return "csv"
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 256))
        tail = f.read().decode("utf-8", "replace").splitlines()
    last = next((ln.strip() for ln in reversed(tail) if ln.strip()), "")
    return "openmetrics" if last == "# EOF" else "prometheus"


def read_history(path: str | Path, fmt: str | None = None, progress: Progress | None = None,
                 name: str | None = None) -> HistoryData:
    """The whole file as one batch; raises IngestError('NAME:LINE: ...') on the first bad line
    (``name``: how messages call the file, default its file name)."""
    p = Path(path)
    name = name or p.name
    fmt = fmt or detect_format(p)
    try:
        if fmt == "csv":
            return _read_csv(p, progress)
        if fmt in ("openmetrics", "prometheus"):
            return _read_text(p, fmt == "openmetrics", progress)
    except IngestError as e:
        raise IngestError(e.reason, f"{name}:{e.message[5:] if e.message.startswith('line ') else ' ' + e.message}",
                          e.status) from None
    raise IngestError("bad_param", f"unknown import format {fmt!r} (known: openmetrics, prometheus, csv)")


def _read_text(path: Path, openmetrics: bool, progress: Progress | None) -> HistoryData:
    total = path.stat().st_size
    importer = TextImporter()
    index: dict[Labels, int] = {}
    series: list[Labels] = []
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    done, lines_before, n_samples = 0, 0, 0
    eof_seen = False
    with open(path, "rb") as f:
        rest = b""
        while True:
            chunk = f.read(PIECE_BYTES)
            done += len(chunk)
            last = not chunk or done >= total
            data = rest + chunk
            if not last:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    rest = data
                    continue
                piece, rest = data[:cut], data[cut:]
            else:
                piece, rest = data, b""
            if openmetrics and last:
                piece, eof_seen = _strip_eof(piece)
            if piece:
                parsed = parse_text(piece, openmetrics=openmetrics, terminated=False, line_offset=lines_before)
                if len(parsed):
                    if not parsed.has_ts.all():
                        ln = int(parsed.lines[np.argmin(parsed.has_ts)])
                        raise IngestError("bad_text", f"line {ln}: sample without a timestamp: an import needs one on every sample")
                    local = importer.labels_for(parsed, ())
                    remap = np.empty(len(local), np.int64)
                    for i, lbl in enumerate(local):  # per distinct series of the piece
                        g = index.get(lbl)
                        if g is None:
                            g = index[lbl] = len(series)
                            series.append(lbl)
                        remap[i] = g
                    parts.append((remap[parsed.series_index], parsed.timestamps, parsed.values, parsed.lines))
                    n_samples += len(parsed)
                lines_before += piece.count(b"\n")
            if progress is not None:
                progress(done, total, n_samples)
            if last:
                break
    if openmetrics and not eof_seen:
        raise IngestError("bad_text", f"line {lines_before}: OpenMetrics file without the '# EOF' terminator")
    return HistoryData(_batch(series, parts), _cat([p[3] for p in parts]), "openmetrics" if openmetrics else "prometheus")


def _strip_eof(piece: bytes) -> tuple[bytes, bool]:
    """The last piece of an OpenMetrics file without its ``# EOF`` line (and trailing blank lines)."""
    body = piece.rstrip(b"\r\n\t ")
    if body.endswith(b"# EOF") and (len(body) == 5 or body[-6:-5] == b"\n"):
        return body[:-5], True
    return piece, False


def _cat(arrays: list[np.ndarray], dtype=np.int64) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0, dtype)


def _batch(series: list[Labels], parts: list) -> SampleBatch:
    return SampleBatch(series, _cat([p[0] for p in parts]), _cat([p[1] for p in parts]),
                       _cat([p[2] for p in parts], np.float64))


def _bad_row_handler(found: list):
    def handle(row) -> str:
        if not found:
            found.append(row)
        return "skip"
    return handle


def _read_csv(path: Path, progress: Progress | None) -> HistoryData:
    found: list = []
    try:
        table = pcsv.read_csv(path, read_options=pcsv.ReadOptions(use_threads=True, block_size=16 << 20),
                              parse_options=pcsv.ParseOptions(invalid_row_handler=_bad_row_handler(found)),
                              convert_options=pcsv.ConvertOptions(column_types=_all_strings(path), strings_can_be_null=False))
    except pa.ArrowInvalid as e:
        raise IngestError("bad_csv", f"line 1: cannot read CSV: {' '.join(str(e).split())[:300]}") from None
    if found:
        r = found[0]
        where = f"line {r.number if r.number is not None else _line_of_text(path, r.text)}"
        raise IngestError("bad_csv", f"{where}: expected {r.expected_columns} columns (as in the header), found {r.actual_columns}: "
                                     f"{r.text[:200]!r}")
    cols = table.column_names
    name_col = next((c for c in NAME_COLUMNS if c in cols), None)
    missing = [c for c in (TIME_COLUMN, VALUE_COLUMN) if c not in cols] + ([] if name_col else ["__name__ (or metric)"])
    if missing:
        raise IngestError("bad_csv", f"line 1: the header lacks the column(s) {', '.join(missing)}; expected "
                                     f"__name__ (or metric), label columns, timestamp, value; found {', '.join(cols)}")
    dup = sorted({c for c in cols if cols.count(c) > 1})
    if dup:
        raise IngestError("bad_csv", f"line 1: duplicate header column(s) {', '.join(dup)}")
    n = table.num_rows
    lines = np.arange(2, n + 2, dtype=np.int64)  # the header is line 1; quoted newlines inside cells are not counted
    values = _csv_values(table.column(VALUE_COLUMN), lines)
    ts = _csv_times(table.column(TIME_COLUMN), lines)
    label_cols = [name_col] + [c for c in cols if c not in (name_col, TIME_COLUMN, VALUE_COLUMN)]
    names = ["__name__"] + label_cols[1:]
    codes, dicts = [], []
    key = np.zeros(n, np.int64)
    first = np.zeros(0, np.int64)
    for c in label_cols:
        enc = pc.dictionary_encode(table.column(c).combine_chunks())
        codes.append(enc.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        dicts.append(enc.dictionary.to_pylist())
        # combine with the previous columns' key and re-number densely (keeps the key in int64);
        # the first row of each combination names its series
        _, first, key = np.unique(key * (len(dicts[-1]) + 1) + codes[-1], return_index=True, return_inverse=True)
        key = key.astype(np.int64, copy=False).reshape(-1)
    series: list[Labels] = []
    for row in first.tolist():  # per distinct series
        pairs = [(nm, d[int(cd[row])]) for nm, d, cd in zip(names, dicts, codes)]
        if not pairs[0][1]:
            raise IngestError("bad_csv", f"line {int(lines[row])}: empty metric name")
        try:
            series.append(validate_pairs([(k, v) for k, v in pairs if v != ""]))
        except IngestError as e:
            raise IngestError(e.reason, f"line {int(lines[row])}: {e.message}") from None
    if progress is not None:
        size = path.stat().st_size
        progress(size, size, n)
    return HistoryData(SampleBatch(series, key, ts, values), lines, "csv")


def _line_of_text(path: Path, text: str) -> int | str:
    """The line holding ``text`` (a row the CSV reader refused; the parallel reader does not number rows)."""
    want = text.encode()
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):  # error path only
            if raw.rstrip(b"\r\n") == want:
                return i
    return "?"


def _all_strings(path: Path) -> dict[str, pa.DataType]:
    with open(path, "rb") as f:
        head = f.readline().decode("utf-8", "replace").strip("\r\n")
    return {c.strip().strip('"'): pa.string() for c in head.split(",")}


def _first_bad(mask: np.ndarray, lines: np.ndarray) -> int:
    return int(lines[int(np.argmax(mask))])


def _csv_values(col: pa.ChunkedArray, lines: np.ndarray) -> np.ndarray:
    col = pc.utf8_trim_whitespace(col.combine_chunks())
    try:
        return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    out = np.empty(len(col), np.float64)
    special = {"+inf": np.inf, "inf": np.inf, "-inf": -np.inf, "nan": np.nan}
    for i, s in enumerate(col.to_pylist()):  # error / odd-spelling path only
        try:
            out[i] = special[s.lower()] if s.lower() in special else float(s)
        except ValueError:
            raise IngestError("bad_csv", f"line {int(lines[i])}: invalid value {s!r}") from None
    return out


_NUMBER_RE = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"


def _csv_times(col: pa.ChunkedArray, lines: np.ndarray) -> np.ndarray:
    """RFC 3339 with a zone, Unix seconds, or Unix ms, in any mix (each cell by its own form)."""
    col = pc.utf8_trim_whitespace(col.combine_chunks())
    empty = pc.equal(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)
    if empty.any():
        raise IngestError("bad_csv", f"line {_first_bad(empty, lines)}: empty timestamp")
    numeric = pc.match_substring_regex(col, _NUMBER_RE).to_numpy(zero_copy_only=False)
    out = np.empty(len(col), np.int64)
    if numeric.any():
        f = pc.cast(col.filter(pa.array(numeric)), pa.float64()).to_numpy(zero_copy_only=False)
        ms = (np.abs(f) >= MS_DIGITS) & (f == np.floor(f))
        out[numeric] = np.where(ms, f, np.round(f * 1000.0)).astype(np.int64)
    if not numeric.all():
        texts = col.filter(pa.array(~numeric))
        try:
            out[~numeric] = pc.cast(texts, pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            rows = np.flatnonzero(~numeric)
            for j, text in enumerate(texts.to_pylist()):  # error path: find the first bad cell
                try:
                    pc.cast(pa.array([text]), pa.timestamp("ms", tz="UTC"))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise IngestError("bad_csv", f"line {int(lines[rows[j]])}: invalid timestamp {text!r} (expected RFC 3339 "
                                                 "with a zone, Unix seconds or Unix milliseconds)") from None
            raise
    return out
