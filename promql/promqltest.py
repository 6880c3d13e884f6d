"""Runner for Prometheus's promqltest conformance scripts (../shared/promqltest/FORMAT.md).

    python -m promql.promqltest FILE... [--storage memory|tsdb] [-v] [--native-histograms]

Runs every ``eval`` in-process against our storage and ``promql.engine.Engine``, including the two
cross-checks upstream performs for instant evals (FORMAT.md 4.4): the re-run with ``@ t`` attached
at other evaluation times, and the re-run as a range query around t. Prints one line per failure
(``file:line: query: diff``), per-file counts, and closes with ``N passed, N failed, N skipped``
(stable float evals only; experimental and native-histogram evals are reported separately and
counted as skipped). Exit status 1 when a stable eval failed. ``--native-histograms`` also runs
the native-histogram evals (reported on their own line).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from storage.batch import SampleBatch
from storage.labels import Labels

from promql.errors import PromQLError
from promql.memory_source import HistogramOverlay, MemorySource
from promql.printer import to_promql
from promql.ast_walk import walk
from promql.promqltest_classify import EXP, NH, PLAIN, LoadedState, classify
from promql.promqltest_compare import Actual, check_annotations, check_expected_failure, compare, from_query_result
from promql.promqltest_script import ClearCmd, EvalCmd, Hist, LoadCmd, ScriptError, parse_script
from promql.types import FloatHistogram

from promql import parser as pp
from promql.engine import Engine
from promql.eval_histogram_rate import detect_reset
from promql.promqltest_compare import assert_matrix_sorted
from storage.options import StorageOptions
from storage.tsdb import TSDB

MAX_SAMPLES = 10_000  # upstream NewTestEngine(t, false, 0, 10000)
TIMEOUT_S = 100.0
LOOKBACK_MS = 300_000
SUBQUERY_STEP_MS = 60_000

# FORMAT.md 4.4.1: functions whose value depends on the evaluation time even with @-pinned args
AT_MODIFIER_UNSAFE = frozenset({
    "days_in_month", "day_of_month", "day_of_week", "day_of_year", "end", "hour", "minute", "month",
    "year", "predict_linear", "range", "start", "step", "time", "timestamp",
})
_QUERY_CONTEXT_FUNCS = re.compile(r"(start|end|range|step)\(\)")


@dataclass
class Outcome:
    file: str
    line: int
    expr: str
    kind: str  # plain | exp | nh
    status: str  # pass | fail | skip
    message: str = ""

    @property
    def case_id(self) -> str:
        return f"{self.file}:{self.line}"


# ---------------------------------------------------------------------------------------------
# storage backends


class _Store:
    """The storage the evals read: MemorySource, or the real TSDB (storage.tsdb) in a temp dir.

    The real storage is float-only: native-histogram samples of a ``load`` go to an in-memory
    histogram store beside it, and the engine reads both through ``engine_source`` (the float
    source itself while no histogram was loaded)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.tmp: str | None = None
        self.source: Any = None
        self.hists: MemorySource | None = None
        self.reset()

    @property
    def engine_source(self) -> Any:
        if self.hists is None:
            return self.source
        if self.source is self.hists:
            return self.source
        return HistogramOverlay(self.source, self.hists)

    def reset(self) -> None:
        self.close()
        self.hists = None
        self._last: dict[Labels, FloatHistogram | None] = {}  # last sample per series (None = float)
        if self.kind == "memory":
            self.source = MemorySource()
        elif self.kind == "tsdb":

            self.tmp = tempfile.mkdtemp(prefix="promqltest-")
            opts = StorageOptions(out_of_order_window_ms=1 << 50, retention_ms=1 << 55, wal_fsync="never",
                                  future_tolerance_ms=1 << 55)
            try:
                self.source = TSDB(self.tmp, opts, background=False)
            except TypeError:
                self.source = TSDB(self.tmp, opts)
        else:
            raise ValueError(f"unknown storage {self.kind!r} (memory|tsdb)")

    def _add_histograms(self, lbl: Labels, ts: list[int], hists: list[Any]) -> None:
        if self.hists is None:
            self.hists = self.source if isinstance(self.source, MemorySource) else MemorySource()
        self.hists.add_histograms(lbl, np.asarray(ts, np.int64), hists)

    def _storage_hints(self, lbl: Labels, vals: list[Any]) -> dict[int, FloatHistogram]:
        """Counter-reset hints as Prometheus's TSDB hands histograms back: a sample continuing a
        counter histogram chunk reads ``not_reset``; the first one of a chunk -- after a float
        sample or a gauge, or at a detected counter reset -- ``unknown``; gauges stay gauges."""

        out: dict[int, FloatHistogram] = {}
        prev = self._last.get(lbl)
        for i, v in enumerate(vals):
            if v is None:
                continue
            if not isinstance(v, Hist) or v.value is None:
                prev = None
                continue
            h = v.value
            hint = h.counter_reset_hint
            if hint != "gauge":
                cont = prev is not None and prev.counter_reset_hint != "gauge" \
                    and prev.uses_custom_buckets == h.uses_custom_buckets
                try:
                    cont = cont and not detect_reset(h, prev)  # type: ignore[arg-type]
                except PromQLError:
                    cont = False
                hint = "not_reset" if cont else "unknown"
            out[i] = FloatHistogram(h.schema, h.count, h.sum, h.zero_threshold, h.zero_count, h.positive, h.negative,
                                    h.custom_values, hint)
            prev = h
        self._last[lbl] = prev
        return out

    def load(self, cmd: LoadCmd) -> None:
        if cmd.with_nhcb:
            for base, samples in nhcb_histograms(cmd).items():
                self._add_histograms(base, [t for t, _ in samples], [h for _, h in samples])
        items: list[tuple[Labels, np.ndarray, np.ndarray]] = []
        for lbl, vals in cmd.series.items():
            hidx = [i for i, v in enumerate(vals) if isinstance(v, Hist) and v.value is not None]
            if hidx:
                hints = self._storage_hints(lbl, vals)
                self._add_histograms(lbl, [i * cmd.interval_ms for i in hidx], [hints[i] for i in hidx])
            elif any(v is not None for v in vals):
                self._last[lbl] = None
            idx = [i for i, v in enumerate(vals) if v is not None and not isinstance(v, Hist)]
            if not idx:
                continue
            ts = np.asarray(idx, np.int64) * cmd.interval_ms
            vs = np.asarray([vals[i] for i in idx], np.float64)
            items.append((lbl, ts, vs))
        if not items:
            return
        batch = SampleBatch.from_series(items)
        res = self.source.append(batch)
        rejected = getattr(res, "rejected_total", 0)
        if rejected:
            raise RuntimeError(f"storage rejected {rejected} samples of load at line {cmd.line}: {getattr(res, 'errors', '')}")

    def close(self) -> None:
        if self.source is not None and hasattr(self.source, "close"):
            try:
                self.source.close()
            except Exception:  # noqa: BLE001 - best effort on teardown
                pass
        self.source = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


