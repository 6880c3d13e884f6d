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
    METADATA_LABELS,
    SAME_LABELSET,
    dense_ids,
    drop_metric_name,
    labels_string,
    match_signature,
    match_signatures,
    merge_same_labels,
)
from promql.eval_histogram import TRIM_OPS, pair_cells, trim_floats_info, vector_scalar_hist
from promql.histogram_planes import empty_plane, union_presence, unsupported
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
    if op in TRIM_OPS:  # Prometheus's scalarBinop has no case for them
        raise ExecutionError(f'operator "{op}" not allowed for Scalar operations')
    if op in COMPARE:
        return Scalar(compare(op, a.values, b.values).astype(np.float64))
    return Scalar(arith(op, a.values, b.values))


def vector_scalar(op: str, vec: VectorSteps, sc: Scalar, swap: bool, return_bool: bool,
                  hctx: tuple[str, Any] | None = None) -> VectorSteps:
    """``vec op scalar`` (or ``scalar op vec`` when ``swap``). ``hctx`` = (position suffix,
    annotations) when ``vec`` carries native-histogram samples."""
    out = _vector_scalar(op, vec, sc, swap, return_bool)
    if op in TRIM_OPS and hctx is not None and vec.present.any():
        trim_floats_info(op, hctx[0], hctx[1])
    if hctx is not None and vec.hist is not None:
        out = vector_scalar_hist(op, vec, out, sc.values, swap, return_bool, hctx[0], hctx[1])
    return out


def _vector_scalar(op: str, vec: VectorSteps, sc: Scalar, swap: bool, return_bool: bool) -> VectorSteps:
    if op in TRIM_OPS:  # float samples give none (histogram cells are added by the caller)
        return VectorSteps(vec.labels, np.zeros(vec.values.shape), np.zeros(vec.present.shape, bool), vec.drop_name)
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
        self.fill_lhs: float | None = None  # experimental fill_left()/fill()
        self.fill_rhs: float | None = None  # experimental fill_right()/fill()
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
            if fv is not None:
                self.fill_lhs = None if fv.lhs is None else float(fv.lhs)
                self.fill_rhs = None if fv.rhs is None else float(fv.rhs)

    def signature(self, labels: Labels) -> Labels:
        return match_signature(labels, self.on, self.names)


def _sig_ids(m: Matching, lhs: VectorSteps, rhs: VectorSteps) -> tuple[np.ndarray, np.ndarray, int, list]:
    sigs = match_signatures(list(lhs.labels) + list(rhs.labels), m.on, m.names)
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


def _masked_plane(vec: VectorSteps, keep: np.ndarray) -> np.ndarray | None:
    if vec.hist is None:
        return None
    return np.where(keep, vec.hist, None)


def set_op(op: str, lhs: VectorSteps, rhs: VectorSteps, m: Matching) -> VectorSteps:
    """and / or / unless: histogram samples take part like floats (they are kept or dropped whole)."""
    t = lhs.num_steps
    ls, rs, nsig, _ = _sig_ids(m, lhs, rhs)
    if op in ("and", "unless"):
        rp = _presence_by_sig(rs, rhs.any_present(), nsig)
        keep = rp[ls] if op == "and" else ~rp[ls]
        return VectorSteps(lhs.labels, lhs.values, lhs.present & keep, lhs.drop_name, None, _masked_plane(lhs, keep))
    # or
    lp = _presence_by_sig(ls, lhs.any_present(), nsig)
    rkeep = ~lp[rs]
    rpres = rhs.present & rkeep
    labels = list(lhs.labels) + list(rhs.labels)
    values = np.concatenate([lhs.values, rhs.values], axis=0) if labels else np.empty((0, t))
    present = np.concatenate([lhs.present, rpres], axis=0) if labels else np.zeros((0, t), bool)
    drop = np.concatenate([lhs.drop_name_mask(), rhs.drop_name_mask()])
    plane = None
    if lhs.hist is not None or rhs.hist is not None:
        lpl = lhs.hist if lhs.hist is not None else empty_plane(lhs.values.shape)
        rpl = _masked_plane(rhs, rkeep) if rhs.hist is not None else empty_plane(rhs.values.shape)
        plane = np.concatenate([lpl, rpl], axis=0)
    return merge_same_labels(VectorSteps(labels, values, present, drop if drop.any() else None, None, plane))


