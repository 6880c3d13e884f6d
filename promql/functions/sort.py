"""sort, sort_desc, sort_by_label, sort_by_label_desc.

Ordering only matters for instant queries (one step): the series are reordered. For range queries
Prometheus warns that sorting is ineffective (results are always ordered by labels): the evaluator
does, for every function registered with ``sorts=True``."""
from __future__ import annotations

import functools
import re

import numpy as np

from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import string_arg, vector_arg
from promql.types import Value, VectorSteps
from storage.labels import Labels, get

_CHUNK = re.compile(r"(\d+|\D+)", re.ASCII)


def _take(vec: VectorSteps, order: list[int] | np.ndarray) -> VectorSteps:
    idx = np.asarray(order, dtype=np.int64)
    return VectorSteps(
        [vec.labels[i] for i in idx],
        vec.values[idx],
        vec.present[idx],
        None if vec.drop_name is None else vec.drop_name[idx],
        None if vec.sample_ts is None else vec.sample_ts[idx],
    )


def _by_value(vec: VectorSteps, descending: bool) -> VectorSteps:
    if vec.num_steps != 1 or vec.num_series < 2:
        return vec
    v = vec.values[:, 0]
    nan = np.isnan(v)
    key = -v if descending else v
    # NaN sorts to the end in both directions; ties keep input order.
    order = np.lexsort((np.arange(len(v)), np.where(nan, 0.0, key), nan))
    return _take(vec, order)


@register("sort", sorts=True, keeps_name=True)
def sort(ctx: FunctionContext, args: list[Value]) -> Value:
    return _by_value(vector_arg(args[0]), False)


@register("sort_desc", sorts=True, keeps_name=True)
def sort_desc(ctx: FunctionContext, args: list[Value]) -> Value:
    return _by_value(vector_arg(args[0]), True)


def _atoi_ok(chunk: str) -> bool:
    """Whether Go's strconv.Atoi accepts a chunk: ASCII digits within int64 (longer digit runs
    fail there with a range error, and such chunks compare as strings)."""
    return chunk.isascii() and chunk.isdigit() and int(chunk) <= 2**63 - 1


def natsort_less(a: str, b: str) -> bool:
    """Natural-order "a < b" as the facette/natsort package Prometheus uses compares strings:
    digit runs compare as integers, other runs as strings."""
    ca = _CHUNK.findall(a)
    cb = _CHUNK.findall(b)
    for i, xa in enumerate(ca):
        if i >= len(cb):
            return False
        xb = cb[i]
        if _atoi_ok(xa) and _atoi_ok(xb):
            ia, ib = int(xa), int(xb)
            if ia == ib:
                if i == len(ca) - 1:
                    return True
                if i == len(cb) - 1:
                    return False
                continue
            return ia < ib
        if xa == xb:
            if i == len(ca) - 1:
                return True
            if i == len(cb) - 1:
                return False
            continue
        return xa < xb
    return False


def _label_cmp(names: list[str], desc: bool):
    def cmp(a: Labels, b: Labels) -> int:
        for name in names:
            va, vb = get(a, name), get(b, name)
            if va == vb:
                continue
            less = natsort_less(va, vb)
            r = -1 if less else 1
            return -r if desc else r
        r = (a > b) - (a < b)
        return -r if desc else r

    return cmp


def _by_label(ctx: FunctionContext, args: list[Value], desc: bool) -> VectorSteps:
    vec = vector_arg(args[0])
    names = [string_arg(a) for a in args[1:]]
    cmp = _label_cmp(names, desc)
    order = sorted(range(vec.num_series), key=functools.cmp_to_key(lambda i, j: cmp(vec.labels[i], vec.labels[j])))
    return _take(vec, order)


@register("sort_by_label", sorts=True, histograms=Histograms.LABELS, keeps_name=True, experimental=True)
def sort_by_label(ctx: FunctionContext, args: list[Value]) -> Value:
    return _by_label(ctx, args, False)


@register("sort_by_label_desc", sorts=True, histograms=Histograms.LABELS, keeps_name=True, experimental=True)
def sort_by_label_desc(ctx: FunctionContext, args: list[Value]) -> Value:
    return _by_label(ctx, args, True)