_NHCB_SUFFIXES = (("_bucket", "bucket"), ("_sum", "sum"), ("_count", "count"))


def nhcb_histograms(cmd: LoadCmd) -> dict[Labels, list[tuple[int, FloatHistogram]]]:
    """``load_with_nhcb`` (FORMAT.md 3.3): every classic histogram family of the block
    (``X_bucket{le=...}``, ``X_count``, ``X_sum``) as custom-bucket native histograms (schema -53)
    under ``X``, per timestamp. A timestamp whose buckets are not cumulative or whose count does
    not match the +Inf bucket gets no histogram (Prometheus refuses such a load)."""
    temp: dict[Labels, dict[int, dict[str, Any]]] = {}
    for lbl, vals in cmd.series.items():  # per series, then per sample of the (small) script
        d = dict(lbl)
        name = d.get("__name__", "")
        kind = next((k for suf, k in _NHCB_SUFFIXES if name.endswith(suf)), None)
        if kind is None:
            continue
        base_name = name[: -len(next(suf for suf, k in _NHCB_SUFFIXES if k == kind))]
        le = 0.0
        if kind == "bucket":
            try:
                le = float(d.get("le", "nan"))
            except ValueError:
                continue
            if math.isnan(le):
                continue
        base: Labels = tuple(sorted([(k, v) for k, v in lbl if k not in ("__name__", "le")] + [("__name__", base_name)]))
        per_ts = temp.setdefault(base, {})
        for i, v in enumerate(vals):
            if v is None or isinstance(v, Hist):
                continue
            th = per_ts.setdefault(i * cmd.interval_ms, {"buckets": {}, "count": None, "sum": 0.0})
            if kind == "bucket":
                th["buckets"].setdefault(le, float(v))
            elif kind == "count":
                th["count"] = float(v)
            else:
                th["sum"] = float(v)
    out: dict[Labels, list[tuple[int, FloatHistogram]]] = {}
    for base, per_ts in temp.items():
        samples = []
        for t in sorted(per_ts):
            h = _convert_nhcb(per_ts[t])
            if h is not None:
                samples.append((t, h))
        if samples:
            out[base] = samples
    return out


