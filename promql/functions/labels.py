"""label_replace and label_join: per-series label rewriting (Python per series, not per sample),
followed by Prometheus's merge of series that end up with the same label set."""
from __future__ import annotations

import numpy as np

from promql.errors import ExecutionError
from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import string_arg, vector_arg
from promql.parser.literals import valid_label_name
from promql.types import Value, VectorSteps
from storage.labels import METRIC_NAME, Labels, get, set_label
from storage.regex import RegexError, compile_regex, expand_template


def merge_same_labelsets(labels: list[Labels], values: np.ndarray, present: np.ndarray,
                         drop_name: np.ndarray, sample_ts: np.ndarray | None = None) -> VectorSteps:
    """Merge series with identical label sets; an overlap at any step is Prometheus's error."""
    groups: dict[Labels, list[int]] = {}
    for i, lb in enumerate(labels):
        groups.setdefault(lb, []).append(i)
    if len(groups) == len(labels):
        return VectorSteps(labels, values, present, drop_name, sample_ts)
    out_l: list[Labels] = []
    rows: list[np.ndarray] = []
    pres: list[np.ndarray] = []
    dns: list[bool] = []
    tss: list[np.ndarray] = []
    for lb, idx in groups.items():
        p = present[idx]
        if (p.sum(axis=0) > 1).any():
            raise ExecutionError("vector cannot contain metrics with the same labelset")
        pick = np.argmax(p, axis=0)  # which member is present at each step
        cols = np.arange(values.shape[1])
        out_l.append(lb)
        rows.append(values[np.asarray(idx)[pick], cols])
        pres.append(p.any(axis=0))
        dns.append(bool(drop_name[idx[0]]))
        if sample_ts is not None:
            tss.append(sample_ts[np.asarray(idx)[pick], cols])
    T = values.shape[1]
    return VectorSteps(
        out_l,
        np.array(rows).reshape(len(out_l), T),
        np.array(pres, dtype=bool).reshape(len(out_l), T),
        np.array(dns, dtype=bool),
        np.array(tss).reshape(len(out_l), T) if sample_ts is not None else None,
    )


@register("label_replace", histograms=Histograms.LABELS, keeps_name=True)
def label_replace(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    dst, repl, src, regex_s = (string_arg(a) for a in args[1:5])
    try:
        regex = compile_regex(regex_s)
    except RegexError as e:  # Prometheus's text (a runtime error, 422), then what Go's regexp says
        raise ExecutionError(f"invalid regular expression in label_replace(): {regex_s}: {e}") from None
    if not valid_label_name(dst):
        raise ExecutionError(f"invalid destination label name in label_replace(): {dst}")
    labels = list(vec.labels)
    dn = vec.drop_name_mask().copy()
    expanded: dict[str, str | None] = {}  # per distinct source value: the replacement, None if no match
    for i, lb in enumerate(labels):
        value = get(lb, src)
        if value not in expanded:
            m = regex.match(value)
            expanded[value] = None if m is None else expand_template(repl, m)
        res = expanded[value]
        if res is None:
            continue
        labels[i] = set_label(lb, dst, res)
        if dst == METRIC_NAME:
            dn[i] = False
    return merge_same_labelsets(labels, vec.values, vec.present, dn, vec.sample_ts)


@register("label_join", histograms=Histograms.LABELS, keeps_name=True)
def label_join(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    dst = string_arg(args[1])
    sep = string_arg(args[2])
    srcs = [string_arg(a) for a in args[3:]]
    for s in srcs:
        if not valid_label_name(s):
            raise ExecutionError(f"invalid source label name in label_join(): {s}")
    if not valid_label_name(dst):
        raise ExecutionError(f"invalid destination label name in label_join(): {dst}")
    labels = list(vec.labels)
    dn = vec.drop_name_mask().copy()
    for i, lb in enumerate(labels):
        labels[i] = set_label(lb, dst, sep.join(get(lb, s) for s in srcs))
        if dst == METRIC_NAME:
            dn[i] = False
    return merge_same_labelsets(labels, vec.values, vec.present, dn, vec.sample_ts)