def _result_labels(many: Labels, one: Labels, op: str, m: Matching) -> Labels:
    lb = dict(many)
    if op in ARITH:
        for n in METADATA_LABELS:
            lb.pop(n, None)
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


def _match_labels(labels: Labels, m: Matching) -> Labels:
    """Prometheus's Labels.MatchLabels: the labels a fill()-synthesized sample carries."""
    return match_signature(labels, m.on, m.names)


def vector_vector(op: str, lhs: VectorSteps, rhs: VectorSteps, m: Matching, hctx: tuple[str, Any] | None = None) -> VectorSteps:
    """Arithmetic / comparison between two vectors with one-to-one or many-to-one matching
    (and the experimental fill()/fill_left()/fill_right() modifiers). ``hctx`` = (position
    suffix, annotations) when a side carries native-histogram samples: those take part in the
    matching like floats and each pair involving one follows Prometheus's type table."""
    t = lhs.num_steps
    planes = None
    if hctx is not None and (lhs.hist is not None or rhs.hist is not None):
        planes = (lhs.hist, rhs.hist, hctx)
        lhs, rhs = union_presence(lhs), union_presence(rhs)
    if m.card == "ManyToMany":
        raise ExecutionError("many-to-many only allowed for set operators")
    no_fill = m.fill_lhs is None and m.fill_rhs is None
    if (lhs.num_series == 0 and rhs.num_series == 0) or ((lhs.num_series == 0 or rhs.num_series == 0) and no_fill):
        return VectorSteps.empty(t)
    swap = m.card == "OneToMany"
    many, one = (rhs, lhs) if swap else (lhs, rhs)
    ms_, os_, nsig, sig_list = _sig_ids(m, many, one)
    cols_all = np.arange(t)[None, :]

    # The "one" side must be unique per signature at every step.
    if len(np.unique(os_)) != len(os_):
        cnt = _count_by_sig(os_, one.present, nsig)
        if (cnt > 1).any():
            _raise_duplicate_one_side(cnt, os_, one, m, swap)
    one_row = np.full((nsig, t), -1, dtype=np.int64)
    rows, cols = np.nonzero(one.present)
    one_row[os_[rows], cols] = rows

    match = one_row[ms_] if many.num_series else np.zeros((0, t), np.int64)  # (S_many, T)
    matched = many.present & (match >= 0)
    if m.fill_rhs is not None:
        called = many.present  # unmatched rows are paired with a synthesized right-hand sample
    else:
        called = matched
    if m.card == "OneToOne" and many.num_series and len(np.unique(ms_)) != len(ms_):
        mc = _count_by_sig(ms_, called, nsig)
        if (mc > 1).any():
            raise ExecutionError("multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)")

    nm, no = many.num_series, one.num_series
    side_planes = None
    if planes is not None:
        side_planes = (planes[1], planes[0]) if swap else (planes[0], planes[1])
    if not m.include and no_fill:
        return _dense_binop(op, many, one, match, matched, swap, m, side_planes, planes[2] if planes else None)
    if side_planes is not None:
        hm_many = np.not_equal(side_planes[0], None) if side_planes[0] is not None else np.zeros(called.shape, bool)
        hm_one = np.not_equal(side_planes[1], None) if side_planes[1] is not None else np.zeros(one.present.shape, bool)
        cr, ccol = np.nonzero(called)
        ro = match[cr, ccol]
        if (hm_many[cr, ccol] | ((ro >= 0) & hm_one[np.maximum(ro, 0), ccol] if no else False)).any():
            raise unsupported("a binary operator with group_left/group_right labels or fill()")
    # cells: (kind/code, step, left value, right value) -- A matched pairs, B many row + fill,
    # C one row + fill (for one rows no many row matched at that step)
    rr, cc = np.nonzero(called)
    r_of = match[rr, cc]
    vl = many.values[rr, cc]
    vr = np.where(r_of >= 0, one.values[np.maximum(r_of, 0), cc] if no else 0.0, m.fill_rhs if m.fill_rhs is not None else 0.0)
    code = rr.astype(np.int64) * (no + 1) + np.where(r_of >= 0, r_of, no)
    if m.fill_lhs is not None and no:
        many_sig_present = _presence_by_sig(ms_, many.present, nsig)
        c_mask = one.present & ~many_sig_present[os_]
        r2, c2 = np.nonzero(c_mask)
        code = np.concatenate([code, nm * (no + 1) + r2.astype(np.int64)])
        cc = np.concatenate([cc, c2])
        vl = np.concatenate([vl, np.full(len(r2), m.fill_lhs)])
        vr = np.concatenate([vr, one.values[r2, c2]])
    fl, fr = (vr, vl) if swap else (vl, vr)
    if op in COMPARE:
        keep = compare(op, fl, fr)
        values = keep.astype(np.float64) if m.return_bool else fl
    elif op in TRIM_OPS:  # histogram cells were refused above: float pairs give no sample
        keep = np.zeros(len(fl), dtype=bool)
        values = np.zeros(len(fl))
        if len(fl) and hctx is not None:
            trim_floats_info(op, hctx[0], hctx[1])
    else:
        keep = np.ones(len(fl), dtype=bool)
        values = arith(op, fl, fr)

    # Output label sets (per-pair Python, never per sample).
    if not m.include and no_fill:
        labels_per_row = [_result_labels(l, (), op, m) for l in many.labels]
        row_out, out_labels = dense_ids(labels_per_row)
        cell_out = row_out[code // (no + 1)] if len(code) else np.zeros(0, np.int64)
    else:
        uniq, inv = np.unique(code, return_inverse=True)
        lab = []
        for c in uniq.tolist():
            if c >= nm * (no + 1):
                r = c - nm * (no + 1)
                lab.append(_result_labels(_match_labels(one.labels[r], m), one.labels[r], op, m))
                continue
            l, r = divmod(c, no + 1)
            other = one.labels[r] if r < no else _match_labels(many.labels[l], m)
            lab.append(_result_labels(many.labels[l], other, op, m))
        pair_out, out_labels = dense_ids(lab)
        cell_out = pair_out[inv] if len(code) else np.zeros(0, np.int64)
    n_out = len(out_labels)
    if n_out and len(cell_out):
        oc = np.zeros((n_out, t), dtype=np.int64)
        if m.card != "OneToOne":
            np.add.at(oc, (cell_out, cc), 1)
            if (oc > 1).any():
                raise ExecutionError("multiple matches for labels: grouping labels must ensure unique matches")
            oc[:] = 0
        kept = keep | m.return_bool
        np.add.at(oc, (cell_out[kept], cc[kept]), 1)
        if (oc > 1).any():
            raise ExecutionError(SAME_LABELSET)
    kept = keep | m.return_bool
    out_values = np.zeros((n_out, t))
    out_pres = np.zeros((n_out, t), dtype=bool)
    out_values[cell_out[kept], cc[kept]] = values[kept]
    out_pres[cell_out[kept], cc[kept]] = True
    drop = np.ones(n_out, bool) if m.return_bool else None
    del cols_all, sig_list
    return VectorSteps(list(out_labels), out_values, out_pres, drop)  # type: ignore[arg-type]


def _dense_binop(op: str, many: VectorSteps, one: VectorSteps, match: np.ndarray, matched: np.ndarray, swap: bool, m: Matching,
                 side_planes: tuple[np.ndarray | None, np.ndarray | None] | None = None,
                 hctx: tuple[str, Any] | None = None) -> VectorSteps:
    """Common case (no group_x labels, no fill): output rows are the "many" rows, computed on
    whole (S, T) matrices. ``side_planes``: the (many, one) histogram planes, if any."""
    t = many.num_steps
    safe = np.where(matched, match, 0)
    ov = one.values[safe, np.arange(t)[None, :]]
    fl, fr = (ov, many.values) if swap else (many.values, ov)
    if op in COMPARE:
        keep = compare(op, fl, fr)
        values = keep.astype(np.float64) if m.return_bool else fl
        present = matched if m.return_bool else matched & keep
    elif op in TRIM_OPS:
        values = np.zeros(matched.shape)
        present = matched
    else:
        values = arith(op, fl, fr)
        present = matched
    plane = None
    if side_planes is not None and hctx is not None:
        values, present, plane = _hist_pairs(op, many, one, safe, matched, swap, m.return_bool, side_planes, values, present, hctx)
    if op in TRIM_OPS:  # what is left are float pairs: no sample
        if present.any() and hctx is not None:
            trim_floats_info(op, hctx[0], hctx[1])
        present = np.zeros(matched.shape, bool)
    labels = [_result_labels(l, (), op, m) for l in many.labels]
    drop = np.ones(len(labels), bool) if m.return_bool else None
    out = VectorSteps(labels, values, present, drop, None, plane)
    if len(set(labels)) != len(labels):
        if m.card != "OneToOne":
            ids, uniq = dense_ids(labels)
            oc = np.zeros((len(uniq), t), dtype=np.int64)
            np.add.at(oc, ids, matched.astype(np.int64))
            if (oc > 1).any():
                raise ExecutionError("multiple matches for labels: grouping labels must ensure unique matches")
        out = merge_same_labels(out)
    return out


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


def _hist_pairs(op: str, many: VectorSteps, one: VectorSteps, safe: np.ndarray, matched: np.ndarray, swap: bool,
                return_bool: bool, side_planes: tuple[np.ndarray | None, np.ndarray | None], values: np.ndarray,
                present: np.ndarray, hctx: tuple[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Replace the matched pairs involving a histogram (their float results are placeholders)."""
    mp, op_ = side_planes
    cols = np.arange(many.num_steps)[None, :]
    hm_many = np.not_equal(mp, None) if mp is not None else np.zeros(matched.shape, bool)
    hm_one = np.not_equal(op_, None)[safe, cols] if op_ is not None else np.zeros(matched.shape, bool)
    hp = matched & (hm_many | hm_one)
    if not hp.any():
        return values, present, None
    values = values.copy()
    present = present & ~hp
    r, c = np.nonzero(hp)
    mine = np.where(hm_many[r, c], mp[r, c] if mp is not None else None, many.values[r, c]).astype(object)
    o_r = safe[r, c]
    theirs = np.where(hm_one[r, c], op_[o_r, c] if op_ is not None else None, one.values[o_r, c]).astype(object)
    left, right = (theirs, mine) if swap else (mine, theirs)
    keep, fval, hval = pair_cells(op, left, right, return_bool, hctx[0], hctx[1])
    plane = empty_plane(values.shape)
    if return_bool:
        values[r[keep], c[keep]] = fval[keep]
        present[r[keep], c[keep]] = True
    else:
        plane[r[keep], c[keep]] = hval[keep]
    return values, present, plane


def unary_minus(vec: VectorSteps) -> VectorSteps:
    plane = None
    if vec.hist is not None:
        plane = vec.hist.copy()
        hm = np.not_equal(plane, None)
        plane[hm] = [h.scale(-1.0) for h in plane[hm]]
    return VectorSteps(vec.labels, -vec.values, vec.present, np.ones(vec.num_series, bool), None, plane)


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
