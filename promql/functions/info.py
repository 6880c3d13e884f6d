"""info(v, [label selector]) (experimental): enrich series with the data labels of info metrics
(target_info by default) that share their identifying labels (instance, job).

The info series are selected like an instant vector (lookback, staleness, the base selector's
offset and @) through the evaluator's own selector code; the join then runs per base series with
the step dimension vectorized: for every info metric name, the candidate info series' sample
timestamps (S_info x T) pick the newest matching series per step, and steps sharing the same
choice share one output label set. Python work is per (base series, distinct choice), not per sample.
"""
from __future__ import annotations

import datetime as _dt

from typing import Any

import numpy as np
from promql import parser as pp

from promql.ast_walk import children
from promql.errors import BadData, ExecutionError
from storage.go_format import go_quote
from promql.histogram_planes import has_hist
from promql.eval_selectors import selector_matchers
from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import vector_arg
from promql.functions.labels import merge_same_labelsets
from promql.types import Value, VectorSteps
from storage.labels import METRIC_NAME, Labels, format_labels, get, make_labels
from storage.matchers import Matcher
from storage.regex import RegexError, quote_meta
from promql.eval_selectors import eval_vector_selector

_TARGET_INFO = "target_info"
_IDENTIFYING = ("instance", "job")


def _promql(m: Matcher) -> str:
    return f"{go_quote(m.name)}{m.op}{go_quote(m.value)}"


def _selector_matchers(vs: Any) -> list[Matcher]:
    try:
        return selector_matchers(vs)[0]
    except RegexError as e:
        raise BadData(str(e)) from None


def _effective_name_matchers(ms: list[Matcher]) -> list[Matcher]:
    if any(m.op in ("=", "=~") for m in ms):
        return ms
    if ms:
        return [Matcher(METRIC_NAME, "=~", ".+_info"), *ms]
    return [Matcher(METRIC_NAME, "=", _TARGET_INFO)]


def _first_selector(node: Any, path: tuple = ()) -> tuple[Any, tuple] | None:
    """Pre-order first VectorSelector under ``node`` and the path of its ancestors."""
    if isinstance(node, pp.VectorSelector):
        return node, path
    for c in children(node):
        found = _first_selector(c, path + (node,))
        if found is not None:
            return found
    return None


def _modifiers(node: Any) -> tuple[int, Any]:
    """Offset (ms) and @ for the info selector, as Prometheus derives them: the first base
    selector's, plus the offsets of enclosing subqueries until one of them carries an @."""
    found = _first_selector(node) if node is not None else None
    if found is None:
        return 0, None
    vs, path = found
    off_ms = 0
    off = getattr(vs, "offset", None)
    if off is not None:
        off_ms += int(round(off.total_seconds() * 1000))
    at = getattr(vs, "at", None)
    for anc in reversed(path):
        if at is not None:
            break
        if isinstance(anc, pp.SubqueryExpr):
            o = getattr(anc, "offset", None)
            if o is not None:
                off_ms += int(round(o.total_seconds() * 1000))
            at = getattr(anc, "at", None)
    return off_ms, at


@register("info", histograms=Histograms.UNSUPPORTED, keeps_name=True, experimental=True)
def info(ctx: FunctionContext, args: list[Value]) -> Value:
    base = vector_arg(args[0])
    T = base.num_steps
    node_args = list(getattr(ctx.node, "args", []) or [])
    data: dict[str, list[Matcher]] = {}
    info_name_ms: list[Matcher] = []
    if len(node_args) > 1 and isinstance(node_args[1], pp.VectorSelector):
        for m in _selector_matchers(node_args[1]):
            data.setdefault(m.name, []).append(m)
            if m.name == METRIC_NAME:
                info_name_ms.append(m)
    else:
        info_name_ms = [Matcher(METRIC_NAME, "=", _TARGET_INFO)]
    eff = _effective_name_matchers(info_name_ms)

    ignore = np.array([all(m.matches(get(lb, METRIC_NAME)) for m in eff) for lb in base.labels], dtype=bool)

    id_values: dict[str, set[str]] = {}
    for i, lb in enumerate(base.labels):
        if ignore[i]:
            continue
        for name in _IDENTIFYING:
            v = get(lb, name)
            if v:
                id_values.setdefault(name, set()).add(v)

    name_ms = [m for ms in data.values() for m in ms if m.name == METRIC_NAME]
    other_ms = [m for ms in data.values() for m in ms if m.name != METRIC_NAME]
    data = {k: [m for m in v if m.name != METRIC_NAME] for k, v in data.items() if k != METRIC_NAME}
    data = {k: v for k, v in data.items() if v}

    infos = VectorSteps.empty(T)
    if id_values:
        sel = [Matcher(name, "=~", "|".join(quote_meta(v) for v in sorted(vals)))
               for name, vals in sorted(id_values.items())]
        sel += other_ms + _effective_name_matchers(name_ms)
        # a selector by construction (Prometheus builds it in code: no "non-empty matcher" check)
        vs = pp.parse_metric_selector("{" + ", ".join(_promql(m) for m in sel) + "}")
        off_ms, vs.at = _modifiers(node_args[0] if node_args else None)
        vs.offset = _dt.timedelta(milliseconds=off_ms) if off_ms else None

        eval_ctx = ctx.extra.get("eval_ctx")
        if eval_ctx is None:
            raise ExecutionError("info() needs the evaluator's context to select info series")
        infos = eval_vector_selector(eval_ctx, vs)
        if has_hist(infos):  # Prometheus refuses these too (info.test: "info metrics should be float type")
            raise ExecutionError("info(): the info series selected are native histograms; info metrics are floats")
    return _combine(base, infos, ignore, data, T)