def _convert_nhcb(th: dict[str, Any]) -> FloatHistogram | None:
    les = sorted(th["buckets"])
    cum = [th["buckets"][le] for le in les]
    if any(c < 0 for c in cum) or any(b < a for a, b in zip(cum, cum[1:])):
        return None
    count = th["count"] if th["count"] is not None else (cum[-1] if cum else 0.0)
    if count < 0:
        return None
    if not les or les[-1] != math.inf:
        les.append(math.inf)
        cum.append(count)
    if count != cum[-1]:
        return None
    deltas = [b - a for a, b in zip([0.0] + cum[:-1], cum)]
    return FloatHistogram(schema=-53, count=count, sum=th["sum"], positive=tuple(enumerate(deltas)),
                          custom_values=tuple(les[:-1]))


def default_storage() -> str:
    """``tsdb`` when the real storage imports (the issue: the runner runs against our storage)."""
    env = os.environ.get("PROMQLTEST_STORAGE")
    if env:
        return env
    try:
        import storage.tsdb  # noqa: F401
    except Exception:  # noqa: BLE001
        return "memory"
    return "tsdb"


EngineFactory = Callable[[Any], Any]


def default_engine_factory(source: Any) -> Any:

    return Engine(source, lookback_delta_ms=LOOKBACK_MS, max_samples=MAX_SAMPLES, timeout_s=TIMEOUT_S,
                  default_subquery_step_ms=SUBQUERY_STEP_MS)


# ---------------------------------------------------------------------------------------------
# one eval


class _Fail(Exception):
    pass


def _annotations(res: Any) -> tuple[list[str], list[str]]:
    ann = getattr(res, "annotations", None)
    if ann is None:
        return [], []
    return list(ann.warnings), list(ann.infos)


