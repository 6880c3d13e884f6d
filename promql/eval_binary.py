"""Binary operators over whole (S, T) matrices.

Vector matching is done once per query: every series gets a match signature (per-series
Python), the signatures become dense ids, and the per-step matching is array indexing over
(signature, step) tables. Semantics follow Prometheus 3 with delayed ``__name__`` removal:
arithmetic drops the name at once (vector/vector) or marks it for dropping (vector/scalar),
comparisons keep the left-hand name, ``bool`` marks it for dropping.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from promql.errors import BadData, ExecutionError
from promql.eval_labels import (
    SAME_LABELSET,
    dense_ids,
    drop_metric_name,
    labels_string,
    match_signature,
    merge_same_labels,
)
from promql.types import Scalar, VectorSteps
from storage.labels import Labels

ARITH = {"+", "-", "*", "/", "%", "^", "atan2"}
COMPARE = {"==", "!=", ">", "<", ">=", "<="}
SET_OPS = {"and", "or", "unless"}


def arith(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    if op == "%":
        return np.fmod(a, b)  # Go's math.Mod: result has the sign of the dividend
    if op == "^":
        return np.power(a, b)
    if op == "atan2":
        return np.arctan2(a, b)
    raise BadData(f"operator {op!r} not allowed for arithmetic")


def compare(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == ">":
        return a > b
    if op == "<":
        return a < b
    if op == ">=":
        return a >= b
    if op == "<=":
        return a <= b
    raise BadData(f"operator {op!r} is not a comparison")


def scalar_scalar(op: str, a: Scalar, b: Scalar) -> Scalar:
    if op in COMPARE:
        return Scalar(compare(op, a.values, b.values).astype(np.float64))
    return Scalar(arith(op, a.values, b.values))


def vector_scalar(op: str, vec: VectorSteps, sc: Scalar, swap: bool, return_bool: bool) -> VectorSteps:
    """``vec op scalar`` (or ``scalar op vec`` when ``swap``)."""
    s = sc.values[None, :]
    if op in COMPARE:
        lhs, rhs = (s, vec.values) if swap else (vec.values, s)
        keep = compare(op, lhs, rhs)
        if return_bool:
            values = keep.astype(np.float64)
            present = vec.present.copy()
        else:
            values = vec.values  # the vector's own value, whichever side it is on
            present = vec.present & keep
        drop = np.ones(vec.num_series, bool) if return_bool else vec.drop_name
        return VectorSteps(vec.labels, values, present, drop)
    lhs, rhs = (s, vec.values) if swap else (vec.values, s)
    values = arith(op, lhs, rhs)
    return VectorSteps(vec.labels, values, vec.present.copy(), np.ones(vec.num_series, bool))


class Matching:
    """Normalized ``on``/``ignoring``/``group_*`` modifier."""

    def __init__(self, modifier: Any, op: str) -> None:
        self.card = "OneToOne"
        self.on = False
        self.names: list[str] = []
        self.include: list[str] = []
        self.return_bool = False
        if op in SET_OPS:
            self.card = "ManyToMany"
        if modifier is not None:
            self.card = str(modifier.card).rsplit(".", 1)[-1]
            self.return_bool = bool(modifier.return_bool)
            m = modifier.matching
            if m is not None:
                self.on = str(m.type).rsplit(".", 1)[-1] == "Include"
                self.names = list(m.labels)
            self.include = list(modifier.group_labels or [])
            fv = getattr(modifier, "fill_values", None)
            if fv is not None and (getattr(fv, "lhs", None) is not None or getattr(fv, "rhs", None) is not None):
                raise BadData("fill() modifiers on binary operators are not supported")

    def signature(self, labels: Labels) -> Labels:
        return match_signature(labels, self.on, self.names)


def _sig_ids(m: Matching, lhs: VectorSteps, rhs: VectorSteps) -> tuple[np.ndarray, np.ndarray, int, list]:
    sigs = [m.signature(l) for l in lhs.labels] + [m.signature(l) for l in rhs.labels]
    ids, uniq = dense_ids(sigs)
    return ids[: lhs.num_series], ids[lhs.num_series:], len(uniq), uniq


def _presence_by_sig(sig: np.ndarray, present: np.ndarray, nsig: int) -> np.ndarray:
    """bool (nsig, T): does any row with that signature exist at that step."""
    out = np.zeros((nsig, present.shape[1]), dtype=bool)
    if len(sig):
        order = np.argsort(sig, kind="stable")
        ss = sig[order]
        starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
        red = np.logical_or.reduceat(present[order], starts, axis=0)
        out[ss[starts]] = red
    return out


def _count_by_sig(sig: np.ndarray, present: np.ndarray, nsig: int) -> np.ndarray:
    out = np.zeros((nsig, present.shape[1]), dtype=np.int64)
    if len(sig):
        order = np.argsort(sig, kind="stable")
        ss = sig[order]
        starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
        red = np.add.reduceat(present[order].astype(np.int64), starts, axis=0)
        out[ss[starts]] = red
    return out


def set_op(op: str, lhs: VectorSteps, rhs: VectorSteps, m: Matching) -> VectorSteps:
    t = lhs.num_steps
    ls, rs, nsig, _ = _sig_ids(m, lhs, rhs)
    if op == "and":
        rp = _presence_by_sig(rs, rhs.present, nsig)
        present = lhs.present & rp[ls]
        return VectorSteps(lhs.labels, lhs.values, present, lhs.drop_name)
    if op == "unless":
        rp = _presence_by_sig(rs, rhs.present, nsig)
        present = lhs.present & ~rp[ls]
        return VectorSteps(lhs.labels, lhs.values, present, lhs.drop_name)
    # or
    lp = _presence_by_sig(ls, lhs.present, nsig)
    rpres = rhs.present & ~lp[rs]
    labels = list(lhs.labels) + list(rhs.labels)
    values = np.concatenate([lhs.values, rhs.values], axis=0) if labels else np.empty((0, t))
    present = np.concatenate([lhs.present, rpres], axis=0) if labels else np.zeros((0, t), bool)
    drop = np.concatenate([lhs.drop_name_mask(), rhs.drop_name_mask()])
    return merge_same_labels(VectorSteps(labels, values, present, drop if drop.any() else None))


def _result_labels(many: Labels, one: Labels, op: str, m: Matching) -> Labels:
    lb = dict(many)
    if op in ARITH:
        lb.pop("__name__", None)
    if m.card == "OneToOne":
        if m.on:
            keep = set(m.names)
            lb = {k: v for k, v in lb.items() if k in keep}
        else:
            for n in m.names:
                lb.pop(n, None)
    if m.include:
        od = dict(one)
        for n in m.include:
            v = od.get(n, "")
            if v != "":
                lb[n] = v
            else:
                lb.pop(n, None)
    return tuple(sorted(lb.items()))


def vector_vector(op: str, lhs: VectorSteps, rhs: VectorSteps, m: Matching) -> VectorSteps:
    """Arithmetic / comparison between two vectors with one-to-one or many-to-one matching."""
    t = lhs.num_steps
    if m.card == "ManyToMany":
        raise ExecutionError("many-to-many only allowed for set operators")
    if lhs.num_series == 0 or rhs.num_series == 0:
        return VectorSteps.empty(t)
    swap = m.card == "OneToMany"
    many, one = (rhs, lhs) if swap else (lhs, rhs)
    ms_, os_, nsig, sig_list = _sig_ids(m, many, one)

    # The "one" side must be unique per signature at every step.
    cnt = _count_by_sig(os_, one.present, nsig)
    if (cnt > 1).any():
        _raise_duplicate_one_side(cnt, os_, one, m, swap)
    one_row = np.full((nsig, t), -1, dtype=np.int64)
    rows, cols = np.nonzero(one.present)
    one_row[os_[rows], cols] = rows

    match = one_row[ms_]  # (S_many, T)
    matched = many.present & (match >= 0)
    if m.card == "OneToOne":
        mc = _count_by_sig(ms_, matched, nsig)
        if (mc > 1).any():
            raise ExecutionError("multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)")

    safe = np.where(matched, match, 0)
    ov = one.values[safe, np.arange(t)[None, :]]
    fl, fr = (ov, many.values) if swap else (many.values, ov)
    if op in COMPARE:
        keep = compare(op, fl, fr)
        values = keep.astype(np.float64) if m.return_bool else fl
    else:
        keep = np.ones_like(matched)
        values = arith(op, fl, fr)
    out_present = matched & (keep | m.return_bool)

    # Output label sets: per "many" row unless group_x copies labels from the matched "one" row.
    if not m.include:
        labels_per_row = [_result_labels(l, (), op, m) for l in many.labels]
        out_ids, out_labels = dense_ids(labels_per_row)
        cell_out = np.broadcast_to(out_ids[:, None], matched.shape)
    else:
        mr, mc_ = np.nonzero(matched)
        code = mr.astype(np.int64) * (one.num_series + 1) + match[mr, mc_]
        uniq, inv = np.unique(code, return_inverse=True)
        lab = [
            _result_labels(many.labels[int(c) // (one.num_series + 1)], one.labels[int(c) % (one.num_series + 1)], op, m)
            for c in uniq
        ]
        pair_out, out_labels = dense_ids(lab)
        cell_out = np.full(matched.shape, -1, dtype=np.int64)
        cell_out[mr, mc_] = pair_out[inv]
    n_out = len(out_labels)
    # Result label sets must be unique per step (checked on all matched pairs, like Prometheus).
    if m.card != "OneToOne":
        rr, cc = np.nonzero(matched)
        oc = np.zeros((n_out, t), dtype=np.int64)
        np.add.at(oc, (cell_out[rr, cc], cc), 1)
        if (oc > 1).any():
            raise ExecutionError("multiple matches for labels: grouping labels must ensure unique matches")
    rr, cc = np.nonzero(out_present)
    oid = cell_out[rr, cc]
    if n_out and len(oid):
        oc = np.zeros((n_out, t), dtype=np.int64)
        np.add.at(oc, (oid, cc), 1)
        if (oc > 1).any():
            raise ExecutionError(SAME_LABELSET)
    out_values = np.zeros((n_out, t))
    out_pres = np.zeros((n_out, t), dtype=bool)
    out_values[oid, cc] = values[rr, cc]
    out_pres[oid, cc] = True
    drop = np.ones(n_out, bool) if m.return_bool else None
    return VectorSteps(list(out_labels), out_values, out_pres, drop)  # type: ignore[arg-type]


def _raise_duplicate_one_side(cnt: np.ndarray, os_: np.ndarray, one: VectorSteps, m: Matching, swap: bool) -> None:
    # first step with a duplicate, then the first two rows (in input order) sharing a signature
    step = int(np.flatnonzero((cnt > 1).any(axis=0))[0])
    seen: dict[int, int] = {}
    for r in np.flatnonzero(one.present[:, step]).tolist():
        sg = int(os_[r])
        if sg in seen:
            a, b = labels_string(one.labels[r]), labels_string(one.labels[seen[sg]])
            if a > b:
                a, b = b, a
            if m.on:
                keep = set(m.names)
                ml = tuple(p for p in one.labels[r] if p[0] in keep)
            else:
                drop = set(m.names) | {"__name__"}
                ml = tuple(p for p in one.labels[r] if p[0] not in drop)
            side = "left" if swap else "right"
            raise ExecutionError(
                f"found duplicate series for the match group {labels_string(ml)} on the {side} hand-side of the operation: "
                f"[{a}, {b}];many-to-many matching not allowed: matching labels must be unique on one side"
            )
        seen[sg] = r
    raise ExecutionError("many-to-many matching not allowed: matching labels must be unique on one side")


def unary_minus(vec: VectorSteps) -> VectorSteps:
    return VectorSteps(vec.labels, -vec.values, vec.present, np.ones(vec.num_series, bool))


__all__ = [
    "ARITH",
    "COMPARE",
    "SET_OPS",
    "Matching",
    "scalar_scalar",
    "set_op",
    "unary_minus",
    "vector_scalar",
    "vector_vector",
    "drop_metric_name",
]