def _sig(name: str, lb: Labels) -> tuple:
    return (name,) + tuple(get(lb, n) for n in _IDENTIFYING)


def _combine(base: VectorSteps, infos: VectorSteps, ignore: np.ndarray, data: dict[str, list[Matcher]], T: int) -> VectorSteps:
    info_names = sorted({get(lb, METRIC_NAME) for lb in infos.labels})
    ts = infos.sample_ts if infos.sample_ts is not None else np.zeros(infos.values.shape, dtype=np.int64)
    by_sig: dict[tuple, list[int]] = {}
    for j, lb in enumerate(infos.labels):
        by_sig.setdefault(_sig(get(lb, METRIC_NAME), lb), []).append(j)
    # Newest info series per signature and step; equal timestamps are Prometheus's duplicate error.
    chosen: dict[tuple, np.ndarray] = {}
    for sig, js in by_sig.items():
        cand = np.where(infos.present[js], ts[js], np.iinfo(np.int64).min)
        best = np.argmax(cand, axis=0)
        top = cand[best, np.arange(T)]
        if len(js) > 1:
            dup = (cand == top[None, :]).sum(axis=0) > 1
            dup &= top != np.iinfo(np.int64).min
            if dup.any():
                t = int(np.flatnonzero(dup)[0])
                a, b = [js[k] for k in np.flatnonzero(cand[:, t] == top[t])[:2]]
                raise ExecutionError(
                    f"found duplicate series for info metric: existing {format_labels(infos.labels[a])} @ {int(ts[a, t])}, "
                    f"new {format_labels(infos.labels[b])} @ {int(ts[b, t])}")
        chosen[sig] = np.where(top == np.iinfo(np.int64).min, -1, np.asarray(js)[best])
    all_empty_ok = all(m.matches("") for ms in data.values() for m in ms)

    out_l: list[Labels] = []
    out_v: list[np.ndarray] = []
    out_p: list[np.ndarray] = []
    out_dn: list[bool] = []
    dn = base.drop_name_mask()
    for i, lb in enumerate(base.labels):
        pres = base.present[i]
        if ignore[i] or not info_names:
            if ignore[i] or all_empty_ok:
                out_l.append(lb)
                out_v.append(base.values[i])
                out_p.append(pres.copy())
                out_dn.append(bool(dn[i]))
            continue
        picks = np.stack([chosen.get(_sig(name, lb), np.full(T, -1)) for name in info_names])  # (names, T)
        combos, inverse = np.unique(picks.T, axis=0, return_inverse=True)
        inverse = np.asarray(inverse).reshape(-1)
        base_names = {n for n, _ in lb}
        for c, combo in enumerate(combos):
            steps = pres & (inverse == c)
            if not steps.any():
                continue
            added: dict[str, str] = {}
            seen = 0
            for j in combo.tolist():
                if j < 0:
                    continue
                seen += 1
                for name, value in infos.labels[j]:
                    if name == METRIC_NAME:
                        continue
                    if data and name not in data:
                        continue
                    if added.get(name, value) != value:
                        raise ExecutionError(f"conflicting label: {name}")
                    if name in base_names:
                        continue
                    added[name] = value
            if seen == 0 and not all_empty_ok:
                continue
            out_l.append(make_labels({**dict(lb), **added}))
            out_v.append(base.values[i])
            out_p.append(steps)
            out_dn.append(bool(dn[i]))
    if not out_l:
        return VectorSteps.empty(T)
    return merge_same_labelsets(out_l, np.array(out_v).reshape(len(out_l), T), np.array(out_p, dtype=bool).reshape(len(out_l), T),
                                np.array(out_dn, dtype=bool))