def at_modifier_cases(expr: str, eval_ms: int, ast: Any) -> list[tuple[str, int]]:
    """FORMAT.md 4.4.1: the expression with ``@ t`` attached, and the times to evaluate it at."""
    for n in walk(ast):
        if isinstance(n, pp.Call) and n.func.name in AT_MODIFIER_UNSAFE:
            return []
    new_expr = to_promql(ast, inject_at_ms=eval_ms)
    times = [-10 * eval_ms, 0, eval_ms // 5 if eval_ms >= 0 else -((-eval_ms) // 5), eval_ms, 10 * eval_ms]
    if eval_ms == 0:
        times = [-1000, 0, 1000]
    return [(new_expr, t) for t in times]


class EvalRunner:
    def __init__(self, engine: Any):
        self.engine = engine

    def run(self, cmd: EvalCmd, ast: Any) -> None:
        """Raise _Fail(message) when the eval does not hold."""
        if cmd.is_range:
            self._run_range(cmd)
            return
        queries = [(cmd.expr, cmd.eval_ms)]
        if ast is not None:
            try:
                queries += at_modifier_cases(cmd.expr, cmd.eval_ms, ast)
            except TypeError as e:
                raise _Fail(f"printer cannot render the query for the @ re-run: {e}") from None
        for expr, t in queries:
            self._run_instant(cmd, expr, t, rerun=(expr, t) != (cmd.expr, cmd.eval_ms))

    def _run_range(self, cmd: EvalCmd) -> None:
        try:
            res = self.engine.range_query(cmd.expr, cmd.start_ms, cmd.end_ms, cmd.step_ms)
        except PromQLError as e:
            if cmd.is_fail:
                msg = check_expected_failure(cmd, str(e))
                if msg:
                    raise _Fail(msg) from None
                return
            raise _Fail(f"error evaluating query {cmd.expr!r}: {e}") from None
        if cmd.is_fail:
            raise _Fail(f"expected error evaluating query {cmd.expr!r} but got none")
        w, i = _annotations(res)
        msg = check_annotations(cmd, cmd.expr, w, i)
        if msg:
            raise _Fail(msg)
        msg = compare(cmd, from_query_result(res))
        if msg:
            raise _Fail(f"range query: {msg}")

    def _run_instant(self, cmd: EvalCmd, expr: str, t: int, rerun: bool) -> None:
        where = f" [@ re-run at t={t}ms: {expr}]" if rerun else ""
        try:
            res = self.engine.instant_query(expr, t)
        except PromQLError as e:
            if cmd.is_fail:
                msg = check_expected_failure(cmd, str(e))
                if msg:
                    raise _Fail(msg + where) from None
                return
            raise _Fail(f"error evaluating query {expr!r} at t={t}ms: {e}") from None
        if cmd.is_fail:
            raise _Fail(f"expected error evaluating query {expr!r} but got none{where}")
        w, i = _annotations(res)
        msg = check_annotations(cmd, expr, w, i)
        if msg:
            raise _Fail(msg + where)
        act = from_query_result(res)
        msg = compare(cmd, act)
        if msg:
            raise _Fail(msg + where)
        if cmd.exclude_from_range_query or _QUERY_CONTEXT_FUNCS.search(expr):
            return
        # FORMAT.md 4.4.2: the same expression as a range query around t; the middle step must match
        try:
            rres = self.engine.range_query(expr, t - 60_000, t + 60_000, 60_000)
        except PromQLError as e:
            raise _Fail(f"error evaluating query {expr!r} in range mode (t={t}ms): {e}") from None
        if cmd.is_ordered:
            return
        ract = from_query_result(rres)
        if ract.kind != "matrix" or ract.matrix is None:
            raise _Fail(f"range mode returned {ract.kind}, not a matrix{where}")

        err = assert_matrix_sorted(ract.matrix)
        if err:
            raise _Fail(f"range mode: {err}{where}")
        vec: list[tuple[Labels, Any]] = []
        for s in ract.matrix:
            hit = np.flatnonzero(s.ts == t)
            if len(hit):
                vec.append((s.labels, float(s.vals[hit[0]])))
            else:
                vec.extend((s.labels, h) for ht, h in s.hist if ht == t)
        if act.kind == "scalar":
            if not vec:
                raise _Fail(f"range mode (t={t}ms): scalar query returned no point at t{where}")
            ract2 = Actual("scalar", scalar=vec[0][1])
        else:
            ract2 = Actual("vector", vector=vec)
        msg = compare(cmd, ract2)
        if msg:
            raise _Fail(f"range mode (query_range {t - 60_000}..{t + 60_000} step 60000): {msg}{where}")


# ---------------------------------------------------------------------------------------------
# files


@dataclass
class FileRunner:
    storage: str = "memory"
    engine_factory: EngineFactory = default_engine_factory
    run_experimental: bool = True
    # Also run the native-histogram evals (the engine gives histogram samples Prometheus's
    # semantics and returns histogram results); reported separately, never in the closing counts.
    run_native_histograms: bool = False
    only_lines: set[int] | None = None  # run just these eval lines (loads/clears always run)
    # Called with each eval before it runs (after classification); may change its expectations in
    # place (the mutation sweep in tests/test_promqltest_mutations.py). Returns a description, or
    # None to skip the eval.
    mutate: Callable[[EvalCmd], str | None] | None = None

    def run_text(self, name: str, text: str) -> list[Outcome]:
        try:
            cmds = parse_script(text)
        except ScriptError as e:
            return [Outcome(name, e.line, "", PLAIN, "fail", f"script error: {e}")]
        out: list[Outcome] = []
        store = _Store(self.storage)
        state = LoadedState()
        engine = None
        engine_error: str | None = None
        try:
            for cmd in cmds:
                if isinstance(cmd, ClearCmd):
                    store.reset()
                    state.clear()
                    engine = None
                elif isinstance(cmd, LoadCmd):
                    store.load(cmd)
                    state.add_load(cmd)
                    engine = None
                else:
                    if self.only_lines is not None and cmd.line not in self.only_lines:
                        continue
                    cl = classify(cmd, state)
                    if cl.kind == NH and not (self.run_native_histograms and cl.parse_error is None):
                        out.append(Outcome(name, cmd.line, cmd.expr, NH, "skip", f"native histograms: {cl.reason}"))
                        continue
                    if cl.kind == EXP and (cl.parse_error is not None or not self.run_experimental):
                        out.append(Outcome(name, cmd.line, cmd.expr, EXP, "skip", f"experimental: {cl.reason}"))
                        continue
                    if self.mutate is not None:
                        what = self.mutate(cmd)
                        if what is None:
                            continue
                    if engine is None and engine_error is None:
                        try:
                            engine = self.engine_factory(store.engine_source)
                            if self.run_native_histograms and hasattr(engine, "histogram_results"):
                                engine.histogram_results = True  # compare histogram results too
                        except Exception as e:  # noqa: BLE001 - reported per eval
                            engine_error = f"engine unavailable: {type(e).__name__}: {e}"
                    if engine is None:
                        out.append(Outcome(name, cmd.line, cmd.expr, cl.kind, "fail", engine_error or "no engine"))
                        continue
                    try:
                        EvalRunner(engine).run(cmd, cl.ast)
                        out.append(Outcome(name, cmd.line, cmd.expr, cl.kind, "pass"))
                    except _Fail as f:
                        out.append(Outcome(name, cmd.line, cmd.expr, cl.kind, "fail", str(f)))
                    except Exception as e:  # noqa: BLE001 - an engine crash is a failure of that eval
                        out.append(Outcome(name, cmd.line, cmd.expr, cl.kind, "fail", f"crash: {type(e).__name__}: {e}"))
        finally:
            store.close()
        return out

    def run_file(self, path: str | Path) -> list[Outcome]:
        p = Path(path)
        return self.run_text(p.name, p.read_text())


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, kind: str | None, status: str) -> int:
        return sum(1 for o in self.outcomes if (kind is None or o.kind == kind) and o.status == status)

    @property
    def passed(self) -> int:
        return self.count(PLAIN, "pass")

    @property
    def failed(self) -> int:
        return self.count(PLAIN, "fail")

    @property
    def skipped(self) -> int:
        return sum(1 for o in self.outcomes if o.kind != PLAIN or o.status == "skip")


