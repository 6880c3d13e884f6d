"""Result comparison for the promqltest runner (FORMAT.md 4.1-4.3): returns an error message, or
None when the result matches the expectation. Wording follows the upstream runner's messages."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from storage.labels import Labels, format_labels
from storage.stale import is_stale_value

from promql.promqltest_script import EvalCmd, Hist
from promql.types import FloatHistogram
from promql.eval_histogram_buckets import histogram_string

EPSILON = 1e-6
_MIN_NORMAL = 2.2250738585072014e-308


def almost_equal(a: float, b: float, eps: float = EPSILON) -> bool:
    """Prometheus util/almost.Equal (StaleNaN only equals StaleNaN)."""
    if math.isnan(a) and math.isnan(b):
        return is_stale_value(a) == is_stale_value(b)
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < _MIN_NORMAL:
        return diff < eps * _MIN_NORMAL
    return diff / min(abs_sum, 1.7976931348623157e308) < eps


def fmt_value(v: float) -> str:
    if math.isnan(v):
        return "StaleNaN" if is_stale_value(v) else "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(float(v))
    return r[:-2] if r.endswith(".0") else r


def fmt_seq(vals: list) -> str:
    return "[" + " ".join("_" if v is None else (v.text if isinstance(v, Hist) else fmt_value(v)) for v in vals) + "]"


@dataclass
class Series:
    labels: Labels
    ts: np.ndarray  # int64
    vals: np.ndarray  # float64
    hist: list[tuple[int, FloatHistogram]] = field(default_factory=list)  # native-histogram points


def hist_text(h: FloatHistogram) -> str:

    return histogram_string(h)


def histograms_match(exp: Hist, act: FloatHistogram) -> bool:
    """FORMAT.md 4.3: compacted histograms; schema, zero threshold, bucket layout and custom
    bounds equal, counts and sum within epsilon; the reset hint only when written explicitly."""
    e = exp.value
    if e is None:
        return False
    a, e = act.compact(), e.compact()
    if a.schema != e.schema or a.zero_threshold != e.zero_threshold:
        return False
    if not (almost_equal(a.count, e.count) and almost_equal(a.sum, e.sum) and almost_equal(a.zero_count, e.zero_count)):
        return False
    for xa, xe in ((a.positive, e.positive), (a.negative, e.negative)):
        if [i for i, _ in xa] != [i for i, _ in xe]:
            return False
        if not all(almost_equal(ca, ce) for (_, ca), (_, ce) in zip(xa, xe)):
            return False
    if e.uses_custom_buckets and a.custom_values != e.custom_values:
        return False
    if "counter_reset_hint" in exp.text and a.counter_reset_hint != e.counter_reset_hint:
        return False
    return True


@dataclass
class Actual:
    """A query result in a shape the comparison understands."""

    kind: str  # vector | matrix | scalar | string
    vector: list[tuple[Labels, float | FloatHistogram]] | None = None
    matrix: list[Series] | None = None
    scalar: float = 0.0
    string: str = ""


def from_query_result(res) -> Actual:
    """Convert promql.types.QueryResult."""
    rt = res.result_type
    if rt == "scalar":
        return Actual("scalar", scalar=float(res.scalar))
    if rt == "string":
        return Actual("string", string=res.string)
    hists = getattr(res, "histograms", None) or []
    if rt == "vector":
        vals = np.asarray(res.values, dtype=np.float64).reshape(-1) if res.values is not None else np.empty(0)
        vec: list[tuple[Labels, float | FloatHistogram]] = [(lbl, float(vals[i])) for i, lbl in enumerate(res.labels)]
        vec += [(lbl, pts[0][1]) for lbl, pts in hists]
        return Actual("vector", vector=vec)
    if rt == "matrix":
        out: list[Series] = []
        if res.csr is not None:
            off, ts, vs = res.csr
            for i, lbl in enumerate(res.labels):
                a, b = int(off[i]), int(off[i + 1])
                out.append(Series(lbl, np.asarray(ts[a:b], np.int64), np.asarray(vs[a:b], np.float64)))
        else:
            tsteps = np.asarray(res.timestamps, np.int64)
            values = np.asarray(res.values, np.float64).reshape(len(res.labels), len(tsteps))
            present = (np.ones_like(values, dtype=bool) if res.present is None
                       else np.asarray(res.present, bool).reshape(values.shape))
            for i, lbl in enumerate(res.labels):
                m = present[i]
                out.append(Series(lbl, tsteps[m], values[i][m]))
        if hists:
            by = {s.labels: s for s in out}
            for lbl, pts in hists:
                if lbl not in by:
                    by[lbl] = Series(lbl, np.empty(0, np.int64), np.empty(0))
                by[lbl].hist = list(pts)
            out = [by[l] for l in sorted(by)]
        return Actual("matrix", matrix=out)
    raise ValueError(f"unknown result type {rt!r}")


def _series_str(s: Series) -> str:
    pts = " ".join(f"{fmt_value(v)} @[{t}]" for t, v in zip(s.ts.tolist(), s.vals.tolist()))
    n = len(s.ts)
    out = f"{n} float point{'' if n == 1 else 's'} [{pts}]"
    if s.hist:
        out += f" and {len(s.hist)} histogram point{'' if len(s.hist) == 1 else 's'} [" + " ".join(
            f"{hist_text(h)} @[{t}]" for t, h in s.hist) + "]"
    return out


def _fmt_any(v: float | FloatHistogram) -> str:
    return hist_text(v) if isinstance(v, FloatHistogram) else fmt_value(v)


def assert_matrix_sorted(m: list[Series]) -> str | None:
    for i in range(len(m) - 1):
        if m[i].labels > m[i + 1].labels:
            return (f"matrix results should always be sorted by labels, but matrix is not sorted: series at index {i + 1} "
                    f"with labels {format_labels(m[i + 1].labels)} sorts before series at index {i} with labels {format_labels(m[i].labels)}")
    return None


def compare(cmd: EvalCmd, act: Actual) -> str | None:
    exp = cmd.expected
    if act.kind == "matrix":
        assert act.matrix is not None
        if cmd.is_ordered:
            return "expected ordered result, but query returned a matrix"
        if cmd.expect_scalar:
            return "expected scalar result, but got matrix"
        err = assert_matrix_sorted(act.matrix)
        if err:
            return err
        seen = set()
        for s in act.matrix:
            if s.labels not in exp:
                return f"unexpected metric {format_labels(s.labels)} in result, has {_series_str(s)}"
            seen.add(s.labels)
            _, vals = exp[s.labels]
            exp_t: list[int] = []
            exp_v: list[float] = []
            exp_h: list[tuple[int, Hist]] = []
            for i, v in enumerate(vals):
                t = cmd.start_ms + i * cmd.step_ms
                if t > cmd.end_ms:
                    return f"expected {len(vals)} points for {format_labels(s.labels)}, but query time range cannot return this many points"
                if isinstance(v, Hist):
                    exp_h.append((t, v))
                elif v is not None:
                    exp_t.append(t)
                    exp_v.append(v)
            if len(exp_t) != len(s.ts) or len(exp_h) != len(s.hist):
                return (f"expected {len(exp_t)} float points and {len(exp_h)} histogram points for {format_labels(s.labels)}, "
                        f"but got {_series_str(s)}")
            for i, ((t, eh), (at, ah)) in enumerate(zip(exp_h, s.hist)):
                if t != at:
                    return (f"expected histogram value at index {i} for {format_labels(s.labels)} to have timestamp {t}, "
                            f"but it had timestamp {at} (result has {_series_str(s)})")
                if not histograms_match(eh, ah):
                    return (f"expected histogram value at index {i} (t={at}) for {format_labels(s.labels)} to be {eh.text}, "
                            f"but got {hist_text(ah)}")
            for i, (t, v) in enumerate(zip(exp_t, exp_v)):
                at, av = int(s.ts[i]), float(s.vals[i])
                if t != at:
                    return (f"expected float value at index {i} for {format_labels(s.labels)} to have timestamp {t}, "
                            f"but it had timestamp {at} (result has {_series_str(s)})")
                if not almost_equal(av, v):
                    return (f"expected float value at index {i} (t={at}) for {format_labels(s.labels)} to be {fmt_value(v)}, "
                            f"but got {fmt_value(av)} (result has {_series_str(s)})")
        for lbl in exp:
            if lbl not in seen:
                return f"expected metric {format_labels(lbl)} not found"
        return None
    if act.kind == "vector":
        assert act.vector is not None
        if cmd.expect_scalar:
            return "expected scalar result, but got vector " + _vector_str(act.vector)
        seen = set()
        for pos, (lbl, v) in enumerate(act.vector):
            if lbl not in exp:
                return f"unexpected metric {format_labels(lbl)} in result, has value {_fmt_any(v)}"
            epos, vals = exp[lbl]
            if cmd.is_ordered and epos != pos + 1:
                return f"expected metric {format_labels(lbl)} with {fmt_seq(vals)} at position {epos} but was at {pos + 1}"
            e0 = vals[0] if vals else None
            if isinstance(v, FloatHistogram):
                if not isinstance(e0, Hist):
                    return f"expected float value {fmt_value(e0) if e0 is not None else '_'} for {format_labels(lbl)} but got histogram {hist_text(v)}"
                if not histograms_match(e0, v):
                    return f"expected histogram {e0.text} for {format_labels(lbl)} but got {hist_text(v)}"
                seen.add(lbl)
                continue
            if isinstance(e0, Hist):
                return f"expected histogram {e0.text} for {format_labels(lbl)} but got float value {fmt_value(v)}"
            if e0 is None:
                return f"expected no value for {format_labels(lbl)} but got {fmt_value(v)}"
            if not almost_equal(e0, v):
                return f"expected {fmt_value(e0)} for {format_labels(lbl)} but got {fmt_value(v)}"
            seen.add(lbl)
        for lbl, (_, vals) in exp.items():
            if lbl not in seen:
                return f"expected metric {format_labels(lbl)} with {fmt_seq(vals)} not found"
        return None
    if act.kind == "scalar":
        if not cmd.expect_scalar:
            return f"expected vector or matrix result, but got scalar {fmt_value(act.scalar)}"
        if not almost_equal(cmd.scalar, act.scalar):
            return f"expected scalar {fmt_value(cmd.scalar)} but got {fmt_value(act.scalar)}"
        return None
    if act.kind == "string":
        if cmd.expected_string != act.string:
            return f'expected string "{cmd.expected_string}" but got "{act.string}"'
        return None
    return f"unexpected result type {act.kind}"


def _vector_str(vec: list[tuple[Labels, float | FloatHistogram]]) -> str:
    return "{" + ", ".join(f"{format_labels(l)} => {_fmt_any(v)}" for l, v in vec) + "}"


def check_annotations(cmd: EvalCmd, expr: str, warnings: list[str], infos: list[str]) -> str | None:
    if cmd.warn and not warnings:
        return f"expected warnings evaluating query {expr!r} but got none"
    if cmd.info and not infos:
        return f"expected info annotations evaluating query {expr!r} but got none"
    for kind, actual in (("warn", warnings), ("info", infos)):
        exps = cmd.expects.get(kind, [])
        if not exps:
            continue
        if not actual:
            return f"expected {kind} annotations but none were found for query {expr!r}"
        for e in exps:
            if not any(e.matches(a) for a in actual):
                return f"expected {kind} annotation matching {e.describe()} but no matching annotation was found for query {expr!r}, found: {warnings + infos}"
        for a in actual:
            if not any(e.matches(a) for e in exps):
                return f"unexpected {kind} annotation {a!r} found for query {expr!r}"
    if cmd.expects.get("no_warn") and warnings:
        return f"unexpected warning annotations evaluating query {expr!r}: {warnings}"
    if cmd.expects.get("no_info") and infos:
        return f"unexpected info annotations evaluating query {expr!r}: {infos}"
    return None


def check_expected_failure(cmd: EvalCmd, err: str) -> str | None:
    if cmd.expected_fail_message is not None and cmd.expected_fail_message != err:
        return f"expected error {cmd.expected_fail_message!r} evaluating query {cmd.expr!r}, but got: {err}"
    if cmd.expected_fail_regexp is not None and not cmd.expected_fail_regexp.search(err):
        return f"expected error matching pattern {cmd.expected_fail_regexp.pattern!r} evaluating query {cmd.expr!r}, but got: {err}"
    fails = cmd.expects.get("fail", [])
    if fails and not fails[0].matches(err):
        return f"expected error matching {fails[0].describe()} evaluating query {cmd.expr!r}, but got: {err}"
    return None