def run_files(paths: Iterable[str | Path], storage: str = "memory", engine_factory: EngineFactory = default_engine_factory,
              out=sys.stdout, verbose: bool = False, native_histograms: bool = False) -> Summary:
    summary = Summary()
    runner = FileRunner(storage=storage, engine_factory=engine_factory, run_native_histograms=native_histograms)
    for path in paths:
        t0 = time.monotonic()
        outs = runner.run_file(path)
        summary.outcomes.extend(outs)
        for o in outs:
            if o.status == "fail" and (o.kind == PLAIN or verbose):
                tag = "" if o.kind == PLAIN else f" [{o.kind}]"
                print(f"FAIL{tag} {o.case_id}: {o.expr}: {o.message}", file=out)
            elif verbose and o.status == "skip":
                print(f"SKIP {o.case_id}: {o.expr}: {o.message}", file=out)
        fs = Summary(outs)
        print(f"{Path(path).name}: plain {fs.count(PLAIN, 'pass')} passed, {fs.count(PLAIN, 'fail')} failed; "
              f"experimental {fs.count(EXP, 'pass')} passed, {fs.count(EXP, 'fail')} failed, {fs.count(EXP, 'skip')} not parseable; "
              f"native-histogram {_nh_counts(fs)} ({time.monotonic() - t0:.1f}s)", file=out)
    print(f"experimental (counted as skipped below): {summary.count(EXP, 'pass')} passed, {summary.count(EXP, 'fail')} failed, "
          f"{summary.count(EXP, 'skip')} not parseable; native-histogram {'skipped: ' if not native_histograms else ''}"
          f"{_nh_counts(summary) if native_histograms else summary.count(NH, 'skip')}", file=out)
    print(f"{summary.passed} passed, {summary.failed} failed, {summary.skipped} skipped", file=out)
    return summary


def _nh_counts(s: Summary) -> str:
    if s.count(NH, "pass") or s.count(NH, "fail"):
        return f"{s.count(NH, 'pass')} passed, {s.count(NH, 'fail')} failed, {s.count(NH, 'skip')} skipped"
    return f"{s.count(NH, 'skip')} skipped"


def default_files() -> list[Path]:
    shared = Path(__file__).resolve().parent.parent.parent / "shared" / "promqltest"
    return sorted(shared.glob("*.test"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m promql.promqltest", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="promqltest files (default: every ../shared/promqltest/*.test)")
    ap.add_argument("--storage", choices=("memory", "tsdb"), default=None,
                    help="data source: in-memory arrays or the real TSDB (default: tsdb when it imports)")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print experimental failures and skips")
    ap.add_argument("--native-histograms", action="store_true",
                    help="also run the native-histogram evals (reported separately)")
    args = ap.parse_args(argv)
    files = [Path(f) for f in args.files] or default_files()
    summary = run_files(files, storage=args.storage or default_storage(), verbose=args.verbose,
                        native_histograms=args.native_histograms)
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
